"""Launch configurations of the generated kernels: what autotuning chooses from, and the fixed dC setup.

Row kernels (forward and fused input gradients) autotune on CUDA over at most four ``(BLOCK_R, num_warps)``
pairs chosen from a per-row register estimate, times the two store strategies of the ``"auto"`` strategy;
environment ``SPARSE_ACCUMULATION_TRITON_AUTOTUNE=0`` keeps only the first pair with "pieces" stores (a
heuristic choice, no tuning runs). Results never depend on the configuration: the order of arithmetic is
fixed by the generated source.

The dC kernel is not autotuned, so its summation order never depends on a tuning outcome.
"""
from __future__ import annotations

import os

from .codegen import next_pow2

AUTOTUNE = os.environ.get("SPARSE_ACCUMULATION_TRITON_AUTOTUNE", "1") != "0"
ROWS_PER_THREAD = (1, 2, 4)
#: per-thread register budget (32-bit registers) for the values a program keeps live
REGISTER_BUDGET = 128
#: the single configuration under the interpreter (row kernels and dC)
INTERPRETER_BLOCK_R = 32
#: largest B over which the fused gradient kernel sums a gradient in registers (a power of two): it must
#: divide every BLOCK_R, the smallest of which is INTERPRETER_BLOCK_R (64 on CUDA)
SUMMED_INNER_MAX = INTERPRETER_BLOCK_R

#: dC kernel: rows per block, warps, consecutive blocks per program, nonzeros per chunk (accumulators in
#: registers; halved for float64); under the interpreter: BLOCK_R = INTERPRETER_BLOCK_R, 2 blocks per
#: program, chunks of 8
DC_BLOCK_R = 128
DC_NUM_WARPS = 4
DC_BLOCKS = 16
DC_CHUNK = 96
INTERPRETER_DC_BLOCKS = 2
INTERPRETER_DC_CHUNK = 8

#: widest active dimension (max of the operands' and the output's) for which the input gradients use one
#: fused kernel (beyond it a program would hold too many values per row); measured on an H200, 2e6 rows fp32,
#: "pieces" loads (benchmarks/gpu_breakdown.py): fused 0.064 / 0.122 / 0.328 ms against two swapped forwards
#: 0.082 / 0.147 / 0.344 ms at l = 2 / 4 / 8
FUSED_GRADIENTS_MAX_WIDTH = 17


def row_configs(sizes, used_columns: int, float64: bool, loads: str) -> list:
    """``(BLOCK_R, num_warps)`` pairs to tune over, best guess first, from a per-row register estimate.

    ``sizes``: widths of every tensor a row touches; ``used_columns``: column vectors held under "columns"."""
    width = {"tile": sum(next_pow2(n) for n in sizes), "pieces": sum(sizes)}.get(loads, used_columns)
    if float64:
        width *= 2
    fitting = [rpt for rpt in ROWS_PER_THREAD if rpt * width <= REGISTER_BUDGET] or [1]
    best = max(fitting)
    configs = []
    for rpt, warps in [(best, 4), (1, 4), (best, 8), (1, 2)]:
        config = (32 * warps * rpt, warps)
        if config not in configs:
            configs.append(config)
    return configs if AUTOTUNE else configs[:1]


def coefficient_gradient_config(float64: bool, interpreting: bool) -> tuple:
    """``(BLOCK_R, num_warps, BLOCKS, chunk size)`` of the dC kernel."""
    if interpreting:
        return INTERPRETER_BLOCK_R, 1, INTERPRETER_DC_BLOCKS, INTERPRETER_DC_CHUNK
    return DC_BLOCK_R, DC_NUM_WARPS, DC_BLOCKS, DC_CHUNK // 2 if float64 else DC_CHUNK
