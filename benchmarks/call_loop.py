"""Host time and single-call time of the public call in a plain loop, against a torch elementwise floor.

For each case (real CG rule, ``[A, B, M]`` float32 operands requiring grad, a ``Rule`` as modules hold it):
host microseconds per call over back-to-back calls (not synchronised), and the time of one call between CUDA
events after a synchronisation, for the forward (inputs requiring grad, and under ``torch.no_grad``) and the
forward+backward (``out.backward(G)``, gradients reset to None), next to ``sin(a * b)`` on output-shaped
inputs. With ``--profile`` it also prints cProfile's top functions of the forward+backward of the first case.

    python benchmarks/call_loop.py [--device cuda] [--profile]
"""
import argparse
import cProfile
import pstats
import statistics
import time

import torch

import sparse_accumulation as sa
from sparse_accumulation.bench.timing import elapsed_ms, synchronize, compiled_kernels_only

CASES = [((1, 1, 2), (100, 100)), ((2, 2, 2), (1000, 2000)), ((8, 8, 8), (1000, 2000))]


def host_us(step, device, calls):
    """Median over 5 batches of host microseconds per call, ``calls`` calls back to back."""
    for _ in range(100):
        step()
    samples = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            step()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    synchronize(device)
    return statistics.median(samples)


def call_ms(step, device, repeats=50):
    """Median milliseconds of one call from an idle device to its work's end."""
    for _ in range(10):
        step()
    return statistics.median(elapsed_ms(step, device) for _ in range(repeats))


def steps(l1, l2, L, rows, device):
    """``{name: step}`` of one case: ours and the elementwise floor, forward and forward+backward."""
    m1, m2, mu, C = sa.get_cg_transformation_rule(l1, l2, L, dtype=torch.float32, device=device)
    rule = sa.Rule(m1, m2, mu, 2 * L + 1, input_sizes=(2 * l1 + 1, 2 * l2 + 1))
    X1 = torch.randn(*rows, 2 * l1 + 1, device=device, requires_grad=True)
    X2 = torch.randn(*rows, 2 * l2 + 1, device=device, requires_grad=True)
    E1, E2 = (torch.randn(*rows, 2 * L + 1, device=device, requires_grad=True) for _ in range(2))
    G = torch.randn(*rows, 2 * L + 1, device=device)

    def forward_no_grad():
        with torch.no_grad():
            return sa.accumulate_rule(X1, X2, rule, C)

    def forward_backward():
        X1.grad = X2.grad = None
        sa.accumulate_rule(X1, X2, rule, C).backward(G)

    def floor_forward_backward():
        E1.grad = E2.grad = None
        torch.sin(E1 * E2).backward(G)

    return {"fwd": lambda: sa.accumulate_rule(X1, X2, rule, C), "fwd no_grad": forward_no_grad,
            "fwd+bwd": forward_backward, "elementwise fwd": lambda: torch.sin(E1 * E2),
            "elementwise fwd+bwd": floor_forward_backward}


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"# torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"{'case':>18} {'step':>20} {'host us':>9} {'call ms':>9}")
    for (l1, l2, L), rows in CASES:
        case = f"{l1}x{l2}->{L} {rows[0]}x{rows[1]}"
        for name, step in steps(l1, l2, L, rows, device).items():
            calls = 2000 if rows[0] * rows[1] <= 10_000 else 500
            print(f"{case:>18} {name:>20} {host_us(step, device, calls):9.1f} {call_ms(step, device):9.4f}")
    if args.profile:
        (l1, l2, L), rows = CASES[0]
        step = steps(l1, l2, L, rows, device)["fwd+bwd"]
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(3000):
            step()
        profile.disable()
        synchronize(device)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
