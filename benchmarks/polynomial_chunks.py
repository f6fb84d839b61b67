"""Sweep of the Triton polynomial kernels' chunk limits on MACE's symmetric contraction (CUDA).

    python benchmarks/polynomial_chunks.py --limits 128/96 192/128 256/160 --nodes 50000 100000
    python benchmarks/polynomial_chunks.py --limits 256/160 --element-rows 16 128 --nodes 1000 10000

The configuration of ``symmetric_contraction.py`` (``128x0e+128x1o+128x2e+128x3o -> 128x0e+128x1o``,
correlation 3, 10 elements, float32). Each setting is ``terms/held``: the most terms per chunk
(``polynomial_source.MAX_TERMS``) and float32 registers a chunk holds (``polynomial_source.MAX_HELD``), crossed
with the element outputs' tile rows (``polynomial.ELEMENT_TILE_ROWS``). Per setting: the seconds of its first
call (the first size and mode, its chunks compiling in parallel), then per size and mode the median ms of single
calls, the peak MB of one call, and the largest difference from the first setting's results (relative to their
largest value).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from convolution import peak_mb  # noqa: E402
from symmetric_contraction import IRREPS_IN, IRREPS_OUT, make_step  # noqa: E402
from sparse_accumulation.bench.timing import compiled_kernels_only, elapsed_ms  # noqa: E402
from sparse_accumulation.kernels.triton import polynomial, polynomial_source  # noqa: E402
from sparse_accumulation.mace import SymmetricContraction  # noqa: E402


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limits", nargs="+", default=["256/160"], help="terms/held per chunk")
    parser.add_argument("--element-rows", type=int, nargs="+", default=[polynomial.ELEMENT_TILE_ROWS])
    parser.add_argument("--nodes", type=float, nargs="+", default=[50_000, 100_000])
    parser.add_argument("--modes", default="fwd,fwd+bwd", help="comma-separated, from fwd, fwd+bwd, double")
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("polynomial_chunks.py measures the Triton kernels: it needs CUDA")
    device = torch.device("cuda")
    c = 128
    torch.manual_seed(0)
    weights = SymmetricContraction(IRREPS_IN.format(c=c), IRREPS_OUT.format(c=c), 3, num_elements=10).state_dict()
    inputs = {}
    for n in (int(n) for n in args.nodes):
        generator = torch.Generator().manual_seed(n)
        elements = torch.randint(0, 10, (n,), generator=generator)
        inputs[n] = [t.to(device) for t in (torch.randn(n, c, 16, generator=generator),
                                            torch.nn.functional.one_hot(elements, 10).float(),
                                            torch.randn(n, 4 * c, generator=generator),
                                            torch.randn(n, c, 16, generator=generator))]
    first = {}
    print(f"# {torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    for limits in args.limits:
        terms, held = (int(v) for v in limits.split("/"))
        for rows in args.element_rows:
            polynomial_source.MAX_TERMS, polynomial_source.MAX_HELD = terms, held
            polynomial.ELEMENT_TILE_ROWS = rows
            module = SymmetricContraction(IRREPS_IN.format(c=c), IRREPS_OUT.format(c=c), 3, num_elements=10)
            module.load_state_dict(weights)
            module.to(device)
            started, cells = time.perf_counter(), []
            for n, (x, y, G, H) in inputs.items():
                for mode in args.modes.split(","):
                    step = make_step(lambda x: module(x, y), mode, x, G, H, module.parameters())
                    result = step().detach().clone()
                    if not cells:
                        compile_s = time.perf_counter() - started
                    reference = first.setdefault((n, mode), result)
                    error = ((result - reference).abs().max() / reference.abs().max()).item()
                    ms = statistics.median(elapsed_ms(step, device) for _ in range(args.repeats))
                    cells.append(f"{n:,} {mode} {ms:.3f} ms ({peak_mb(step, device):.0f} MB, {error:.0e})")
            print(f"{terms}/{held}, element rows {rows}: first call {compile_s:.1f} s | " + " | ".join(cells),
                  flush=True)


if __name__ == "__main__":
    main()
