"""Where forward+backward time goes on the GPU: each Triton kernel alone, and the host cost of one call.

    python benchmarks/gpu_breakdown.py [--ls 8,4,2] [--grad-ls 8,4,2] [--strategies auto,tile,pieces+tile]

For real CG rules l x l -> l at 1000 x 2000 rows fp32 it prints the median device time
(triton.testing.do_bench) of the forward kernel for each load/store strategy (``loads+stores``, see
``triton_gpu``) with the configuration autotuning chose; for l in ``--grad-ls`` also the fused input-gradient
kernel, the two swapped-rule forwards it may be replaced by, the dC kernel, and the public forward+backward.
Then the host time per call (no synchronization, 1000 rows) of the raw kernels, the registered ops, the
public API with autograd (the eager path), the registered op with autograd, and plain torch.
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
from sparse_accumulation.kernels import triton_gpu  # noqa: E402
from sparse_accumulation.rules import prepare_rule  # noqa: E402

ROWS = 2_000_000


def device_ms(function) -> float:
    return triton.testing.do_bench(function, warmup=25, rep=100, return_mode="median")


def host_us(function, calls: int = 300) -> float:
    for _ in range(30):
        function()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def best_config(kind, rule, strategy):
    kernel = triton_gpu._row_kernel(kind, rule, strategy, "tl.float32")
    config = getattr(kernel, "best_config", None)
    return "?" if config is None else f"{config.kwargs.get('BLOCK_R')}/{config.num_warps}w"


def kernel_times(ls, grad_ls, strategies):
    for l in sorted(set(ls) | set(grad_ls), reverse=True):
        m1, m2, mu, C = (t.cuda() for t in sa.get_cg_transformation_rule(l, l, l))
        M = 2 * l + 1
        rule = prepare_rule(m1, m2, mu, M, M, M)
        X1, X2, G = (torch.randn(ROWS, M, device="cuda") for _ in range(3))
        floor = 3 * ROWS * M * 4 / 1e9  # ms at 1 TB/s
        parts = []
        for s in strategies if l in ls else ():
            ms = device_ms(lambda: triton_gpu.accumulate(X1, X2, C, rule, M, strategy=s))
            parts.append(f"fwd {s} {ms:.3f} ({best_config('fwd', rule, s)})")
        for s in strategies if l in grad_ls else ():
            ms = device_ms(lambda: triton_gpu.accumulate_input_gradients(G, X1, X2, C, rule, strategy=s))
            parts.append(f"grads {s} {ms:.3f} ({best_config('grad', rule, s)})")
            ms = device_ms(lambda: (triton_gpu.accumulate(G, X2, C, rule.swapped("X1"), M, strategy=s),
                                    triton_gpu.accumulate(X1, G, C, rule.swapped("X2"), M, strategy=s)))
            parts.append(f"2 swapped fwd {s} {ms:.3f}")
        if l in grad_ls:
            parts.append(f"dC {device_ms(lambda: triton_gpu.accumulate_dC(G, X1, X2, rule)):.3f}")
            A, B = X1.clone().requires_grad_(), X2.clone().requires_grad_()
            ms = device_ms(lambda: torch.autograd.grad(sa.accumulate(A, B, mu, M, m1, m2, C), (A, B), G))
            parts.append(f"public fwd+bwd {ms:.3f}")
            del A, B
        print(f"{l}x{l}->{l} (fwd bytes {floor:.3f} GB) device ms: " + ", ".join(parts), flush=True)
        del X1, X2, G
        torch.cuda.empty_cache()


def host_times():
    m1, m2, mu, C = (t.cuda() for t in sa.get_cg_transformation_rule(2, 2, 2))
    rule = prepare_rule(m1, m2, mu, 5, 5, 5)
    X1, X2, G = (torch.randn(1000, 5, device="cuda") for _ in range(3))
    A = X1.clone().requires_grad_()
    B = X2.clone().requires_grad_()

    def public_fwd_bwd():
        return torch.autograd.grad(sa.accumulate(A, X2, mu, 5, m1, m2, C), A, G)

    def registered_op_fwd_bwd():
        out = torch.ops.sparse_accumulation.accumulate(A, X2, C, m1, m2, mu, 5, "triton")
        return torch.autograd.grad(out, A, G)

    def plain_torch_fwd_bwd():
        return torch.autograd.grad((A * B).sin(), (A, B), G)

    calls = {
        "raw kernel": lambda: triton_gpu.accumulate(X1, X2, C, rule, 5),
        "raw backward": lambda: triton_gpu.accumulate_backward(G, X1, X2, C, rule, True, True, False),
        "backward op": lambda: torch.ops.sparse_accumulation.accumulate_backward(G, X1, X2, C, m1, m2, mu, "triton",
                                                                                True, True, False),
        "plain torch fwd+bwd": plain_torch_fwd_bwd,
        "registered op": lambda: torch.ops.sparse_accumulation.accumulate(X1, X2, C, m1, m2, mu, 5, "triton"),
        "public accumulate": lambda: sa.accumulate(X1, X2, mu, 5, m1, m2, C),
        "public fwd+bwd": public_fwd_bwd,
        "registered op fwd+bwd": registered_op_fwd_bwd,
        "torch index_add fwd": lambda: sa.reference.index_add(X1, X2, mu, 5, m1, m2, C),
    }
    print("host us per call (1000 rows): " + ", ".join(f"{k} {host_us(f):.0f}" for k, f in calls.items()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ls", default="8,4,2", help="l of the forward timings (comma-separated)")
    parser.add_argument("--grad-ls", default="8,4,2", help="l of the gradient timings (comma-separated)")
    parser.add_argument("--strategies", default=",".join(triton_gpu.STRATEGIES),
                        help="load/store strategies, 'name' or 'loads+stores' (comma-separated)")
    parser.add_argument("--host-only", action="store_true", help="skip the device timings")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    if not args.host_only:
        ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
        kernel_times(ints(args.ls), ints(args.grad_ls), args.strategies.split(","))
    host_times()


if __name__ == "__main__":
    main()
