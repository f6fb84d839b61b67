"""Triton graph kernels (CUDA; CPU tensors under ``TRITON_INTERPRET=1``): the contract of
the graph contract of :mod:`sparse_accumulation.kernels`, on kernels generated per channel rule (:mod:`.graph_source`).

Each call launches one generated kernel, autotuned over the rows a program handles (``BLOCK_R``) and its
warps; the channels of a row are the other dimension of the program's tile. Results never depend on the
configuration: the order of arithmetic is fixed by the generated source (atomic outputs excepted). Small graphs
whose rows have many edges share each row among :data:`SPLIT` programs (a choice made from the sizes alone), whose
partial sums, kept in the accumulation dtype, are then added in order.

While a kernel is first compiled (in worker processes), eager calls compute with the portable torch kernels of
:mod:`..torch.graph` instead of waiting for it (see :func:`.launch.ready`): the first calls of a new kind cost
milliseconds instead of seconds, and agree with the compiled kernels to rounding.
"""
from __future__ import annotations

import torch

from .. import ATOMIC, SEGMENT, accumulation_dtype

try:  # triton is optional (backends.is_available says whether this backend can run)
    import triton

    from ..torch import graph as portable
    from . import build, launch
    from .graph_source import Spec, kernel_source, next_pow2, parameters, segment_sum_source
except Exception:  # pragma: no cover - depends on the environment
    triton = None

__all__ = ["run", "segment_sum", "compile_only", "prefetching"]

_INT32_LIMIT = 2**31 - 1
#: programs of ``BLOCK_R * BLOCK_B`` lanes (then warps) to tune over, best guess first
_LANES_AND_WARPS = ((128, 4), (64, 2), (256, 4), (32, 1))
_INTERPRETER_LANES = 64


def _acc(dtype: torch.dtype) -> str:
    return "tl.float64" if dtype == torch.float64 else "tl.float32"


def _configs(channels: int) -> list:
    block_b = next_pow2(channels)
    if build.interpreting():
        return [(max(1, _INTERPRETER_LANES // block_b), 1)]
    pairs = []
    for lanes, warps in _LANES_AND_WARPS:
        pair = (max(1, lanes // block_b), warps)
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def _kernel(crule, spec: Spec):
    def make():
        name = build.kernel_name("graph", (crule.key, spec))
        source, pointers, ints = kernel_source(name, crule, spec)
        configs = [triton.Config({"BLOCK_R": b}, num_warps=w) for b, w in _configs(crule.channels)]
        atomic = [f"D{slot}" for slot, mode in spec.outputs if mode == ATOMIC]
        return build.autotuned(source, name, ints, configs, reset_to_zero=atomic or None)

    return build.cached(("graph", crule.key, spec), make)


#: segmented calls with fewer grid rows than this, and at least SPLIT_MIN_EDGES edges per row on average, share
#: each row's edges among SPLIT programs (small graphs: too few rows to fill the GPU, long loops over their edges)
SPLIT_MAX_ROWS = 2048
SPLIT_MIN_EDGES = 16
SPLIT = 4


def _split(grid_rows, edges, traceable: bool) -> int:
    """The programs a segment's edges are shared by (see :mod:`.graph_source`)."""
    if (traceable or not isinstance(grid_rows, int) or not isinstance(edges, int)
            or not 0 < grid_rows < SPLIT_MAX_ROWS or edges < SPLIT_MIN_EDGES * grid_rows):
        return 1
    return SPLIT


def _largest_offset(tensors, rows) -> int:
    return max((n * t.stride(0) + t.shape[1] for t, n in zip(tensors, rows) if t is not None), default=0)


def run(crule, tensors, indices, outputs, C, *, edges: int, segments=None, hoisted=(), traceable: bool = False):
    """See the graph contract of :mod:`sparse_accumulation.kernels`."""
    operand = next(t for t in tensors if t is not None)
    dtype = operand.dtype
    only_compiling = launch.compiling_only()  # outputs are not written: no rows to hold them
    grid_rows = segments[0].shape[0] - 1 if segments is not None else edges
    nothing = grid_rows == 0 or crule.rule.nnz == 0 or (edges == 0 and segments is None)
    split = 1 if nothing or segments is None or only_compiling else _split(grid_rows, edges, traceable)
    out_rows, results = {}, {}
    for slot, mode, rows in outputs:
        width = crule.maps[slot].width
        zeroed = mode == ATOMIC or not crule.writes_every_column(slot)
        make = operand.new_zeros if zeroed else operand.new_empty
        if split > 1 and mode == SEGMENT:  # S partial sums per row (rows r + j * R), added up below
            out_rows[slot] = split * rows
            results[slot] = make((out_rows[slot], width), dtype=accumulation_dtype(dtype))
        else:
            out_rows[slot] = rows
            results[slot] = make((0 if only_compiling else rows, width))
    if nothing:
        for slot, mode, _ in outputs:
            if mode != ATOMIC:
                results[slot].zero_()
        return tuple(results[slot] for slot, _, _ in outputs)
    order = segments[1] if segments is not None else None
    largest = max(_largest_offset(tensors, [t.shape[0] if t is not None else 0 for t in tensors]),
                  _largest_offset([results[s] for s, _, _ in outputs], [out_rows[s] for s, _, _ in outputs]),
                  edges, grid_rows + 1024)
    spec = Spec(tuple(i is not None for i in indices), tuple((slot, mode) for slot, mode, _ in outputs),
                segments is not None, tuple(s in hoisted for s in range(4)), order is not None,
                bool(largest >= _INT32_LIMIT), _acc(accumulation_dtype(dtype)), split)  # a guard on symbolic sizes
    kernel = _kernel(crule, spec)
    pointer_names, int_names = parameters(crule, spec)
    available = {f"T{s}": t for s, t in enumerate(tensors) if t is not None}
    available.update({f"I{s}": i for s, i in enumerate(indices) if i is not None})
    available.update({f"D{s}": results[s] for s in results})
    if segments is not None:
        available["OFFSETS"], available["ORDER"] = segments
    available["C"] = C if C.is_contiguous() else C.contiguous()
    pointers = [available[n] for n in pointer_names]
    # the autotuning key: symbolic sizes (a traced graph with dynamic shapes) leave it to the compiled graph
    values = {"R": grid_rows, "R_BUCKET": grid_rows.bit_length() if isinstance(grid_rows, int) else 0, "CZ": 0}
    for s in range(4):
        if tensors[s] is not None:
            values[f"S{s}"] = tensors[s].stride(0)
        if s in results:
            values[f"SD{s}"] = results[s].stride(0)
        if indices[s] is not None:
            values[f"N{s}"] = (tensors[s].shape[0] if tensors[s] is not None else out_rows[s])
    ints = [values[n] for n in int_names]

    def grid(meta):
        return (triton.cdiv(grid_rows, meta["BLOCK_R"]),) + ((split,) if split > 1 else ())

    if not traceable and not launch.ready(kernel, grid, pointers, ints):
        return portable.run(crule, tensors, indices, outputs, C, edges=edges, segments=segments, hoisted=hoisted)
    launch.launch(kernel, grid, pointers, ints, device=operand.device, traceable=traceable, tuning=ints[-1],
                  small=all(v <= _INT32_LIMIT for v in ints))
    if split > 1:
        for slot, mode, _ in outputs:
            if mode == SEGMENT:
                partial = results[slot]  # the partial sums of each row, added in a fixed order
                results[slot] = partial.view(split, partial.shape[0] // split, partial.shape[1]).sum(0).to(dtype)
    return tuple(results[slot] for slot, _, _ in outputs)


#: columns a program of the segment sum adds
_SUM_COLUMNS = 128


def segment_sum(Z, segments, rows: int, traceable: bool = False):
    """``out[r] = sum of Z[e]`` over the edges ``e`` of row ``r`` (``segments = (offsets, order)``), in the
    segments' order: deterministic; ``[rows, Z.shape[1]]`` of Z's dtype."""
    offsets, order = segments
    out = Z.new_empty((rows, Z.shape[1]))
    if rows == 0 or Z.shape[1] == 0:
        return out
    acc = _acc(accumulation_dtype(Z.dtype))

    def make():
        name = build.kernel_name("segment_sum", (acc, order is not None))
        source = segment_sum_source(name, acc, order is not None)
        return build.autotuned(source, name, ["WIDTH", "SZ", "SO"],
                               [triton.Config({"BLOCK_C": _SUM_COLUMNS}, num_warps=4)], key=())

    kernel = build.cached(("segment_sum", acc, order is not None), make)
    pointers = [Z, offsets] + ([order] if order is not None else []) + [out]
    ints = [Z.shape[1], Z.stride(0), out.stride(0)]

    def grid(meta):
        return (rows, triton.cdiv(Z.shape[1], meta["BLOCK_C"]))

    if not traceable and not launch.ready(kernel, grid, pointers, ints):
        return portable.segment_sum(Z, segments, rows)
    launch.launch(kernel, grid, pointers, ints, device=Z.device, traceable=traceable, small=Z.numel() < _INT32_LIMIT)
    return out


def compile_only():
    """A context in which :func:`run` and :func:`segment_sum` only start compiling their kernels, in worker
    processes, and return outputs that hold nothing (see :func:`.launch.compile_only`)."""
    return launch.compile_only()


def prefetching() -> bool:
    """Whether :func:`compile_only` starts any compile (compile workers on; see :func:`.build.prefetching`)."""
    return build.prefetching()
