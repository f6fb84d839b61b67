"""Benchmark of MACE's symmetric contraction (its product basis): MACE's module, this library's
``sparse_accumulation.mace.SymmetricContraction`` and cuEquivariance's, with their peak memory.

    python benchmarks/symmetric_contraction.py                       # CPU: 2*10^3 nodes
    python benchmarks/symmetric_contraction.py --device cuda --json symmetric_contraction_h200.json

The configuration of issue 23: ``x [nodes, 128, 16]`` (``128x0e+128x1o+128x2e+128x3o``) -> ``128x0e+128x1o``,
correlation 3, 10 elements drawn at random per node, fp32 by default (``--dtype``). Variants:

* ``mace``: ``mace.modules.symmetric_contraction.SymmetricContraction`` (mace-torch, loaded without its package
  imports), called with one-hot element rows;
* ``ours``: ``SymmetricContraction.from_mace(mace)``: the same weights and couplings, the same one-hot rows;
* ``cueq``: ``cuequivariance_torch.SymmetricContraction`` (CUDA, when importable) with element indices, its
  own random weights (timing only: its basis and layout differ);
* ``ours-compiled`` (not run unless named): ``torch.compile`` of ``ours`` (compiled by its first call, the
  warm-up; run the benchmark twice to time it from a warm compile cache, as a user's second run of a script
  does).

Modes: ``fwd``; ``fwd+bwd`` (``out.backward(G)``: gradients of x and of the weights); ``double`` (force
training: ``E = (out * G).sum()``, ``dE/dx`` with ``create_graph=True``, then the backward of
``(dE/dx * H).sum()`` into x and the weights). Each is the median of single calls (inputs requiring gradients,
gradients reset before each call, CUDA events on CUDA) after one warm-up call. ``peak MB``: the peak memory of
one call above what was allocated before it (as in ``convolution.py``). Before timing, ``ours`` is checked
against MACE in float64 at the full configuration on 50 nodes (output, gradients of x and of every weight).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from convolution import peak_mb  # noqa: E402
from sparse_accumulation.bench.timing import compiled_kernels_only, elapsed_ms, synchronize  # noqa: E402
from sparse_accumulation.mace import SymmetricContraction  # noqa: E402
from sparse_accumulation.mace.reference import mace_symmetric_contraction_module  # noqa: E402

SIZES = {"cuda": [1_000, 10_000, 50_000], "cpu": [2_000]}
MODES = ("fwd", "fwd+bwd", "double")
VARIANTS = ("mace", "ours", "cueq", "ours-compiled")
IRREPS_IN = "{c}x0e+{c}x1o+{c}x2e+{c}x3o"
IRREPS_OUT = "{c}x0e+{c}x1o"


def mace_class():
    """MACE's ``SymmetricContraction`` (without mace's package imports)."""
    try:
        return mace_symmetric_contraction_module().SymmetricContraction
    except ImportError as error:
        raise SystemExit(str(error)) from None


def make_mace(channels: int, correlation: int, num_elements: int):
    """MACE's module in float64 (its coupling tensors made in float64), with random weights."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return mace_class()(IRREPS_IN.format(c=channels), IRREPS_OUT.format(c=channels), correlation=correlation,
                            num_elements=num_elements)
    finally:
        torch.set_default_dtype(previous)


def make_cueq(channels: int, correlation: int, num_elements: int, dtype, device):
    """``(module, call)`` of cuEquivariance's symmetric contraction, or None when it is not importable."""
    try:
        import cuequivariance as cue
        import cuequivariance_torch as cuet
    except Exception:
        return None
    module = cuet.SymmetricContraction(
        cue.Irreps(cue.O3, IRREPS_IN.format(c=channels)), cue.Irreps(cue.O3, IRREPS_OUT.format(c=channels)),
        layout_in=cue.ir_mul, layout_out=cue.mul_ir, contraction_degree=correlation, num_elements=num_elements,
        original_mace=True, dtype=dtype, math_dtype=dtype, device=device)
    return module


def call(variant: str, module, y_one_hot, y_index):
    """``f(x) -> out`` of a variant; x is ``[nodes, channels, 16]``."""
    if variant == "cueq":
        return lambda x: module(x.transpose(1, 2).flatten(1), y_index.int())
    return lambda x: module(x, y_one_hot)


def make_step(f, mode: str, x, G, H, parameters):
    leaf = x.detach().requires_grad_()
    parameters = [p for p in parameters if p.requires_grad]

    def step():
        leaf.grad = None
        for p in parameters:
            p.grad = None
        out = f(leaf)
        if mode == "fwd":
            return out
        if mode == "fwd+bwd":
            out.backward(G)
            return leaf.grad
        gx, = torch.autograd.grad((out * G).sum(), leaf, create_graph=True)
        (gx * H).sum().backward()
        return leaf.grad

    return step


def time_step(step, device, repeats: int, max_seconds: float) -> float:
    """Median of ``repeats`` single calls after one warm-up call (fewer when they pass ``max_seconds``)."""
    step()
    deadline = time.perf_counter() + max_seconds
    samples = [elapsed_ms(step, device)]
    while len(samples) < repeats and time.perf_counter() < deadline:
        samples.append(elapsed_ms(step, device))
    return statistics.median(samples)


def check(mace, ours, device, nodes: int = 50) -> float:
    """The largest relative error of ours against MACE in float64: output, gradients of x and every weight."""
    generator = torch.Generator().manual_seed(1)
    channels, num_elements = ours.channels, ours.num_elements
    x = torch.randn(nodes, channels, 16, generator=generator, dtype=torch.float64).to(device).requires_grad_()
    y = torch.nn.functional.one_hot(torch.randint(0, num_elements, (nodes,), generator=generator),
                                    num_elements).to(device=device, dtype=torch.float64)
    G = torch.randn(nodes, channels * 4, generator=generator, dtype=torch.float64).to(device)
    names = [n for n, p in mace.named_parameters() if p.requires_grad]
    worst, results = 0.0, []
    for module in (mace, ours):
        out = module(x, y)
        results.append([out, *torch.autograd.grad(out, [x, *[module.get_parameter(n) for n in names]], G)])
    for a, b in zip(results[1], results[0]):
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item())
    return worst


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]} ({os.cpu_count()} cores)"
    except (OSError, IndexError):
        return platform.processor()


def versions() -> dict:
    from importlib import metadata

    result = {"python": platform.python_version(), "torch": torch.__version__}
    for distribution in ("numba", "triton", "e3nn", "mace-torch", "cuequivariance-torch"):
        try:
            result[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            pass
    return result


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nodes", type=float, nargs="+", default=None)
    parser.add_argument("--variants", default="mace,ours,cueq", help="comma-separated, from " + ", ".join(VARIANTS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, from " + ", ".join(MODES))
    parser.add_argument("--mace-modes", default=None, help="modes MACE runs (default: --modes)")
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--correlation", type=int, default=3)
    parser.add_argument("--num-elements", type=int, default=10)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--repeats", type=int, default=None, help="calls timed (default: 9 on CUDA, 3 on the CPU)")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="stop timing a call after this long")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    sizes = [int(n) for n in args.nodes] if args.nodes else SIZES[device.type]
    variants = args.variants.split(",")
    modes = args.modes.split(",")
    mace_modes = args.mace_modes.split(",") if args.mace_modes else modes
    repeats = args.repeats or (9 if device.type == "cuda" else 3)

    started = time.perf_counter()
    mace64 = make_mace(args.channels, args.correlation, args.num_elements).to(device)
    ours64 = SymmetricContraction.from_mace(mace64)
    error = check(mace64, ours64, device)
    assert error < 1e-10, f"ours differs from MACE by {error:.3g} (float64)"
    modules = {"mace": copy.deepcopy(mace64).to(dtype), "ours": SymmetricContraction.from_mace(mace64).to(dtype)}
    if "cueq" in variants and device.type == "cuda":
        try:
            cueq = make_cueq(args.channels, args.correlation, args.num_elements, dtype, device)
        except Exception as exc:
            print(f"  cueq: not built ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
            cueq = None
        if cueq is not None:
            modules["cueq"] = cueq
    if "ours-compiled" in variants:
        modules["ours-compiled"] = torch.compile(modules["ours"])
    variants = [v for v in variants if v in modules]
    meta = {"command": "python benchmarks/symmetric_contraction.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
            "threads": torch.get_num_threads(), "versions": versions(), "dtype": args.dtype,
            "channels": args.channels, "correlation": args.correlation, "num_elements": args.num_elements,
            "terms": int(ours64.couplings.shape[0]), "check_float64": error,
            "setup_seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(meta), flush=True)
    del mace64, ours64
    rows = []
    for nodes in sizes:
        generator = torch.Generator().manual_seed(0)
        elements = torch.randint(0, args.num_elements, (nodes,), generator=generator).to(device)
        y = torch.nn.functional.one_hot(elements, args.num_elements).to(dtype)
        x = torch.randn(nodes, args.channels, 16, generator=generator).to(device=device, dtype=dtype)
        outputs = {}
        for variant in variants:
            f = call(variant, modules[variant], y, elements)
            try:
                with torch.no_grad():
                    outputs[variant] = f(x)
            except Exception as exc:
                print(f"  {nodes:>7,} nodes {variant:>5}: FAILED ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
                continue
            G = torch.randn(outputs[variant].shape, generator=generator).to(device=device, dtype=dtype)
            H = torch.randn(x.shape, generator=generator).to(device=device, dtype=dtype)
            for mode in modes:
                if variant == "mace" and mode not in mace_modes:
                    continue
                step = make_step(f, mode, x, G, H, modules[variant].parameters())
                try:
                    ms = time_step(step, device, repeats, args.max_seconds)
                    memory = peak_mb(step, device)
                except Exception as exc:  # out of memory, a mode a variant cannot run: reported, not fatal
                    print(f"  {nodes:>7,} nodes {variant:>5} {mode:>8}: FAILED ({type(exc).__name__}: "
                          f"{str(exc)[:200]})", flush=True)
                    continue
                rows.append({"nodes": nodes, "variant": variant, "mode": mode, "ms": ms, "peak_mb": memory})
                print(f"  {nodes:>7,} nodes {variant:>5} {mode:>8}: {ms:10.3f} ms  peak {memory:9.1f} MB", flush=True)
                del step
                synchronize(device)
        if "mace" in outputs and "ours" in outputs:
            reference = outputs["mace"].double()
            difference = ((outputs["ours"].double() - reference).abs().max() / reference.abs().max()).item()
            print(f"  {nodes:>7,} nodes: ours differs from MACE by {difference:.1e} ({args.dtype})", flush=True)
        del x, y, outputs
        synchronize(device)
    report = {"meta": meta, "results": rows}
    print(format_table(rows, modes) + f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    return rows


def format_table(rows, modes) -> str:
    header = "| nodes | variant | " + " | ".join(f"{m} ms (peak MB)" for m in modes) + " | vs MACE |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    keys = list(dict.fromkeys((r["nodes"], r["variant"]) for r in rows))
    found = {(r["nodes"], r["variant"], r["mode"]): r for r in rows}
    for nodes, variant in keys:
        cells, ratios = [], []
        for mode in modes:
            r = found.get((nodes, variant, mode))
            cells.append(f"{r['ms']:.4g} ({r['peak_mb']:.0f})" if r else "-")
            mace = found.get((nodes, "mace", mode))
            if r and mace and variant != "mace":
                ratios.append(f"{mace['ms'] / r['ms']:.1f}x")
        lines.append(f"| {nodes:,} | {variant} | " + " | ".join(cells) + f" | {' / '.join(ratios) or '-'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
