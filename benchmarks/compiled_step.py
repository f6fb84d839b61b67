"""What one forward+backward step costs eager, compiled and as CUDA graphs, and what of it is torch's.

    python benchmarks/compiled_step.py [--device cuda] [--empty-kernels]

For each case (real CG rule, ``[A, B, M]`` float32 operands requiring grad, a ``Rule`` as modules hold it, the
step ``out.backward(G)`` with gradients reset to None; see ``sparse_accumulation.bench.timing``) and each mode
(``eager``, ``compiled`` = ``torch.compile(fullgraph=True)`` of the forward, ``reduce-overhead`` on CUDA, inputs
marked static): the time of one step from an idle device (median), the host microseconds per step over steps
back to back, and on CUDA the device kernels of one step (torch.profiler), next to plain torch ``sin(a * b)``
on output-shaped inputs. ``--empty-kernels`` replaces the kernel module's forward and backward by functions
that return uninitialised outputs of the right shapes: what remains is the host cost of the layers around the
kernels (ours and torch's).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation import backends  # noqa: E402
from sparse_accumulation.bench import timing  # noqa: E402
from sparse_accumulation.bench.timing import compile_forward, make_step, compiled_kernels_only  # noqa: E402

CASES = {"cuda": [((8, 8, 8), (1000, 2000)), ((2, 2, 2), (1000, 2000)), ((1, 1, 2), (100, 100))],
         "cpu": [((1, 1, 1), (10, 1)), ((2, 2, 2), (1000, 20))]}


def empty_kernels(device) -> str:
    """Make the kernel module used on ``device`` return uninitialised outputs; returns its name.

    torch.compile's on-disk caches are turned off, since they would hand back graphs compiled earlier with
    the real kernels (the Triton kernels are traced into the graph)."""
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    name = backends.resolve("auto", device)
    module = backends.kernel_module("accumulate", name)

    def forward(X1, X2, W, C, rule, rows, **options):
        return X1.new_empty((*rows.lead, rule.output_size))

    def backward(G, X1, X2, W, C, rule, rows, want_x1=True, want_x2=True, want_w=False, want_c=True, **options):
        grads = [t.new_empty(t.shape) if t is not None and wanted else None
                 for t, wanted in ((X1, want_x1), (X2, want_x2), (W, want_w))]
        return (*grads, C.new_empty(C.shape) if want_c else None)

    module.accumulate, module.accumulate_backward = forward, backward
    return name


def kernels_of_a_step(step, steps=5) -> list:
    """``(name, launches per step, device us per step)`` of the CUDA kernels that ``step`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [(event.key, event.count // steps, event.self_device_time_total / steps)
               for event in profiler.key_averages() if event.self_device_time_total > 0]
    return sorted(kernels, key=lambda kernel: -kernel[2])


def measure(step, device, repeats: int) -> tuple:
    """``(median ms of one step from an idle device, median host us per step back to back)``, with
    :func:`sparse_accumulation.bench.timing.measure` as ``bench`` takes its ``call`` and ``host`` timings."""
    return tuple(statistics.median(timing.measure(name, step, device, repeats=repeats, warmup=10))
                 for name in ("call", "host"))


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--empty-kernels", action="store_true")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    kernels = empty_kernels(device) if args.empty_kernels else backends.resolve("auto", device)
    print(f"# torch {torch.__version__}, {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", kernels {kernels}" + (" replaced by empty outputs" if args.empty_kernels else ""))
    modes = ("eager", "compiled") + (("reduce-overhead",) if device.type == "cuda" else ())
    print(f"{'case':>18} {'function':>12} {'mode':>16} {'step ms':>8} {'host us':>8}")
    for (l1, l2, L), rows in CASES[device.type]:
        m1, m2, mu, C = sa.get_cg_transformation_rule(l1, l2, L, dtype=torch.float32, device=device)
        rule = sa.Rule(m1, m2, mu, 2 * L + 1, input_sizes=(2 * l1 + 1, 2 * l2 + 1))
        G = torch.randn(*rows, 2 * L + 1, device=device)
        functions = {"ours": (lambda a, b, c: sa.accumulate_rule(a, b, rule, c), 2 * l1 + 1, 2 * l2 + 1),
                     "sin(a * b)": (lambda a, b, c: torch.sin(a * b), 2 * L + 1, 2 * L + 1)}
        for name, (function, M1, M2) in functions.items():
            X1, X2 = torch.randn(*rows, M1, device=device), torch.randn(*rows, M2, device=device)
            for mode in modes:
                forward, before = (function, None) if mode == "eager" else compile_forward(function, mode)
                step = make_step(forward, "backward", X1, X2, C, G, requires_grad=True, before=before,
                                 static=mode == "reduce-overhead")
                call, host = measure(step, device, args.repeats)
                print(f"{f'{l1}x{l2}->{L} {rows[0]}x{rows[1]}':>18} {name:>12} {mode:>16} {call:8.3f} {host:8.1f}")
                if device.type == "cuda":
                    for kernel, launches, us in kernels_of_a_step(step):
                        print(f"{'':>20} {us:8.1f} us x{launches} {kernel[:80]}")


if __name__ == "__main__":
    main()
