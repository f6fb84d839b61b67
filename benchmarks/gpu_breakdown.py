"""Where forward+backward time goes on the GPU: each Triton kernel alone, and the host cost of one call.

    python benchmarks/gpu_breakdown.py [--ls 8,4,2] [--grad-ls 8,4,2] [--strategies auto,tile,pieces+tile]

For real CG rules l x l -> l at 1000 x 2000 rows fp32 it prints the median device time
(triton.testing.do_bench) of the forward kernel for each load/store strategy (``loads+stores``, see
``triton_gpu``) with the configuration autotuning chose; for l in ``--grad-ls`` also the fused input-gradient
kernel, the two swapped-rule forwards it may be replaced by, the dC kernel, and the public forward+backward.
Then the host time per call (no synchronization, 1000 rows) of the raw kernels, the registered ops, the
public API with autograd (the eager path), the registered op with autograd, and plain torch.
``--device cpu --rows 64`` with ``TRITON_INTERPRET=1`` runs the same code under Triton's interpreter (a check
of the script, not a measurement).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.kernels.triton import accumulate as triton_accumulate  # noqa: E402
from sparse_accumulation.kernels.layout import plan  # noqa: E402


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def device_ms(function, device) -> float:
    if device.type == "cuda":
        return triton.testing.do_bench(function, warmup=25, rep=100, return_mode="median")
    start = time.perf_counter()
    function()
    return (time.perf_counter() - start) * 1e3


def host_us(function, device, calls: int = 300) -> float:
    for _ in range(30):
        function()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        function()
    elapsed = time.perf_counter() - start
    synchronize(device)
    return elapsed / calls * 1e6


def best_config(kind, rule, operands, rows, widths, strategy, wanted=()):
    folded = rows.operands if kind == "fwd" else ((rows.A, rows.B, widths[0] if rows.A != 1 else 0, 0),) + rows.operands
    kernel = triton_accumulate._row_call(kind, rule, operands, folded, rows, widths, strategy, wanted)[0]
    config = getattr(kernel, "best_config", None)
    return "?" if config is None else f"{config.kwargs.get('BLOCK_R')}/{config.num_warps}w"


def kernel_times(ls, grad_ls, strategies, rows_count, device):
    for l in sorted(set(ls) | set(grad_ls), reverse=True):
        m1, m2, mu, C = sa.get_cg_transformation_rule(l, l, l, device=device)
        M = 2 * l + 1
        rule = sa.Rule(m1, m2, mu, M, input_sizes=(M, M))
        X1, X2, G = (torch.randn(rows_count, M, device=device) for _ in range(3))
        rows = plan((X1, X2), ("X1", "X2"))[1]
        floor = 3 * rows_count * M * 4 / 1e9  # ms at 1 TB/s
        parts = []
        for s in strategies if l in ls else ():
            ms = device_ms(lambda: triton_accumulate.accumulate(X1, X2, None, C, rule, rows, strategy=s), device)
            parts.append(f"fwd {s} {ms:.3f} ({best_config('fwd', rule, [X1, X2], rows, (M,), s)})")
        for s in strategies if l in grad_ls else ():
            ms = device_ms(lambda: triton_accumulate.accumulate_input_gradients(G, X1, X2, None, C, rule, rows, strategy=s),
                           device)
            config = best_config('grad', rule, [G, X1, X2], rows, (M, M), s, ((0, False), (1, False)))
            parts.append(f"grads {s} {ms:.3f} ({config})")
            swapped = (plan((G, X2), ("G", "X2"))[1], plan((X1, G), ("X1", "G"))[1])
            ms = device_ms(lambda: (
                triton_accumulate.accumulate(G, X2, None, C, rule.swapped("X1"), swapped[0], strategy=s),
                triton_accumulate.accumulate(X1, G, None, C, rule.swapped("X2"), swapped[1], strategy=s)), device)
            parts.append(f"2 swapped fwd {s} {ms:.3f}")
        if l in grad_ls:
            ms = device_ms(lambda: triton_accumulate.accumulate_dC(G, X1, X2, None, rule, rows), device)
            parts.append(f"dC {ms:.3f}")
            A, B = X1.clone().requires_grad_(), X2.clone().requires_grad_()
            ms = device_ms(lambda: torch.autograd.grad(sa.accumulate_rule(A, B, rule, C), (A, B), G), device)
            parts.append(f"public fwd+bwd {ms:.3f}")
            del A, B
        print(f"{l}x{l}->{l} (fwd bytes {floor:.3f} GB) device ms: " + ", ".join(parts), flush=True)
        del X1, X2, G
        if device.type == "cuda":
            torch.cuda.empty_cache()


def host_times(device):
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 2, 2, device=device)
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(5, 5))
    X1, X2, G = (torch.randn(1000, 5, device=device) for _ in range(3))
    rows = plan((X1, X2), ("X1", "X2"))[1]
    A = X1.clone().requires_grad_()
    B = X2.clone().requires_grad_()

    def public_fwd_bwd():
        return torch.autograd.grad(sa.accumulate_rule(A, X2, rule, C), A, G)

    def registered_op_fwd_bwd():
        out = torch.ops.sparse_accumulation.accumulate(A, X2, None, C, rule.key, "triton")
        return torch.autograd.grad(out, A, G)

    def plain_torch_fwd_bwd():
        return torch.autograd.grad((A * B).sin(), (A, B), G)

    calls = {
        "raw kernel": lambda: triton_accumulate.accumulate(X1, X2, None, C, rule, rows),
        "raw backward": lambda: triton_accumulate.accumulate_backward(G, X1, X2, None, C, rule, rows, True, True, False,
                                                               False),
        "backward op": lambda: torch.ops.sparse_accumulation.accumulate_backward(
            G, X1, X2, None, C, rule.key, "triton", True, True, False, False),
        "plain torch fwd+bwd": plain_torch_fwd_bwd,
        "registered op": lambda: torch.ops.sparse_accumulation.accumulate(X1, X2, None, C, rule.key, "triton"),
        "public accumulate_rule": lambda: sa.accumulate_rule(X1, X2, rule, C),
        "public fwd+bwd": public_fwd_bwd,
        "registered op fwd+bwd": registered_op_fwd_bwd,
        "torch index_add fwd": lambda: sa.reference.index_add(X1, X2, mu, 5, m1, m2, C),
    }
    print("host us per call (1000 rows): " + ", ".join(f"{k} {host_us(f, device):.0f}" for k, f in calls.items()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ls", default="8,4,2", help="l of the forward timings (comma-separated)")
    parser.add_argument("--grad-ls", default="8,4,2", help="l of the gradient timings (comma-separated)")
    parser.add_argument("--strategies", default=",".join(triton_accumulate.STRATEGIES),
                        help="load/store strategies, 'name' or 'loads+stores' (comma-separated)")
    parser.add_argument("--host-only", action="store_true", help="skip the device timings")
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the device timings")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)"
    print(name, torch.__version__, triton.__version__, flush=True)
    if not args.host_only:
        ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
        kernel_times(ints(args.ls), ints(args.grad_ls), args.strategies.split(","), args.rows, device)
    host_times(device)


if __name__ == "__main__":
    main()
