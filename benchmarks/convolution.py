"""Benchmark of a NequIP interaction (convolution) layer written four ways, with its peak memory.

    python benchmarks/convolution.py                                    # CPU: 10^5 edges / 5*10^3 nodes
    python benchmarks/convolution.py --device cuda --json conv.json     # the three sizes of the table below

The layer: node features ``x [nodes, 32x0e + 32x1o + 32x2e]`` gathered by edge source, times the edge's
spherical harmonics ``Y [edges, 0e + 1o + 2e + 3o]`` with per-edge weights ``W [edges, 416]`` (a radial
network's output) in every allowed "uvu" path (13), each path into its own output irrep (NequIP's
``irreps_mid``, 1376 columns), summed by edge destination into ``h [nodes, 1376]``. Random ``src``, sorted
``dst`` (as a neighbour list gives them), fp32 by default (``--dtype``). Variants:

* ``e3nn``: ``index_add(dst, e3nn.o3.TensorProduct(x[src], Y, W))``;
* ``unfused``: the same with this library's ``TensorProduct`` (the per-edge messages materialised);
* ``fused``: ``TensorProduct(x, Y, W, indices_1=src, indices_out=dst, size_out=nodes)``: the gather and the
  sum inside the kernels, deterministic (segments by destination); ``fused-atomic`` (CUDA): the sums by atomic
  adds, no sorting; ``fused-by-output``: every kernel's grid the segments of an output's index (the gradient
  of x then loops over the edges by source, reading the output gradient at random rows) instead of the choice
  of :func:`sparse_accumulation.ops.graph.registered._grid_slots` (by destination, x's gradient summed afterwards);
* ``cueq``: cuEquivariance's ``ChannelWiseTensorProduct`` with the same keywords, when it is importable;
* ``product``: the per-edge product alone, ``TensorProduct(x[src], Y, W)`` on gathered rows given as inputs
  (no gather, no sum).

Modes: ``fwd``; ``fwd+bwd`` (``h.backward(G)``: gradients of x, Y and W); ``double`` (the force-training
pattern: ``E = (h * G).sum()``, the gradients of Y and W with ``create_graph=True``, then the backward of
their sum). Each is the median of single calls (inputs requiring gradients, gradients reset before each call,
CUDA events on CUDA). ``peak MB``: the peak memory of one call above what was allocated before it
(``torch.cuda.max_memory_allocated`` on CUDA, the process's resident memory sampled every millisecond on the
CPU). Before timing, every variant but cuEquivariance is checked against e3nn in float64 on a small graph
(values and the gradients of x, Y and W).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sparse_accumulation.ops.graph import registered as graph_ops  # noqa: E402
from sparse_accumulation.bench.timing import elapsed_ms, synchronize, compiled_kernels_only  # noqa: E402
from sparse_accumulation.e3nn import TensorProduct  # noqa: E402

SIZES = {"cuda": [(1_000_000, 50_000), (100_000, 5_000), (2_000, 100)], "cpu": [(100_000, 5_000), (2_000, 100)]}
MODES = ("fwd", "fwd+bwd", "double")
VARIANTS = ("e3nn", "unfused", "fused", "fused-atomic", "fused-by-output", "cueq", "product")


def layer_irreps(spec: tuple):
    """``(irreps_in1, irreps_in2, irreps_out, instructions)`` of ``spec = (node irreps, harmonics lmax)``:
    every "uvu" path into its own output irrep."""
    from e3nn import o3

    in1 = o3.Irreps(spec[0])
    in2 = o3.Irreps.spherical_harmonics(spec[1])
    kept = o3.Irreps("0e + 1o + 2e")
    out, instructions = [], []
    for i1, (mul, ir1) in enumerate(in1):
        for i2, (_, ir2) in enumerate(in2):
            for ir in ir1 * ir2:
                if ir in kept:
                    instructions.append((i1, i2, len(out), "uvu", True))
                    out.append((mul, ir))
    return in1, in2, o3.Irreps(out), instructions


def make_modules(spec: tuple, dtype, device):
    """``(e3nn's TensorProduct, ours)`` on ``device`` in ``dtype`` (coefficients made in float64)."""
    from e3nn import o3

    in1, in2, out, instructions = layer_irreps(spec)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        theirs = o3.TensorProduct(in1, in2, out, instructions, shared_weights=False, internal_weights=False)
        ours = TensorProduct(in1, in2, out, instructions, shared_weights=False, internal_weights=False)
    finally:
        torch.set_default_dtype(previous)
    return theirs.to(device=device, dtype=dtype), ours.to(device=device, dtype=dtype)


def make_cueq(spec: tuple, dtype, device):
    """cuEquivariance's channel-wise product of the same irreps (None when it is not importable)."""
    try:
        import cuequivariance as cue
        import cuequivariance_torch as cuet
    except Exception:
        return None
    in1, in2, out, _ = layer_irreps(spec)
    return cuet.ChannelWiseTensorProduct(cue.Irreps("O3", str(in1)), cue.Irreps("O3", str(in2)),
                                         [cue.O3(ir.l, ir.p) for _, ir in out], layout=cue.mul_ir,
                                         shared_weights=False, internal_weights=False, device=device, dtype=dtype)


def layer(variant: str, theirs, ours, cueq, src, dst, nodes: int):
    """``f(x, Y, W) -> h [nodes, out]`` of a variant (``product``: ``f(x_edges, Y, W) -> [edges, out]``)."""
    if variant == "e3nn":
        return lambda x, Y, W: torch.zeros(nodes, theirs.irreps_out.dim, dtype=x.dtype, device=x.device).index_add(
            0, dst, theirs(x[src], Y, W))
    if variant == "unfused":
        return lambda x, Y, W: torch.zeros(nodes, theirs.irreps_out.dim, dtype=x.dtype, device=x.device).index_add(
            0, dst, ours(x[src], Y, W))
    if variant in ("fused", "fused-atomic", "fused-by-output"):
        reduction = "atomic" if variant == "fused-atomic" else None
        return lambda x, Y, W: ours(x, Y, W, indices_1=src, indices_out=dst, size_out=nodes, reduction=reduction)
    if variant == "cueq":
        return lambda x, Y, W: cueq(x, Y, W, indices_1=src, indices_out=dst, size_out=nodes)
    return lambda x, Y, W: ours(x, Y, W)


_GRID_SLOTS = graph_ops._grid_slots


def _by_output(crule, tensors, indices, offsets, outputs):
    gathered = [s for s in outputs if indices[s] is not None]
    if not gathered:
        return _GRID_SLOTS(crule, tensors, indices, offsets, outputs)
    return tuple(s for s in range(4) if indices[s] is indices[gathered[0]])


def grid_choice(variant) -> None:
    """``fused-by-output``: grids by an output's index; anything else: the library's choice."""
    graph_ops._grid_slots = _by_output if variant == "fused-by-output" else _GRID_SLOTS


def make_step(f, mode: str, inputs, G):
    leaves = [t.detach().requires_grad_() for t in inputs]

    def step():
        for leaf in leaves:
            leaf.grad = None
        h = f(*leaves)
        if mode == "fwd":
            return h
        if mode == "fwd+bwd":
            h.backward(G)
            return [leaf.grad for leaf in leaves]
        energy = (h * G).sum()
        gY, gW = torch.autograd.grad(energy, leaves[1:], create_graph=True)
        (gY.sum() + gW.sum()).backward()
        return [leaf.grad for leaf in leaves]

    return step


class _ResidentPeak:
    """The largest resident set size of this process while it runs, sampled every millisecond (CPU)."""

    def __enter__(self):
        self.peak = self.base = self._rss()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.001)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self._rss())


def release_freed_memory() -> None:
    """Hand the memory the C allocator holds free back to the system (glibc's ``malloc_trim``), so that the
    resident-memory peak of the next step counts what it allocates, not what an earlier step left free."""
    name = ctypes.util.find_library("c")
    if name is not None and hasattr(ctypes.CDLL(name), "malloc_trim"):
        ctypes.CDLL(name).malloc_trim(0)


def peak_mb(step, device) -> float:
    """Peak memory of one step above what was allocated before it, in MB (on the CPU: the growth of the resident
    memory, after the allocator's free memory is handed back)."""
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = step()
        synchronize(device)
        del result
        return (torch.cuda.max_memory_allocated(device) - before) / 1e6
    gc.collect()
    release_freed_memory()
    with _ResidentPeak() as peak:
        result = step()
        del result
    return (peak.peak - peak.base) / 1e6


def kernel_profile(step, device, rows: int = 12) -> str:
    """The kernels of one step and their device time (torch.profiler), the longest first."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        step()
        synchronize(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def measure_step(step, device, repeats: int, max_seconds: float) -> dict:
    """Median time and peak memory of a whole model's ``step`` after two warm-up calls (at most ``repeats``
    samples, fewer past ``max_seconds``), or ``{"error": "out of memory"}``."""
    try:
        for _ in range(2):
            step()
        deadline = time.perf_counter() + max_seconds
        samples = [elapsed_ms(step, device)]
        while len(samples) < repeats and time.perf_counter() < deadline:
            samples.append(elapsed_ms(step, device))
        memory = peak_mb(step, device)
    except torch.OutOfMemoryError:
        return {"error": "out of memory"}
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"ms": statistics.median(samples), "samples": len(samples), "peak_mb": memory}


def time_step(step, device, repeats: int, max_seconds: float) -> float:
    step()
    step()
    samples, deadline = [], time.perf_counter() + max_seconds
    for _ in range(repeats):
        samples.append(elapsed_ms(step, device))
        if time.perf_counter() > deadline:
            break
    return statistics.median(samples)


def check(spec: tuple, variants, device) -> float:
    """The largest relative error of our variants against e3nn in float64 (values, dx, dY, dW), small graph."""
    theirs, ours = make_modules(spec, torch.float64, device)
    generator = torch.Generator().manual_seed(1)
    nodes, edges = 30, 400
    src = torch.randint(0, nodes, (edges,), generator=generator).to(device)
    dst = torch.randint(0, nodes, (edges,), generator=generator).sort().values.to(device)
    x = torch.randn(nodes, theirs.irreps_in1.dim, generator=generator, dtype=torch.float64).to(device)
    Y = torch.randn(edges, theirs.irreps_in2.dim, generator=generator, dtype=torch.float64).to(device)
    W = torch.randn(edges, theirs.weight_numel, generator=generator, dtype=torch.float64).to(device)
    G = torch.randn(nodes, theirs.irreps_out.dim, generator=generator, dtype=torch.float64).to(device)
    worst = 0.0
    reference = None
    for variant in ("e3nn",) + tuple(v for v in variants if v not in ("e3nn", "cueq", "product")):
        grid_choice(variant)
        f = layer(variant, theirs, ours, None, src, dst, nodes)
        leaves = [t.clone().requires_grad_() for t in (x, Y, W)]
        h = f(*leaves)
        result = [h] + list(torch.autograd.grad(h, leaves, G))
        if reference is None:
            reference = result
            continue
        for a, b in zip(result, reference):
            worst = max(worst, ((a - b).abs().max() / b.abs().max()).item())
    grid_choice(None)
    return worst


def versions() -> dict:
    import e3nn

    result = {"python": platform.python_version(), "torch": torch.__version__, "e3nn": e3nn.__version__}
    for name in ("numba", "triton", "cuequivariance_torch"):
        try:
            result[name] = __import__(name).__version__
        except Exception:
            pass
    return result


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", type=float, nargs="+", default=None, metavar="EDGES,NODES",
                        help="edge and node counts, pairs (default: the device's sizes)")
    parser.add_argument("--variants", default=None, help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, from " + ", ".join(MODES))
    parser.add_argument("--channels", type=int, default=32, help="multiplicity of the default node irreps")
    parser.add_argument("--irreps", default=None,
                        help="node irreps (default: Cx0e + Cx1o + Cx2e with C = --channels)")
    parser.add_argument("--sh-lmax", type=int, default=3, help="degree of the edges' spherical harmonics")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--e3nn-max-edges", type=float, default=None,
                        help="run e3nn and the unfused variant up to this many edges (default: all on CUDA, 10^5 "
                             "on the CPU)")
    parser.add_argument("--profile", action="store_true",
                        help="after each timing, list the kernels of one step (torch.profiler)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    sizes = ([(int(a), int(b)) for a, b in zip(args.sizes[::2], args.sizes[1::2])] if args.sizes
             else SIZES[device.type])
    default_variants = [v for v in VARIANTS if device.type == "cuda" or v not in ("fused-atomic", "cueq")]
    variants = args.variants.split(",") if args.variants else default_variants
    modes = args.modes.split(",")
    e3nn_max = args.e3nn_max_edges or (float("inf") if device.type == "cuda" else 1e5)

    c = args.channels
    spec = (args.irreps or f"{c}x0e + {c}x1o + {c}x2e", args.sh_lmax)
    theirs, ours = make_modules(spec, dtype, device)
    cueq = make_cueq(spec, dtype, device) if "cueq" in variants and device.type == "cuda" else None
    if cueq is None:
        variants = [v for v in variants if v != "cueq"]
    error = check(spec, variants, device)
    assert error < 1e-10, f"a variant differs from e3nn by {error:.3g} (float64)"
    meta = {"command": "python benchmarks/convolution.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
            "versions": versions(), "dtype": args.dtype, "irreps": spec[0], "sh_lmax": spec[1],
            "out_dim": theirs.irreps_out.dim, "weight_numel": theirs.weight_numel, "check_float64": error}
    print(json.dumps(meta), flush=True)
    rows = []
    for edges, nodes in sizes:
        generator = torch.Generator().manual_seed(0)
        src = torch.randint(0, nodes, (edges,), generator=generator).to(device)
        dst = torch.randint(0, nodes, (edges,), generator=generator).sort().values.to(device)

        def randn(*shape):
            return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

        x, Y, W = randn(nodes, theirs.irreps_in1.dim), randn(edges, theirs.irreps_in2.dim), randn(edges, theirs.weight_numel)
        G = randn(nodes, theirs.irreps_out.dim)
        outputs = {}
        for variant in variants:
            if variant in ("e3nn", "unfused") and edges > e3nn_max:
                continue
            f = layer(variant, theirs, ours, cueq, src, dst, nodes)
            inputs, grad = (x, Y, W), G
            if variant == "product":
                inputs, grad = (x[src], Y, W), torch.randn(edges, theirs.irreps_out.dim, device=device, dtype=dtype)
            grid_choice(variant)
            with torch.no_grad():
                outputs[variant] = f(*inputs)
            for mode in modes:
                step = make_step(f, mode, inputs, grad)
                try:
                    ms = time_step(step, device, args.repeats, args.max_seconds)
                    memory = peak_mb(step, device)
                except Exception as exc:  # a variant that cannot run a mode (reported, not fatal)
                    print(f"  {variant} {mode}: FAILED ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
                    continue
                if args.profile:
                    print(kernel_profile(step, device), flush=True)
                row = {"edges": edges, "nodes": nodes, "variant": variant, "mode": mode, "ms": ms, "peak_mb": memory}
                rows.append(row)
                print(f"  {edges:>9,} edges {variant:>12} {mode:>8}: {ms:9.3f} ms  peak {memory:9.1f} MB", flush=True)
                del step
                synchronize(device)
        grid_choice(None)
        reference = outputs.get("e3nn", outputs.get("fused"))
        for variant, h in outputs.items():
            if variant not in ("product", "cueq") and reference is not None:
                difference = ((h.double() - reference.double()).abs().max() / reference.double().abs().max()).item()
                print(f"  {variant}: output differs from {'e3nn' if 'e3nn' in outputs else 'fused'} by "
                      f"{difference:.1e}", flush=True)
        del x, Y, W, G, outputs
        synchronize(device)
    print(format_table(rows, modes))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)
    return rows


def format_table(rows, modes) -> str:
    header = "| edges / nodes | variant | " + " | ".join(f"{m} ms (peak MB)" for m in modes) + " |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    keys = []
    for r in rows:
        if (r["edges"], r["nodes"], r["variant"]) not in keys:
            keys.append((r["edges"], r["nodes"], r["variant"]))
    for edges, nodes, variant in keys:
        cells = []
        for mode in modes:
            match = [r for r in rows if (r["edges"], r["nodes"], r["variant"], r["mode"]) == (edges, nodes, variant, mode)]
            cells.append(f"{match[0]['ms']:.3g} ({match[0]['peak_mb']:.0f})" if match else "-")
        lines.append(f"| {edges:,} / {nodes:,} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
