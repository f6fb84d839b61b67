"""Benchmark of a fully connected tensor product: ``sparse_accumulation.e3nn.FullyConnectedTensorProduct`` vs
e3nn's, and cuEquivariance's where it is importable (CUDA).

    python benchmarks/fully_connected.py                                     # CPU: 64x0e+64x1o+64x2e, 10^3 rows
    python benchmarks/fully_connected.py --device cuda --rows 10000 100000

The product of ``IRREPS`` (default ``64x0e + 64x1o + 64x2e``) with itself into the same irreps, every path
"uvw" with shared internal weights (e3nn's defaults), ``--dtype`` float32. First the check: outputs of both on
300 rows in float64 must agree, with the gradients of both inputs and the weights (relative max error below
1e-10). Then the medians of ``--repeats`` single calls as a training step makes them (inputs requiring
gradients; ``no-grad``: the forward under ``torch.no_grad()``, ``fwd``: the forward, ``fwd+bwd``: the forward and
``out.backward(G)``), with the peak memory of a
step (on the CPU: the growth of the resident memory).
Ratios are e3nn / ours. ``--variants`` picks the modules timed, ``--matmul-precision`` sets
``torch.set_float32_matmul_precision`` for all of them. ``--chunk-mb`` sets the memory beyond which ours computes
its rows in chunks and recomputes them in the backward (:mod:`sparse_accumulation.ops.factored`). The ``floor``
variant times the matrix products alone that any design made of ordinary matrix products computes for the "uvw"
instructions (each instruction's weights against its rows times the smallest of its three irreps' dimensions,
on ready operands; three such products for ``fwd+bwd``), with their multiply-adds per second: e3nn / floor is the
most that such a design could gain over e3nn on the machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from sparse_accumulation.bench.timing import measure, compiled_kernels_only

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convolution import peak_mb  # noqa: E402


def _step(module, x, y, G, mode):
    def step():
        x.grad = y.grad = None
        for p in module.parameters():
            p.grad = None
        if mode == "no-grad":
            with torch.no_grad():
                return module(x, y)
        out = module(x, y)
        if mode == "fwd+bwd":
            out.backward(G)
        return out

    return step


def _outputs_and_gradients(module, x, y, G) -> list:
    out = module(x, y)
    return [out.detach(), *torch.autograd.grad(out, [x, y, *module.parameters()], G)]


class _Fused(torch.nn.Module):
    """Ours with the fused "uvw" kernels (float32 on CUDA) set ``"always"`` or ``"off"`` (the factored torch
    operations) instead of ``"auto"`` (:data:`sparse_accumulation.ops.factored.FUSED`)."""

    def __init__(self, inner, setting: str):
        super().__init__()
        self.inner, self.setting = inner, setting

    def forward(self, x, y):
        from sparse_accumulation.ops import factored

        previous, factored.FUSED = factored.FUSED, self.setting
        try:
            return self.inner(x, y)
        finally:
            factored.FUSED = previous


def _floor_step(specs, rows, dtype, device, mode, block_rows=512):
    """``(step, multiply-adds)``: the matrix products that any design computing the product with ordinary matrix
    products does at least, alone: per instruction the weights ``[mul1 mul2, mul_out]`` against
    ``rows * min(2 l1 + 1, 2 l2 + 1, 2 l_out + 1)`` rows of ready operands (for ``fwd+bwd`` also the gradients of
    both, three products of that size), no coupling, no layout; operands of ``block_rows`` rows at most, used
    again for the rest of the rows (those of every row would not fit in memory at 10^5 rows)."""
    block = min(rows, block_rows)
    pieces = [block] * (rows // block) + ([rows % block] if rows % block else [])
    operands = []
    for s1, mul1, d1, s2, mul2, d2, so, mul_out, d_out, sw, sc, mode_number in specs:
        d = min(d1, d2, d_out)
        left, right = (torch.randn(block * d, mul1 * mul2, dtype=dtype, device=device),
                       torch.randn(mul1 * mul2, mul_out, dtype=dtype, device=device))
        operands.append((left, right, torch.randn(block * d, mul_out, dtype=dtype, device=device), d))

    def step():
        for piece in pieces:
            for left, right, grad, d in operands:
                left, grad = left[:piece * d], grad[:piece * d]
                torch.mm(left, right)
                if mode == "fwd+bwd":  # the gradients of both operands
                    torch.mm(grad, right.t())
                    torch.mm(left.t(), grad)

    macs = rows * sum(left.shape[1] * right.shape[1] * d for left, right, grad, d in operands)
    macs *= 3 if mode == "fwd+bwd" else 1
    return step, macs


def _modules(irreps, dtype, device, with_cueq):
    from e3nn import o3

    import sparse_accumulation.e3nn as ours

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # e3nn computes its 3j symbols in the default dtype
    try:
        theirs = o3.FullyConnectedTensorProduct(irreps, irreps, irreps).to(device=device)
    finally:
        torch.set_default_dtype(default)
    mine = ours.FullyConnectedTensorProduct(irreps, irreps, irreps, dtype=dtype).to(device)
    mine.load_state_dict(theirs.state_dict(), strict=True)
    modules = {"e3nn": theirs, "ours": mine, "fused": _Fused(mine, "always"), "factored": _Fused(mine, "off")}
    if with_cueq:
        try:
            import cuequivariance as cue
            import cuequivariance_torch as cuet
        except ImportError:
            return modules
        modules["cueq"] = cuet.FullyConnectedTensorProduct(
            cue.Irreps("O3", irreps), cue.Irreps("O3", irreps), cue.Irreps("O3", irreps), layout=cue.mul_ir,
            device=device, dtype=dtype)
    return modules


def main(argv=None) -> None:
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--irreps", default="64x0e + 64x1o + 64x2e")
    parser.add_argument("--rows", type=int, nargs="+", default=[1000])
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mb", type=float, default=None,
                        help="ours: the bytes of intermediates beyond which rows go in chunks and the backward "
                             "recomputes them (default: SPARSE_ACCUMULATION_FACTORED_CHUNK_MB, else 256 on the CPU, "
                             "a quarter of a GPU's memory and at least 1024; on the CPU chunks of 64 MiB at most "
                             "in any case)")
    parser.add_argument("--variants", default="e3nn,ours,cueq",
                        help="of e3nn, ours, fused and factored (ours with the fused uvw kernels of float32 on "
                             "CUDA always or never, rather than as SPARSE_ACCUMULATION_FUSED_UVW says), cueq (CUDA), "
                             "floor (the matrix products alone that a design of ordinary matrix products does)")
    parser.add_argument("--modes", default="no-grad,fwd,fwd+bwd",
                        help="of no-grad (the forward under torch.no_grad), fwd, fwd+bwd")
    parser.add_argument("--matmul-precision", default=None, choices=("highest", "high", "medium"),
                        help="torch.set_float32_matmul_precision for every variant (float32)")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - {"e3nn", "ours", "fused", "factored", "cueq", "floor"})
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)} (of e3nn, ours, fused, factored, cueq, floor)")
    if args.matmul_precision:
        torch.set_float32_matmul_precision(args.matmul_precision)

    check = _modules(args.irreps, torch.float64, device, False)
    x, y = (torch.randn(300, check["ours"].irreps_in1.dim, dtype=torch.float64, device=device, requires_grad=True)
            for _ in range(2))
    G = torch.randn(300, check["ours"].irreps_out.dim, dtype=torch.float64, device=device)
    errors = []
    for expected, got in zip(*(_outputs_and_gradients(check[name], x, y, G) for name in ("e3nn", "ours"))):
        errors.append(((got - expected).abs().max() / expected.abs().max()).item())
    print(f"# {args.irreps}, {check['ours'].weight_numel} weights; float64 check of the outputs and the gradients "
          f"of both inputs and the weights: relative error {max(errors):.2e}")
    assert max(errors) < 1e-10, "outputs or gradients differ from e3nn's"

    modules = _modules(args.irreps, dtype, device, device.type == "cuda" and "cueq" in variants)
    if args.chunk_mb is not None:
        modules["ours"]._factored_chunk_bytes = int(args.chunk_mb * 2**20)
    if dtype != torch.float64:  # each variant's rounding error against float64, the weights of the check
        modules["ours"].load_state_dict(check["ours"].state_dict())
        modules["e3nn"].load_state_dict(check["e3nn"].state_dict())
        reference = _outputs_and_gradients(check["ours"], x, y, G)
        errors = {}
        for name in ("e3nn", "ours", "fused", "factored"):
            low = [t.detach().to(dtype).requires_grad_() for t in (x, y)]
            got = _outputs_and_gradients(modules[name], low[0], low[1], G.to(dtype))
            errors[name] = max(((a.double() - b).abs().max() / b.abs().max()).item() for a, b in zip(got, reference))
        print(f"# {args.dtype} against float64 (outputs and gradients, largest relative error): "
              + ", ".join(f"{name} {error:.2e}" for name, error in errors.items()))
    dim_in, dim_out = modules["ours"].irreps_in1.dim, modules["ours"].irreps_out.dim
    specs = [spec for spec in modules["ours"]._factored_specs if spec[11] == 0]  # the "uvw" instructions
    modules = {name: module for name, module in modules.items() if name in variants}
    for rows in args.rows:
        x, y = (torch.randn(rows, dim_in, dtype=dtype, device=device, requires_grad=True) for _ in range(2))
        G = torch.randn(rows, dim_out, dtype=dtype, device=device)
        times = {}
        for mode in args.modes.split(","):
            for name, module in modules.items():
                step = _step(module, x, y, G, mode)
                try:
                    ms = statistics.median(measure("call", step, device, repeats=args.repeats, warmup=2))
                    peak = peak_mb(step, device)
                except RuntimeError as error:  # out of memory, a peer's refusal: reported, the others go on
                    print(f"  {rows:>9,} rows {name:>5} {mode:>8}: FAILED ({str(error)[:160]})", flush=True)
                    continue
                times[name, mode] = ms
                print(f"  {rows:>9,} rows {name:>5} {mode:>8}: {ms:10.3f} ms  peak {peak:9.1f} MB", flush=True)
            if "floor" in variants:
                step, macs = _floor_step(specs, rows, dtype, device, mode)
                times["floor", mode] = ms = statistics.median(measure("call", step, device, repeats=args.repeats,
                                                                      warmup=2))
                print(f"  {rows:>9,} rows floor {mode:>8}: {ms:10.3f} ms  ({macs / ms / 1e6:.1f} GMAC/s)", flush=True)
            for name in ("ours", "floor"):
                if ("e3nn", mode) in times and (name, mode) in times:
                    print(f"  {rows:>9,} rows e3nn / {name:<5} {mode:>8}: "
                          f"{times['e3nn', mode] / times[name, mode]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
