"""Where forward+backward time goes on the GPU: each Triton kernel alone, and the host cost of one call.

    python benchmarks/gpu_breakdown.py

For real CG rules at 1000 x 2000 rows fp32 it prints the median device time (triton.testing.do_bench) of
the forward kernel, the fused input-gradient kernel (both load strategies), the two swapped-rule forwards
it replaces, and the dC kernel; then the host time per call (no synchronization, 1000 rows) of the raw
kernel, the registered op, and the public API with autograd.
"""
from __future__ import annotations

import time

import torch
import triton.testing

import sparse_accumulation as sa
from sparse_accumulation.kernels import triton_gpu
from sparse_accumulation.rules import prepare_rule


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


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host-only", action="store_true", help="skip the device timings")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for l in () if args.host_only else (8, 4, 2):
        m1, m2, mu, C = (t.cuda() for t in sa.get_cg_transformation_rule(l, l, l))
        M = 2 * l + 1
        rule = prepare_rule(m1, m2, mu, M, M, M)
        X1, X2, G = (torch.randn(2_000_000, M, device="cuda") for _ in range(3))
        row = {
            "fwd tile": lambda: triton_gpu.accumulate(X1, X2, C, rule, M, strategy="tile"),
            "grads tile": lambda: triton_gpu.accumulate_input_gradients(G, X1, X2, C, rule, strategy="tile"),
            "grads columns": lambda: triton_gpu.accumulate_input_gradients(G, X1, X2, C, rule,
                                                                           strategy="columns"),
            "2 swapped fwd": lambda: (triton_gpu.accumulate(G, X2, C, rule.swapped("X1"), M),
                                      triton_gpu.accumulate(X1, G, C, rule.swapped("X2"), M)),
            "dC": lambda: triton_gpu.accumulate_dC(G, X1, X2, rule),
        }
        print(f"{l}x{l}->{l} device ms: " + ", ".join(f"{k} {device_ms(f):.3f}" for k, f in row.items()))

    m1, m2, mu, C = (t.cuda() for t in sa.get_cg_transformation_rule(2, 2, 2))
    rule = prepare_rule(m1, m2, mu, 5, 5, 5)
    X1, X2, G = (torch.randn(1000, 5, device="cuda") for _ in range(3))
    A = X1.clone().requires_grad_()

    def public_fwd_bwd():
        return torch.autograd.grad(sa.accumulate(A, X2, mu, 5, m1, m2, C), A, G)

    B = X2.clone().requires_grad_()

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
        "torch index_add fwd": lambda: sa.reference.index_add(X1, X2, mu, 5, m1, m2, C),
    }
    print("host us per call (1000 rows): " + ", ".join(f"{k} {host_us(f):.0f}" for k, f in calls.items()))


if __name__ == "__main__":
    main()
