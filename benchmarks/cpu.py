"""CPU benchmark of the numba kernels against torch index_add and the peer library's recorded figures.

Real CG rules l x l -> l for l = 1..8 (plus 3x2->4 and 1x1->2), [A, B, M] layout, A x B rows. Every result is
checked against the float64 reference before it is timed. Prints medians, ratios and a roofline: the bytes the
kernels must move (inputs read, outputs written, once) per second against the copy bandwidth measured in the
same run, and the multiply-adds (3 flops per nonzero and row, 3 passes for forward+backward) per second.
``--json`` writes them.

    python benchmarks/cpu.py --rows 1000 200 --json benchmarks/cpu.json
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch

import sparse_accumulation as sa

# lab-cosmo/sparse_accumulation C++/OpenMP built with -O3 -fopenmp, on this kind of 2-core machine, rows
# 1000 x 200, fp32: its fastest figures in one process with ours (DESIGN.md).
PEER_MS = {(8, 8, 8): {"forward": 81.0, "forward+backward": 135.0},
           (2, 2, 2): {"forward": 3.5, "forward+backward": 7.4}}


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second of a large copy (read + write) between two buffers touched beforehand."""
    source = np.ones(megabytes << 18, dtype=np.float32)
    target = np.zeros_like(source)
    seconds = min(_seconds(lambda: np.copyto(target, source)) for _ in range(repeats))
    return 2 * source.nbytes / seconds


def _seconds(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def median_ms(function, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def check(implementation, X1, X2, rule, size, rows: int = 2000) -> float:
    """Relative error of forward and all gradients on the first rows, against float64 index_add."""
    m1, m2, mu, C = rule
    errors = []
    inputs = [t[:rows].detach().clone().requires_grad_() for t in (X1, X2)] + [C.detach().clone().requires_grad_()]
    exact = [t.detach().double().requires_grad_() for t in inputs]
    got = sa.accumulate(inputs[0], inputs[1], mu, size, m1, m2, inputs[2], implementation=implementation)
    ref = sa.reference.index_add(exact[0], exact[1], mu, size, m1, m2, exact[2])
    G = torch.randn_like(ref)
    pairs = zip((got,) + torch.autograd.grad(got, inputs, G.to(got.dtype)), (ref,) + torch.autograd.grad(ref, exact, G))
    for a, b in pairs:
        errors.append(((a.double() - b).abs().max() / b.abs().max()).item())
    return max(errors)


def _parse_rule(text: str) -> tuple:
    """``"2x2->2"`` as ``(2, 2, 2)``."""
    try:
        l1, rest = text.split("x", 1)
        l2, L = rest.split("->")
        return int(l1), int(l2), int(L)
    except ValueError:
        raise SystemExit(f"--rules: {text!r} is not of the form L1xL2->L (e.g. 2x2->2)") from None


def run_case(l1, l2, L, rows, dtype, repeats, implementations):
    rule = sa.get_cg_transformation_rule(l1, l2, L, dtype=dtype)
    m1, m2, mu, C = rule
    M1, M2, O = 2 * l1 + 1, 2 * l2 + 1, 2 * L + 1
    X1 = torch.randn(*rows, M1, dtype=dtype, requires_grad=True)
    X2 = torch.randn(*rows, M2, dtype=dtype, requires_grad=True)
    G = torch.randn(*rows, O, dtype=dtype)
    result = {"rule": f"{l1}x{l2}->{L}", "nnz": int(C.shape[0]), "rows": list(rows), "dtype": str(dtype)}
    for implementation in implementations:
        error = check(implementation, X1, X2, rule, O)
        if not error < (1e-5 if dtype == torch.float32 else 1e-12):
            raise RuntimeError(f"{implementation} is wrong on {result['rule']}: relative error {error:.2e}")

        def forward():
            with torch.no_grad():
                return sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation=implementation)

        def forward_backward():
            out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation=implementation)
            return torch.autograd.grad(out, (X1, X2), G)

        count = repeats if implementation == "numba" else max(3, repeats // 4)
        result[implementation] = {"forward": median_ms(forward, count),
                                  "forward+backward": median_ms(forward_backward, count), "max_rel_error": error}
    n, size = X1[..., 0].numel(), X1.element_size()
    # forward: X1, X2 read, out written; backward: G, X1, X2 read, dX1, dX2 written
    result["bytes"] = {"forward": n * (M1 + M2 + O) * size,
                       "forward+backward": n * (M1 + M2 + O) * size + n * (O + 2 * M1 + 2 * M2) * size}
    result["flops"] = {"forward": 3 * n * int(C.shape[0]), "forward+backward": 9 * n * int(C.shape[0])}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs=2, default=[1000, 200], metavar=("A", "B"))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rules", nargs="+", metavar="L1xL2->L",
                        help="only these cases (default: l x l -> l for l = 1..8, 3x2->4 and 1x1->2)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    cases = [(l, l, l) for l in range(1, 9)] + [(3, 2, 4), (1, 1, 2)]
    if args.rules:
        cases = [_parse_rule(text) for text in args.rules]
    results = [run_case(*case, args.rows, dtype, args.repeats, ["numba", "index_add"]) for case in cases]
    bandwidth = copy_bandwidth()
    header = (f"{'rule':>8} {'nnz':>4} | {'numba fwd':>9} {'fwd+bwd':>8} | {'index_add fwd':>13} {'fwd+bwd':>8} "
              f"| {'x fwd':>6} {'x f+b':>6} | {'x peer fwd':>10} {'x peer f+b':>10} "
              f"| {'GB/s fwd':>8} {'f+b':>5} | {'GFLOP/s fwd':>11} {'f+b':>5}")
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, rows {args.rows}, {args.dtype}, medians in ms; "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(header)
    for r in results:
        ours, ref = r["numba"], r["index_add"]
        peer = PEER_MS.get(tuple(int(x) for x in r["rule"].replace("->", "x").split("x")), {})
        peer_ratio = [f"{peer[mode] / ours[mode]:10.1f}" if mode in peer else f"{'-':>10}"
                      for mode in ("forward", "forward+backward")]
        rates = [r[kind][mode] / ours[mode] / 1e6 for kind in ("bytes", "flops")
                 for mode in ("forward", "forward+backward")]
        print(f"{r['rule']:>8} {r['nnz']:>4} | {ours['forward']:9.2f} {ours['forward+backward']:8.2f} | "
              f"{ref['forward']:13.2f} {ref['forward+backward']:8.2f} | "
              f"{ref['forward'] / ours['forward']:6.1f} {ref['forward+backward'] / ours['forward+backward']:6.1f} | "
              f"{peer_ratio[0]} {peer_ratio[1]} | {rates[0]:8.1f} {rates[1]:5.1f} | {rates[2]:11.1f} {rates[3]:5.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": args.rows, "dtype": args.dtype,
                       "copy_bandwidth_Bps": bandwidth, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
