"""Benchmark of one CG iteration step: fused product vs per-path calls vs e3nn's uuu TensorProduct.

    python benchmarks/iteration.py                          # CPU: 10^4 samples x 32 channels, lmax 3
    python benchmarks/iteration.py --samples 100000         # the full size (default on CUDA)
    python benchmarks/iteration.py --device cuda --json r.json --plot r   # r.json, r.png, r.svg

One step couples X (lmax 3: one block each of l = 0..3, ``--channels`` channels, element-wise "uuu") with
itself into every path ``(l1, l2) -> L <= --lmax-out`` (``--parity all`` or ``even``), in the e3nn basis so
that the three methods compute the same numbers:

* ``fused``: :class:`sparse_accumulation.products.ClebschGordanProduct`, all paths in one accumulate call
  (rows = samples x channels, ``[..., channels, 16]`` layout);
* ``per-path``: one ``sparse_accumulation.accumulate`` call per path on strided views of the blocks, outputs
  concatenated (the same output layout);
* ``e3nn``: ``o3.TensorProduct`` with one uuu instruction per path (no weights), e3nn's ``mul x l`` layout.

Each method is timed forward and forward+backward (gradients of ``sum(out * G)`` for both inputs), median
over ``--repeats`` runs after warm-up, with the same implementation choice as the library default
(``implementation=None`` -> ``auto``: numba on CPU, triton on CUDA). Outputs are checked against each other
before timing. Ratios are per-path / fused and e3nn / fused (> 1: the fused call is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation as sa  # noqa: E402
import sparse_accumulation.bench  # noqa: E402,F401 - sa.bench.plot_times
from sparse_accumulation.bench.timing import compiled_kernels_only  # noqa: E402
from sparse_accumulation.products import ClebschGordanProduct, from_e3nn_layout, to_e3nn_layout  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class PerPath(torch.nn.Module):
    """The same product as ``product``, one accumulate call per path (rules kept as buffers, prepared once)."""

    def __init__(self, product):
        super().__init__()
        self.paths = product.paths
        self.dim_out = product.dim_out
        for p in product.paths:
            m1, m2, mu, C = sa.get_cg_transformation_rule(p.l1, p.l2, p.L, dtype=product.C.dtype, basis=product.basis)
            for name, t in (("m1", m1), ("m2", m2), ("mu", mu), ("C", C)):
                self.register_buffer(f"{name}_{p.index}", t)

    def forward(self, X1, X2):
        outs = []
        for p in self.paths:
            i = p.index
            outs.append(sa.accumulate(X1[..., p.offset1:p.offset1 + 2 * p.l1 + 1],
                                      X2[..., p.offset2:p.offset2 + 2 * p.l2 + 1],
                                      getattr(self, f"mu_{i}"), 2 * p.L + 1, getattr(self, f"m1_{i}"),
                                      getattr(self, f"m2_{i}"), getattr(self, f"C_{i}")))
        return torch.cat(outs, dim=-1)


def e3nn_product(product, channels, dtype, device):
    from e3nn import o3

    def irreps(ls):
        return o3.Irreps([(channels, (l, (-1) ** l)) for l in ls])

    blocks = [l for n, l in product.irreps1 for _ in range(n)]
    irreps_out = o3.Irreps([(channels, (p.L, (-1) ** (p.l1 + p.l2))) for p in product.paths])
    instructions = [(p.block1, p.block2, p.index, "uuu", False) for p in product.paths]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        tp = o3.TensorProduct(irreps(blocks), irreps(blocks), irreps_out, instructions, irrep_normalization="component",
                              path_normalization="none")
    finally:
        torch.set_default_dtype(previous)
    return tp.to(device=device, dtype=dtype)


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--samples", type=int, default=None, help="default: 10^5 on CUDA, 10^4 on CPU")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--lmax", type=int, default=3)
    parser.add_argument("--lmax-out", type=int, default=3)
    parser.add_argument("--parity", choices=["all", "even"], default="all")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-e3nn", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", metavar="STEM", help="write the chart STEM.png and STEM.svg (needs matplotlib)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    samples = args.samples or (100_000 if device.type == "cuda" else 10_000)

    product = ClebschGordanProduct(args.lmax, args.lmax, args.lmax_out, parity=args.parity, basis="e3nn",
                                   dtype=dtype).to(device)
    per_path = PerPath(product).to(device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    X1 = torch.randn(samples, args.channels, product.dim1, generator=generator, dtype=dtype).to(device)
    X2 = torch.randn(samples, args.channels, product.dim2, generator=generator, dtype=dtype).to(device)
    G = torch.randn(samples, args.channels, product.dim_out, generator=generator, dtype=dtype).to(device)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else os.cpu_count()} "
          f"{'' if device.type == 'cuda' else 'CPU cores, torch threads ' + str(torch.get_num_threads())}), "
          f"{args.dtype}, samples {samples} x channels {args.channels} = {samples * args.channels} rows, "
          f"lmax {args.lmax} -> lmax_out {args.lmax_out}, parity {args.parity}: {product.n_paths} paths, "
          f"{product.C.shape[0]} nonzeros, dims {product.dim1} x {product.dim2} -> {product.dim_out}; "
          f"implementation {sa.backends.resolve(None, device)}", flush=True)

    methods = {"fused": lambda a, b: product(a, b), "per-path": lambda a, b: per_path(a, b)}
    layouts = {"fused": (lambda x: x, lambda y: y), "per-path": (lambda x: x, lambda y: y)}
    if not args.no_e3nn:
        try:
            tp = e3nn_product(product, args.channels, dtype, device)
            methods["e3nn"] = lambda a, b: tp(a, b)
            layouts["e3nn"] = (lambda x: to_e3nn_layout(x, product.irreps1).contiguous(),
                               lambda y: from_e3nn_layout(y, product.irreps_out, args.channels))
        except ImportError:
            print("e3nn not importable: skipped", flush=True)

    reference = None
    results = {}
    tolerance = 1e-4 if dtype == torch.float32 else 1e-10
    for name, fn in methods.items():
        to_layout, from_layout = layouts[name]
        a, b = to_layout(X1), to_layout(X2)
        g = to_layout(G) if name != "e3nn" else to_e3nn_layout(G, product.irreps_out).contiguous()
        with torch.no_grad():
            out = from_layout(fn(a, b))
        if reference is None:
            reference = out
        error = ((out - reference).abs().max() / reference.abs().max()).item()
        assert error < tolerance, f"{name} differs from fused by {error:.3g}"
        del out
        with torch.no_grad():
            forward = timed(lambda: fn(a, b), device, args.repeats)
        a.requires_grad_(True)
        b.requires_grad_(True)

        def step():
            out = fn(a, b)
            torch.autograd.grad(out, (a, b), g)

        both = timed(step, device, args.repeats)
        a.requires_grad_(False)
        b.requires_grad_(False)
        results[name] = {"forward_ms": forward * 1e3, "forward_backward_ms": both * 1e3, "max_rel_error": error}
        print(f"{name:>9}: forward {forward * 1e3:9.2f} ms   forward+backward {both * 1e3:9.2f} ms   "
              f"(max rel. diff to fused {error:.1e})", flush=True)
    base = results["fused"]
    for name, r in results.items():
        if name != "fused":
            r["ratio_forward"] = r["forward_ms"] / base["forward_ms"]
            r["ratio_forward_backward"] = r["forward_backward_ms"] / base["forward_backward_ms"]
            print(f"{name:>9} / fused: forward x{r['ratio_forward']:.2f}   "
                  f"forward+backward x{r['ratio_forward_backward']:.2f}", flush=True)
    meta = {"device": str(device), "dtype": args.dtype, "samples": samples, "channels": args.channels,
            "lmax": args.lmax, "lmax_out": args.lmax_out, "parity": args.parity, "paths": product.n_paths,
            "nnz": int(product.C.shape[0]), "repeats": args.repeats}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
    if args.plot:
        from plots import iteration_records

        paths = sa.bench.plot_times(iteration_records({"meta": meta, "results": results}), args.plot,
                                    title=f"benchmarks/iteration.py on {device}: one CG iteration step, {args.dtype}")
        print("\n".join(f"wrote {path}" for path in paths))
    return results


if __name__ == "__main__":
    main()
