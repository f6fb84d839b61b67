"""CPU graph kernels with numba: the contract of the graph contract of :mod:`sparse_accumulation.kernels`, vectorised over
channels, deterministic.

A call walks its grid rows (segments of an output's rows, or edges) in tasks. For each edge of a row it
gathers the components of every slot the outputs read into a scratch tile ``[components, channels]`` (one line
per component, the channels contiguous), then adds each output's products, component by component, as loops
over the channels: ``acc[o, :] += C[k] * tile[a[k], :] * tile[b[k], :] * tile[c[k], :]`` (the third factor is
a line of ones for rules without weights). A segment output sums its row's edges in its accumulator, in the
order of the segments, and writes the row once; an output per edge is written after each edge. Each grid row
belongs to one task, so results do not depend on how rows are split into tasks or threads.

The kernels are plain serial functions that release the GIL; large calls run tasks on the thread pool
(:func:`_run_tasks`, :mod:`.threads`). One compiled kernel per compute dtype serves every rule and layout: what differs is
data (maps, grouped nonzeros). 16-bit inputs are computed in float32.
"""
from __future__ import annotations

import numba
import numpy as np
import torch

from .. import accumulation_dtype
from . import buffers
from . import threads as thread_pool
from .. import SEGMENT

_INDEX_NAMES = ("m1", "m2", "w", "mu")
_ONE = -1
#: below this many (edges x channels x nonzeros) of work a call runs in the calling thread
SERIAL_WORK = 1 << 18
#: below this many values read, segment sums run in the calling thread (the pool's hand-offs cost more than
#: the adds they share: measured break-even about 2-3 million values on 2 cores)
SEGMENT_SUM_SERIAL_VALUES = 1 << 21
#: tasks per thread (more tasks balance rows of uneven length)
TASKS_PER_THREAD = 4


@numba.njit(inline="always")
def _load(tile, s, r, data, strides, row_counts, bases, steps, slot_first, B):
    """The lines of slot ``s`` in ``tile`` from its row ``r`` (zeros outside the tensor, ones where the map
    says constant)."""
    x = data[s]
    valid = 0 <= r < row_counts[s]
    start = r * strides[s]
    for m in range(slot_first[s], slot_first[s + 1]):
        base, step = bases[m], steps[m]
        if base == _ONE:
            for b in range(B):
                tile[m, b] = 1.0
        elif not valid:
            for b in range(B):
                tile[m, b] = 0.0
        elif step == 0:
            v = x[start + base]
            for b in range(B):
                tile[m, b] = v
        else:
            for b in range(B):
                tile[m, b] = x[start + base + b * step]


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _kernel(first, last, segmented, offsets, order, data, rows_index, strides, row_counts, bases, steps,
            slot_first, loaded, hoisted, channels, out_slots, out_modes, out_data, out_strides, out_first,
            out_bases, out_steps, term_starts, fa, fb, fc, two_factors, coefficients, lines, components):
    """Grid rows ``first .. last`` (rows of the grid index's segments, or edges).

    ``data[s]``: the flat data of slot ``s``; ``rows_index[s]``: its gathered rows (empty: the edge's row);
    ``bases``/``steps`` from ``slot_first[s]``: its column map (base -1: the constant 1); ``loaded[s]``: the
    outputs read it; ``hoisted[s]``: its row is the grid row (read once per row). Output ``o`` writes slot
    ``out_slots[o]`` into ``out_data[o]`` (mode ``out_modes[o]``: 0 segment, 1 per edge), components
    ``out_first[o] ..`` of ``out_bases``/``out_steps``. Accumulator line ``j`` gets the terms ``term_starts[j]
    ..``: ``coefficients[t] * tile[fa[t]] * tile[fb[t]] * tile[fc[t]]``, ``fc`` a line that every channel
    shares where ``two_factors[o]`` (one number per edge, folded into the coefficient). ``tile`` has ``lines``
    lines (the last a line of ones), ``acc`` ``components``. (Scratch is allocated here, so that the compiler
    knows it aliases nothing; elements are indexed directly: row views in the loops would cost reference
    counting per term.)"""
    B = channels
    tile = np.empty((lines, B), dtype=coefficients.dtype)
    tile[lines - 1] = 1.0
    acc = np.empty((components, B), dtype=coefficients.dtype)
    n_out = out_slots.shape[0]
    for row in range(first, last):
        if segmented:
            begin, end = offsets[row], offsets[row + 1]
        else:
            begin, end = row, row + 1
        for s in range(4):
            if loaded[s] and hoisted[s]:
                _load(tile, s, row, data, strides, row_counts, bases, steps, slot_first, B)
        for o in range(n_out):
            if out_modes[o] == 0:
                for j in range(out_first[o], out_first[o + 1]):
                    for b in range(B):
                        acc[j, b] = 0.0
        for position in range(begin, end):
            edge = position
            if segmented and order.shape[0] > 0:
                edge = order[position]
            for s in range(4):
                if loaded[s] and not hoisted[s]:
                    r = rows_index[s][edge] if rows_index[s].shape[0] > 0 else edge
                    _load(tile, s, r, data, strides, row_counts, bases, steps, slot_first, B)
            for o in range(n_out):
                per_edge = out_modes[o] == 1
                for j in range(out_first[o], out_first[o + 1]):
                    if per_edge:
                        for b in range(B):
                            acc[j, b] = 0.0
                    first_term, end = term_starts[j], term_starts[j + 1]
                    if two_factors[o]:  # the third factor is one number per edge: folded into the coefficient
                        _two_factor_terms(acc, j, tile, coefficients, fa, fb, fc, first_term, end, B)
                    else:
                        _three_factor_terms(acc, j, tile, coefficients, fa, fb, fc, first_term, end, B)
                if per_edge:
                    _write(out_data[o], edge * out_strides[o], acc, out_first[o], out_first[o + 1], out_bases,
                           out_steps, B)
        for o in range(n_out):
            if out_modes[o] == 0:
                _write(out_data[o], row * out_strides[o], acc, out_first[o], out_first[o + 1], out_bases,
                       out_steps, B)


@numba.njit(inline="always", fastmath={"contract"})
def _two_factor_terms(acc, j, tile, coefficients, fa, fb, fc, t, end, B):
    """``acc[j] += sum over terms t .. end of (coefficients[t] * tile[fc[t], 0]) * tile[fa[t]] * tile[fb[t]]``,
    four terms per update of the accumulator."""
    while t + 4 <= end:
        c0, p0, q0 = coefficients[t] * tile[fc[t], 0], fa[t], fb[t]
        c1, p1, q1 = coefficients[t + 1] * tile[fc[t + 1], 0], fa[t + 1], fb[t + 1]
        c2, p2, q2 = coefficients[t + 2] * tile[fc[t + 2], 0], fa[t + 2], fb[t + 2]
        c3, p3, q3 = coefficients[t + 3] * tile[fc[t + 3], 0], fa[t + 3], fb[t + 3]
        for b in range(B):
            acc[j, b] += ((c0 * tile[p0, b] * tile[q0, b] + c1 * tile[p1, b] * tile[q1, b])
                          + (c2 * tile[p2, b] * tile[q2, b] + c3 * tile[p3, b] * tile[q3, b]))
        t += 4
    while t < end:
        c0, p0, q0 = coefficients[t] * tile[fc[t], 0], fa[t], fb[t]
        for b in range(B):
            acc[j, b] += c0 * tile[p0, b] * tile[q0, b]
        t += 1


@numba.njit(inline="always", fastmath={"contract"})
def _three_factor_terms(acc, j, tile, coefficients, fa, fb, fc, t, end, B):
    """``acc[j] += sum over terms t .. end of coefficients[t] * tile[fa[t]] * tile[fb[t]] * tile[fc[t]]``, four
    terms per update of the accumulator."""
    while t + 4 <= end:
        c0, p0, q0, r0 = coefficients[t], fa[t], fb[t], fc[t]
        c1, p1, q1, r1 = coefficients[t + 1], fa[t + 1], fb[t + 1], fc[t + 1]
        c2, p2, q2, r2 = coefficients[t + 2], fa[t + 2], fb[t + 2], fc[t + 2]
        c3, p3, q3, r3 = coefficients[t + 3], fa[t + 3], fb[t + 3], fc[t + 3]
        for b in range(B):
            acc[j, b] += ((c0 * tile[p0, b] * tile[q0, b] * tile[r0, b] + c1 * tile[p1, b] * tile[q1, b] * tile[r1, b])
                          + (c2 * tile[p2, b] * tile[q2, b] * tile[r2, b]
                             + c3 * tile[p3, b] * tile[q3, b] * tile[r3, b]))
        t += 4
    while t < end:
        c0, p0, q0, r0 = coefficients[t], fa[t], fb[t], fc[t]
        for b in range(B):
            acc[j, b] += c0 * tile[p0, b] * tile[q0, b] * tile[r0, b]
        t += 1


@numba.njit(inline="always")
def _write(out, start, acc, first, last, bases, steps, B):
    """Components ``first .. last`` of ``acc`` into the row at ``start``; a column shared by the channels
    (step 0) gets their sum, a constant one (base -1) nothing."""
    for j in range(first, last):
        base, step = bases[j], steps[j]
        if base == _ONE:  # a constant column has no gradient
            continue
        if step == 0:
            total = 0.0
            for b in range(B):
                total += acc[j, b]
            out[start + base] = total
        else:
            for b in range(B):
                out[start + base + b * step] = acc[j, b]


class _Plan:
    """What a channel rule's outputs need, made once per (rule, output slots): the maps of the slots, and per
    output its components' terms as lines of the tile."""

    def __init__(self, crule, output_slots):
        rule = crule.rule
        present = [s for s in range(4) if crule.maps[s] is not None]
        self.loaded = np.array([s in present and any(j != s for j in output_slots) for s in range(4)])
        sizes = [crule.maps[s].size if s in present else 0 for s in range(4)]
        self.slot_first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        ones_line = int(self.slot_first[-1])
        self.bases = np.concatenate([np.asarray(crule.maps[s].base, np.int64) for s in present] + [[_ONE]])
        self.steps = np.concatenate([np.asarray(crule.maps[s].step, np.int64) for s in present] + [[0]])
        self.lines = ones_line + 1
        arrays = {s: rule.array(_INDEX_NAMES[s]) for s in present}
        out_bases, out_steps, out_first = [], [], [0]
        term_starts, fa, fb, fc, picks, two_factors = [0], [], [], [], [], []
        for slot in output_slots:
            column_map = crule.maps[slot]
            out_bases += column_map.base
            out_steps += column_map.step
            out_first.append(out_first[-1] + column_map.size)
            # a slot every channel reads alike (one number per edge) goes last, to be folded into the coefficient
            factors = sorted((s for s in present if s != slot), key=lambda s: crule.maps[s].shared)
            two_factors.append(len(factors) < 3 or crule.maps[factors[2]].shared)
            order = np.argsort(arrays[slot], kind="stable")
            counts = np.bincount(arrays[slot], minlength=column_map.size)
            term_starts += (len(picks) + np.cumsum(counts)).tolist()
            lines = [self.slot_first[s] + arrays[s][order] for s in factors]
            while len(lines) < 3:
                lines.append(np.full(len(order), ones_line, np.int64))
            fa += lines[0].tolist()
            fb += lines[1].tolist()
            fc += lines[2].tolist()
            picks += order.tolist()
        self.term_starts = np.array(term_starts, np.int64)
        self.fa, self.fb, self.fc = (np.array(f, np.int64) for f in (fa, fb, fc))
        self.picks = np.array(picks, np.int64)
        self.two_factors = np.array(two_factors)
        self.out_bases = np.array(out_bases, np.int64)
        self.out_steps = np.array(out_steps, np.int64)
        self.out_first = np.array(out_first, np.int64)
        self.components = max(self.out_first[-1], 1)


def _plan(crule, output_slots) -> _Plan:
    return crule.cached(("numba_graph", tuple(output_slots)), lambda: _Plan(crule, output_slots))


_EMPTY_INDEX = np.zeros(0, np.int64)


def _run_tasks(kernel_args, grid_rows: int, offsets, work: int) -> None:
    """Run the kernel over ``grid_rows`` rows: in this thread for small work, else in tasks of about equal
    work (edges, from ``offsets``) on the thread pool, each with scratch of its own."""
    threads = max(1, torch.get_num_threads())
    if work < SERIAL_WORK or threads == 1 or grid_rows < 2:
        _kernel(0, grid_rows, *kernel_args())
        return
    tasks = min(grid_rows, threads * TASKS_PER_THREAD)
    if offsets is not None:
        targets = np.linspace(0, offsets[-1], tasks + 1)
        cuts = np.unique(np.concatenate([[0], np.searchsorted(offsets, targets[1:-1]), [grid_rows]]))
    else:
        cuts = np.unique(np.linspace(0, grid_rows, tasks + 1).astype(np.int64))
    ranges = [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    thread_pool.run_tasks(lambda first, last: _kernel(first, last, *kernel_args()), ranges, threads)


@numba.njit(cache=True, nogil=True)
def _segment_sum(z, offsets, order, out, first, last):
    """``out[r] = sum of z rows`` over the edges of segment ``r``, in the segments' order, for the segments
    ``[first, last)`` (``order`` empty: the edges are sorted). Whole rows of two 2-D arrays, so that the adds
    vectorise."""
    width = z.shape[1]
    for r in range(first, last):
        line = out[r]
        line[:] = 0.0
        for p in range(offsets[r], offsets[r + 1]):
            row = z[order[p]] if order.shape[0] > 0 else z[p]
            for j in range(width):
                line[j] += row[j]


def segment_sum(Z, segments, rows: int, traceable: bool = False):
    """See the graph contract of :mod:`sparse_accumulation.kernels`. Segments go in tasks of about equal edges
    on the thread pool from :data:`SEGMENT_SUM_SERIAL_VALUES` values read; each segment is summed by one task,
    in order."""
    dtype = accumulation_dtype(Z.dtype)
    out = torch.empty(rows, Z.shape[1], dtype=dtype)
    if rows and Z.shape[1]:
        offsets, order = segments
        offsets = offsets.numpy()
        args = (Z.detach().to(dtype).contiguous().numpy(), offsets,
                order.numpy() if order is not None else _EMPTY_INDEX, out.numpy())
        threads = max(1, torch.get_num_threads())
        if Z.shape[0] * Z.shape[1] < SEGMENT_SUM_SERIAL_VALUES or threads == 1 or rows < 2:
            _segment_sum(*args, 0, rows)
        else:
            targets = np.linspace(offsets[0], offsets[-1], min(rows, threads * TASKS_PER_THREAD) + 1)
            cuts = np.unique(np.concatenate([[0], np.searchsorted(offsets, targets[1:-1]), [rows]]))
            ranges = [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
            thread_pool.run_tasks(lambda first, last: _segment_sum(*args, first, last), ranges, threads)
    else:
        out.zero_()
    return out if dtype == Z.dtype else out.to(Z.dtype)


def _numpy(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """The flat data of a 2-D tensor (rows at its row stride, unit column stride) in the compute dtype."""
    t = t.detach()
    if t.dtype != dtype:
        t = t.to(dtype)
    if t.stride(0) == 0 or t.shape[0] <= 1:
        return t[:1].contiguous().numpy().ravel()
    if t.stride(1) != 1:
        t = t.contiguous()
    span = (t.shape[0] - 1) * t.stride(0) + t.shape[1]
    return t.as_strided((span,), (1,)).numpy()


def run(crule, tensors, indices, outputs, C, *, edges: int, segments=None, hoisted=(), traceable: bool = False):
    """The graph kernel contract (:mod:`sparse_accumulation.kernels`) with modes ``"edge"`` and ``"segment"``
    (atomic adds are CUDA's)."""
    del traceable
    operand = next(t for t in tensors if t is not None)
    dtype = accumulation_dtype(operand.dtype)
    np_dtype = buffers.NUMPY_DTYPES[dtype]
    plan = _plan(crule, [slot for slot, _, _ in outputs])
    B = crule.channels
    segmented = segments is not None
    grid_rows = segments[0].shape[0] - 1 if segmented else edges
    computed = bool(grid_rows and edges and crule.rule.nnz)
    results = []
    for slot, mode, rows in outputs:
        make = torch.empty if computed and crule.writes_every_column(slot) else torch.zeros
        results.append(make(rows, crule.maps[slot].width, dtype=dtype))
    if computed:
        data = tuple(_numpy(t, dtype) if t is not None else np.zeros(1, np_dtype) for t in tensors)
        rows_index = tuple(i.numpy() if i is not None else _EMPTY_INDEX for i in indices)
        strides = np.array([0 if t is None or t.shape[0] <= 1 or t.stride(0) == 0 else t.stride(0)
                            for t in tensors], np.int64)
        row_counts = np.array([t.shape[0] if t is not None else 0 for t in tensors], np.int64)
        if any(t is not None and indices[s] is None and t.shape[0] == 1 for s, t in enumerate(tensors)):
            row_counts = np.where(row_counts == 1, max(edges, 1), row_counts)  # one row read by every edge
        offsets = segments[0].numpy() if segmented else _EMPTY_INDEX
        order = segments[1].numpy() if segmented and segments[1] is not None else _EMPTY_INDEX
        coefficients = C.detach().to(dtype).numpy()[plan.picks]
        out_data = tuple(r.numpy().ravel() for r in results)
        out_strides = np.array([r.stride(0) for r in results], np.int64)
        out_slots = np.array([slot for slot, _, _ in outputs], np.int64)
        out_modes = np.array([0 if mode == SEGMENT else 1 for _, mode, _ in outputs], np.int64)
        hoisted_slots = np.array([segmented and s in hoisted for s in range(4)])

        def kernel_args():
            return (segmented, offsets, order, data, rows_index, strides, row_counts, plan.bases, plan.steps,
                    plan.slot_first, plan.loaded, hoisted_slots, B, out_slots, out_modes, out_data, out_strides, plan.out_first,
                    plan.out_bases, plan.out_steps, plan.term_starts, plan.fa, plan.fb, plan.fc, plan.two_factors,
                    coefficients, plan.lines, plan.components)

        _run_tasks(kernel_args, grid_rows, offsets if segmented else None, edges * B * crule.rule.nnz)
    return tuple(r if r.dtype == operand.dtype else r.to(operand.dtype) for r in results)
