"""Benchmark of a NequIP-like convolution: ``sparse_accumulation.e3nn.TensorProduct`` vs e3nn's ``o3.TensorProduct``.

    python benchmarks/tensor_product.py                                   # CPU: 10^5 edges
    python benchmarks/tensor_product.py --device cuda --edges 100000 1000000 --json tp.json

The product of a NequIP interaction block: node features ``32x0e + 32x1o + 32x2e`` (``--channels``) of an
edge's neighbour times the edge's spherical harmonics ``0e + 1o + 2e + 3o`` into ``32x0e + 32x1o + 32x2e``,
every allowed "uvu" path (13), with per-edge weights from a radial network (``shared_weights=False``,
``internal_weights=False``: ``weight[E, 13 * 32]``), e3nn's default normalizations, ``--dtype`` float32.
Both modules get the same arguments and the same e3nn-layout tensors.

For each edge count, first the check: on the first 1000 edges, outputs and the gradients of x, Y and the
weights of both, computed in float64, must agree (relative max error below 1e-10); where e3nn is timed, the
outputs of the timed forward calls (in ``--dtype``) are compared as well. Then the timings, each the
median of ``--repeats`` single calls as a training step makes them (``sparse_accumulation.bench.measure``,
timing "call": inputs requiring gradients, gradients reset to None before each step, synchronised around
each call, CUDA events on CUDA):

* ``fwd``: the forward;
* ``fwd+bwd``: the forward and ``out.backward(G)``, the gradients of x, Y and the weights;
* ``relayout``: what our layout conversions cost inside our forward (the copies of x into and of the output
  out of the channel layout used on CUDA; on the CPU the operands are e3nn's tensors themselves, nothing is
  copied, unless ``--layout channels``), timed alone.

Ratios are e3nn / ours (> 1: ours is faster). e3nn is timed up to ``--e3nn-max-edges`` edges (default:
every size on CUDA, 10^5 on the CPU, where its forward+backward takes tens of seconds per call at 10^5).
On the CPU, ``uptime``'s load average is printed before and after each size: the machine may be shared,
and ratios within one run are what counts.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.bench.timing import make_step, measure, synchronize, compiled_kernels_only  # noqa: E402
from sparse_accumulation.e3nn import TensorProduct  # noqa: E402
from sparse_accumulation.e3nn.layout import gather, scatter  # noqa: E402

CHECK_EDGES = 1000


def nequip_irreps(channels: int) -> tuple:
    return (f"{channels}x0e + {channels}x1o + {channels}x2e", "0e + 1o + 2e + 3o",
            f"{channels}x0e + {channels}x1o + {channels}x2e")


def uvu_instructions(irreps_in1, irreps_in2, irreps_out) -> list:
    """Every allowed ``(i1, i2, i_out)`` in mode "uvu", with weights: NequIP's convolution."""
    return [(i1, i2, io, "uvu", True)
            for i1, (_, ir1) in enumerate(irreps_in1) for i2, (_, ir2) in enumerate(irreps_in2)
            for io, (_, ir_out) in enumerate(irreps_out) if ir_out in ir1 * ir2]


def make_products(channels: int, implementation, layout: str = "auto"):
    """``(e3nn's TensorProduct, ours)``, float64 coefficients (cast to the inputs' dtype on the call);
    ``layout="channels"`` gives ours the channel layout on every device."""
    from e3nn import o3

    irreps = [o3.Irreps(i) for i in nequip_irreps(channels)]
    instructions = uvu_instructions(*irreps)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn computes its 3j symbols in the default dtype
    try:
        theirs = o3.TensorProduct(*irreps, instructions, shared_weights=False, internal_weights=False)
        ours = TensorProduct(*irreps, instructions, shared_weights=False, internal_weights=False,
                             implementation=implementation, channels=channels if layout == "channels" else None)
    finally:
        torch.set_default_dtype(previous)
    return theirs, ours


def inputs(theirs, edges: int, dtype, device, seed: int = 0) -> tuple:
    """``(x, Y, weight, G)`` in e3nn's layouts."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)

    return (randn(edges, theirs.irreps_in1.dim), randn(edges, theirs.irreps_in2.dim),
            randn(edges, theirs.weight_numel), randn(edges, theirs.irreps_out.dim))


def relative_error(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max()).item()


def check_float64(theirs, ours, x, y, w, G) -> float:
    """The largest relative error between the two modules' (float64) outputs and gradients."""
    leaves = [t[:CHECK_EDGES].detach().double().requires_grad_() for t in (x, y, w)]
    g = G[:CHECK_EDGES].double()
    errors = []
    results = []
    for module in (theirs, ours):
        out = module(*leaves)
        results.append((out, *torch.autograd.grad(out, leaves, g)))
    for a, b in zip(*results):
        errors.append(relative_error(b, a))
    return max(errors)


def time_module(module, x, y, w, G, device, repeats: int, max_seconds: float) -> dict:
    """Median ms of the forward and of the forward + backward, and the last forward's output."""
    forward = make_step(module, "forward", x, y, w, G, requires_grad=True, grad_c=True)
    both = make_step(module, "backward", x, y, w, G, requires_grad=True, grad_c=True)
    result = {}
    for name, step in (("fwd", forward), ("fwd+bwd", both)):
        samples = measure("call", step, device, repeats=repeats, warmup=2, max_seconds=max_seconds)
        result[name] = statistics.median(samples)
        result[name + " samples"] = len(samples)
    with torch.no_grad():
        result["out"] = module(x, y, w)
    return result


def time_relayout(ours, x, device, repeats: int) -> float:
    """Median ms of our layout conversions alone: x into the operand layout, an output out of it."""
    plan, _ = ours._plan_for(x.device, ours.implementation)
    out = torch.empty(*x.shape[:-1], plan.channels, plan.out.width, dtype=x.dtype, device=x.device)

    def step():
        return gather(x, plan.x), scatter(out, plan.out)

    with torch.no_grad():
        return statistics.median(measure("kernel", step, device, repeats=repeats, warmup=2))


def versions() -> dict:
    import e3nn

    result = {"python": platform.python_version(), "torch": torch.__version__, "e3nn": e3nn.__version__}
    for name in ("numba", "triton"):
        try:
            result[name] = __import__(name).__version__
        except Exception:  # not installed or broken: not used
            pass
    return result


def machine(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def load() -> str:
    try:
        return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "load average unknown"


def format_table(rows: list) -> str:
    header = ("| edges | ours fwd ms | ours fwd+bwd ms | e3nn fwd ms | e3nn fwd+bwd ms | e3nn / ours fwd | "
              "e3nn / ours fwd+bwd | relayout ms | check (float64) |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]

    def ms(value):
        return "n/a" if value is None else f"{value:.3g}" if value < 1 else f"{value:.1f}"

    def ratio(a, b):
        return "n/a" if a is None or b is None else f"{a / b:.1f}x"

    for r in rows:
        lines.append(f"| {r['edges']:,} | {ms(r['ours']['fwd'])} | {ms(r['ours']['fwd+bwd'])} | "
                     f"{ms(r['e3nn'].get('fwd'))} | {ms(r['e3nn'].get('fwd+bwd'))} | "
                     f"{ratio(r['e3nn'].get('fwd'), r['ours']['fwd'])} | "
                     f"{ratio(r['e3nn'].get('fwd+bwd'), r['ours']['fwd+bwd'])} | {ms(r['relayout_ms'])} | "
                     f"{r['check_float64']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--edges", type=float, nargs="+", default=None,
                        help="edge counts (default: 1e5 and 1e6 on CUDA, 1e5 on the CPU)")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--implementation", default=None,
                        help="our kernels (default: the library default for the device)")
    parser.add_argument("--layout", choices=["auto", "channels"], default="auto",
                        help="our operands: the library's choice for the device (CPU: e3nn's rows), or the "
                             "channel layout CUDA uses, on any device (to time its copies)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-seconds", type=float, default=120.0,
                        help="stop sampling a timing after this long (at least one sample is taken)")
    parser.add_argument("--e3nn-max-edges", type=float, default=None,
                        help="time e3nn up to this many edges (default: all on CUDA, 1e5 on the CPU)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    edge_counts = [int(e) for e in (args.edges or ([1e5, 1e6] if device.type == "cuda" else [1e5]))]
    e3nn_max = args.e3nn_max_edges if args.e3nn_max_edges is not None else (
        float("inf") if device.type == "cuda" else 1e5)

    checked = [module.to(device) for module in make_products(args.channels, args.implementation, args.layout)]
    theirs, ours = (module.to(device=device, dtype=dtype)
                    for module in make_products(args.channels, args.implementation, args.layout))
    plan = ours._plan_for(device, ours.implementation)[0]
    meta = {"command": "python benchmarks/tensor_product.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": str(device), "machine": machine(device), "versions": versions(), "dtype": args.dtype,
            "channels": args.channels, "irreps": nequip_irreps(args.channels),
            "instructions": len(theirs.instructions), "weight_numel": theirs.weight_numel,
            "implementation": sa.backends.resolve(args.implementation, device), "layout_channels": plan.channels,
            "rule_nnz": plan.rule.nnz, "repeats": args.repeats}
    print(json.dumps(meta), flush=True)

    rows = []
    for edges in edge_counts:
        print(f"{edges} edges, {load()}", flush=True)
        x, y, w, G = inputs(theirs, edges, dtype, device)
        check = check_float64(*checked, x, y, w, G)
        assert check < 1e-10, f"ours differs from e3nn by {check:.3g} (float64, {CHECK_EDGES} edges)"
        row = {"edges": edges, "check_float64": check, "e3nn": {}}
        row["ours"] = time_module(ours, x, y, w, G, device, args.repeats, args.max_seconds)
        row["relayout_ms"] = time_relayout(ours, x, device, args.repeats)
        print(f"  ours: fwd {row['ours']['fwd']:.3f} ms, fwd+bwd {row['ours']['fwd+bwd']:.3f} ms, "
              f"relayout {row['relayout_ms']:.3f} ms", flush=True)
        if edges <= e3nn_max:
            row["e3nn"] = time_module(theirs, x, y, w, G, device, args.repeats, args.max_seconds)
            row["timed_outputs_error"] = relative_error(row["ours"]["out"], row["e3nn"].pop("out"))
            tolerance = 1e-4 if dtype == torch.float32 else 1e-10
            assert row["timed_outputs_error"] < tolerance, f"outputs differ by {row['timed_outputs_error']:.3g}"
            print(f"  e3nn: fwd {row['e3nn']['fwd']:.3f} ms, fwd+bwd {row['e3nn']['fwd+bwd']:.3f} ms "
                  f"(outputs agree to {row['timed_outputs_error']:.1e})", flush=True)
        row["ours"].pop("out")
        print(f"  {load()}", flush=True)
        rows.append(row)
        del x, y, w, G
        synchronize(device)

    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
