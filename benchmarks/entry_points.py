"""One training step through each public entry point, eager, compiled and as CUDA graphs.

    python benchmarks/entry_points.py [--device cuda] [--repeats 30] [--entries accumulate_rule,accumulate]

A step as a model runs it: the operands are activations made inside the step from parameters (``X = 2 * P``),
the entry point's output enters a loss ``sum(out * G)``, and the loss's backward fills the parameters'
gradients. The whole forward (activations, the entry point, the loss) is what ``torch.compile(fullgraph=True)``
compiles (``default``), or captures as CUDA graphs (``reduce-overhead``, CUDA only); index tensors are module
buffers. Entry points: ``accumulate`` (index tensors), ``accumulate_rule`` (a ``Rule``), ``CGCalculatorSingle``;
beside them ``sin(a * b)`` on the output's shape, the floor of torch's own cost per step. Reported: the median
time of one step from an idle device (CUDA events), host microseconds per step (steps issued back to back),
and the ratios to the same entry point's eager step and to the ``accumulate_rule`` step in the same mode.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.bench import timing  # noqa: E402

CASES = {"cuda": [((8, 8, 8), (1000, 2000)), ((2, 2, 2), (1000, 2000)), ((1, 1, 1), (100, 100))],
         "cpu": [((2, 2, 2), (100, 20)), ((1, 1, 1), (10, 10))]}
MODES = {"cuda": ("eager", "default", "reduce-overhead"), "cpu": ("eager", "default")}


ENTRIES = ("accumulate_rule", "accumulate", "CGCalculatorSingle", "sin(a * b)")


class Step(torch.nn.Module):
    """``sum(entry(2 * P1, 2 * P2) * G)`` with the entry point's indices held as buffers or a Rule."""

    def __init__(self, entry: str, l1: int, l2: int, L: int, rows: tuple, device):
        super().__init__()
        m1, m2, mu, C = sa.get_cg_transformation_rule(l1, l2, L, dtype=torch.float32, device=device)
        for name, t in (("m1", m1), ("m2", m2), ("mu", mu), ("C", C)):
            self.register_buffer(name, t)
        self.entry, self.L = entry, L
        self.rule = sa.Rule(m1, m2, mu, 2 * L + 1, input_sizes=(2 * l1 + 1, 2 * l2 + 1))
        self.path = sa.CGCalculatorSingle(l1, l2, L).to(device)
        M1, M2 = (2 * L + 1, 2 * L + 1) if entry == "sin(a * b)" else (2 * l1 + 1, 2 * l2 + 1)
        self.P1 = torch.nn.Parameter(torch.randn(*rows, M1, device=device))
        self.P2 = torch.nn.Parameter(torch.randn(*rows, M2, device=device))
        self.register_buffer("G", torch.randn(*rows, 2 * L + 1, device=device))

    def forward(self):
        X1, X2 = 2 * self.P1, 2 * self.P2
        if self.entry == "accumulate":
            out = sa.accumulate(X1, X2, self.mu, 2 * self.L + 1, self.m1, self.m2, self.C)
        elif self.entry == "accumulate_rule":
            out = sa.accumulate_rule(X1, X2, self.rule, self.C)
        elif self.entry == "CGCalculatorSingle":
            out = self.path(X1, X2)
        else:
            out = torch.sin(X1 * X2)
        return (out * self.G).sum()


def make_step(module: Step, mode: str):
    """A training step (forward, backward, gradients reset) of ``module`` run as ``mode``."""
    forward = module if mode == "eager" else torch.compile(
        module, fullgraph=True, **({"mode": mode} if mode == "reduce-overhead" else {}))
    params = list(module.parameters())

    def step():
        for p in params:
            p.grad = None
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        forward().backward()

    return step


def main(argv=None):
    timing.compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--entries", default=",".join(ENTRIES), help="comma-separated entry points")
    args = parser.parse_args(argv)
    entries = args.entries.split(",")
    unknown = sorted(set(entries) - set(ENTRIES))
    if unknown:
        parser.error(f"unknown entry points {unknown}; choose from {', '.join(ENTRIES)}")
    device = torch.device(args.device)
    print(f"# torch {torch.__version__}, {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"{'case':>18} {'entry point':>19} {'mode':>16} {'step ms':>8} {'host us':>8} {'vs eager':>8} "
          f"{'vs rule':>8}")
    for (l1, l2, L), rows in CASES[device.type]:
        rule_ms = {}
        for entry in [e for e in ENTRIES if e in entries]:
            eager_ms = None
            for mode in MODES[device.type]:
                torch.compiler.reset()
                module = Step(entry, l1, l2, L, rows, device)
                try:
                    step = make_step(module, mode)
                    ms, host = (statistics.median(timing.measure(name, step, device, repeats=args.repeats,
                                                                  warmup=5)) for name in ("call", "host"))
                except Exception as error:  # a mode that fails is reported, not fatal
                    print(f"{f'{l1}x{l2}->{L} {rows[0]}x{rows[1]}':>18} {entry:>19} {mode:>16} failed: "
                          f"{type(error).__name__}: {str(error).splitlines()[0][:120]}")
                    continue
                eager_ms = ms if mode == "eager" else eager_ms
                if entry == "accumulate_rule":
                    rule_ms[mode] = ms
                ratio = f"{ms / eager_ms:7.2f}x" if eager_ms else ""
                vs_rule = f"{ms / rule_ms[mode]:7.2f}x" if mode in rule_ms else ""
                print(f"{f'{l1}x{l2}->{L} {rows[0]}x{rows[1]}':>18} {entry:>19} {mode:>16} {ms:8.3f} "
                      f"{host:8.1f} {ratio:>8} {vs_rule:>8}")


if __name__ == "__main__":
    main()
