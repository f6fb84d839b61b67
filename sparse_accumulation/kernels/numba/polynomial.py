"""CPU polynomial kernels with numba: the contract of the polynomial contract of :mod:`sparse_accumulation.kernels`, vectorised
over channels, deterministic.

One compiled kernel per compute dtype runs every program: the program is data (:mod:`.polynomial_schedule`
steps as index arrays). A task walks tiles of nodes of one element (:meth:`Elements.tiles`): it copies the
element's weight components into lines of a scratch tile ``[lines, channels]`` once per tile, then per node
copies the node's components into lines, runs the steps (each a loop over the channels: a product into a stack
line, or a multiply-add into an accumulator line) and writes the node's lane outputs. Element outputs are summed
over the tile's nodes and written per tile, then summed over each element's tiles in order. Tasks are ranges of
tiles on a small thread pool (:mod:`.threads`); results do not depend on the threads.
"""
from __future__ import annotations

import numba
import numpy as np
import torch

from .. import accumulation_dtype
from . import buffers
from . import threads as thread_pool
from .polynomial_schedule import group

#: rows of a tile
TILE_ROWS = 32
#: below this many (nodes x channels x steps) of work a call runs in the calling thread
SERIAL_WORK = 1 << 20
_SLOTS = 8


@numba.njit(cache=True, nogil=True, inline="always")
def _load(kind, row_index, B, data, strides, load_slot, load_base, load_step, load_line, load_kind, lines):
    """Copy the components of the loads of ``kind`` (0: per node, 1: per element) of row ``row_index`` into
    their lines."""
    for i in range(load_slot.shape[0]):
        if load_kind[i] == kind:
            x = data[load_slot[i]]
            row = row_index * strides[load_slot[i]] + load_base[i]
            step, line = load_step[i], load_line[i]
            for c in range(B):
                lines[line, c] = x[row + c * step]


@numba.njit(cache=True, nogil=True, inline="always")
def _zero(kind, acc_kind, acc, B):
    """Zero the accumulators of ``kind`` (0: per node, 1: per tile)."""
    for j in range(acc_kind.shape[0]):
        if acc_kind[j] == kind:
            for c in range(B):
                acc[j, c] = 0.0


@numba.njit(cache=True, nogil=True, inline="always")
def _store(kind, row_index, B, outs, out_strides, acc_out, acc_base, acc_step, acc_kind, acc):
    """Write the accumulators of ``kind`` into row ``row_index`` of their outputs."""
    for j in range(acc_kind.shape[0]):
        if acc_kind[j] == kind:
            out = outs[acc_out[j]]
            row = row_index * out_strides[acc_out[j]] + acc_base[j]
            step = acc_step[j]
            for c in range(B):
                out[row + c * step] = acc[j, c]


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _kernel(first, last, table, order, B, data, strides, load_slot, load_base, load_step, load_line, load_kind,
            op, target, a, b, coefficient, outs, out_strides, acc_out, acc_base, acc_step, acc_kind, lines, acc):
    """Tiles ``first .. last`` of ``table`` ``[3, T]`` (element, start, end in ``order``).

    ``data[s]``: flat rows of operand ``s`` (row stride ``strides[s]``); load ``i`` copies component columns
    ``load_base[i] + c * load_step[i]`` of operand ``load_slot[i]`` into line ``load_line[i]`` (kind 0: per node,
    1: per tile from the element's row). Step ``k``: ``op 0``: line ``target`` = ``a * b``; ``op 1``:
    accumulator ``target`` += ``coefficient * a * b``. Accumulator ``j`` goes to output ``acc_out[j]`` at columns
    ``acc_base[j] + c * acc_step[j]`` (kind 0: the node's row, 1: the tile's row of the element partials)."""
    n_steps = op.shape[0]
    for t in range(first, last):
        element, start, end = table[0, t], table[1, t], table[2, t]
        if start >= end:
            continue
        _load(1, element, B, data, strides, load_slot, load_base, load_step, load_line, load_kind, lines)
        _zero(1, acc_kind, acc, B)
        for p in range(start, end):
            node = order[p]
            _load(0, node, B, data, strides, load_slot, load_base, load_step, load_line, load_kind, lines)
            _zero(0, acc_kind, acc, B)
            for k in range(n_steps):
                u, v, d = a[k], b[k], target[k]
                if op[k] == 0:
                    for c in range(B):
                        lines[d, c] = lines[u, c] * lines[v, c]
                else:
                    w = coefficient[k]
                    for c in range(B):
                        acc[d, c] += w * lines[u, c] * lines[v, c]
            _store(0, node, B, outs, out_strides, acc_out, acc_base, acc_step, acc_kind, acc)
        _store(1, t, B, outs, out_strides, acc_out, acc_base, acc_step, acc_kind, acc)


@numba.njit(cache=True, nogil=True)
def _sum_tiles(partial, width, offsets, out):
    """``out[e] = sum of partial[offsets[e] .. offsets[e + 1]]`` in order."""
    for e in range(offsets.shape[0] - 1):
        for j in range(width):
            out[e, j] = 0.0
        for t in range(offsets[e], offsets[e + 1]):
            for j in range(width):
                out[e, j] += partial[t * width + j]


class _Plan:
    """A program's outputs as index arrays for :func:`_kernel` (made once per program and outputs)."""

    def __init__(self, program, outputs):
        chosen = group(program, [(j, c) for j in outputs for c in range(program.outputs[j].size)])
        factors = chosen.factors
        line_of = {f: i for i, f in enumerate(factors)}
        self.one = len(factors)
        self.lines = self.one + 1 + chosen.slots
        slot_line = lambda i: self.one + 1 + i  # noqa: E731
        self.load_slot = np.array([s for s, _ in factors], np.int64)
        self.load_base = np.array([program.operands[s].map.base[m] for s, m in factors], np.int64)
        self.load_step = np.array([program.operands[s].map.step[m] for s, m in factors], np.int64)
        self.load_line = np.arange(len(factors), dtype=np.int64)
        self.load_kind = np.array([program.operands[s].kind == "element" for s, _ in factors], np.int64)

        def line(ref):
            return line_of[ref[1:]] if ref[0] == "f" else self.one if ref[0] == "1" else slot_line(ref[1])

        steps = chosen.steps
        self.op = np.array([0 if s.op == "mul" else 1 for s in steps], np.int64)
        self.target = np.array([slot_line(s.target) if s.op == "mul" else s.target for s in steps], np.int64)
        self.a = np.array([line(s.a) for s in steps], np.int64)
        self.b = np.array([line(s.b) for s in steps], np.int64)
        self.coefficient = np.array([s.coefficient for s in steps], np.float64)
        position = {j: i for i, j in enumerate(outputs)}
        self.acc_out = np.array([position[j] for j, _ in chosen.accumulators], np.int64)
        self.acc_base = np.array([program.outputs[j].map.base[c] for j, c in chosen.accumulators], np.int64)
        self.acc_step = np.array([program.outputs[j].map.step[c] for j, c in chosen.accumulators], np.int64)
        self.acc_kind = np.array([program.outputs[j].kind == "element" for j, _ in chosen.accumulators], np.int64)
        self.steps = len(steps)


def _plan(program, outputs) -> _Plan:
    return program.cached(("numba_polynomial", outputs), lambda: _Plan(program, outputs))


def _flat(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    t = t.detach()
    if t.dtype != dtype:
        t = t.to(dtype)
    if t.shape[0] <= 1 or t.stride(0) == 0:
        return t[:1].contiguous().numpy().ravel()
    if t.stride(1) != 1:
        t = t.contiguous()
    span = (t.shape[0] - 1) * t.stride(0) + t.shape[1]
    return t.as_strided((span,), (1,)).numpy()


def run(program, tensors, elements, outputs) -> tuple:
    """See the polynomial contract of :mod:`sparse_accumulation.kernels`."""
    operand = tensors[0]
    dtype = accumulation_dtype(operand.dtype)
    np_dtype = buffers.NUMPY_DTYPES[dtype]
    B, N, E = program.channels, len(elements), elements.num_elements
    outputs = tuple(outputs)
    plan = _plan(program, outputs)
    table, offsets = elements.tiles(TILE_ROWS)
    tiles = table.shape[1]
    results, targets = [], []
    for j in outputs:
        slot = program.outputs[j]
        covered = slot.map.covers(B) and plan.steps > 0  # without steps the kernel does not run: zeros
        if slot.kind == "lane":
            made = (torch.empty if covered and N else torch.zeros)(N, slot.width, dtype=dtype)
            results.append(made)
            targets.append(made)
        else:
            results.append(None)
            targets.append((torch.empty if covered else torch.zeros)(tiles, slot.width, dtype=dtype))
    if N and plan.steps:
        dummy = np.zeros(1, np_dtype)
        data = [_flat(t, dtype) for t in tensors]
        strides = [t.stride(0) if t.shape[0] > 1 else 0 for t in tensors]
        data += [dummy] * (_SLOTS - len(data))
        strides += [0] * (_SLOTS - len(strides))
        outs = [t.numpy().ravel() for t in targets] + [dummy] * (_SLOTS - len(targets))
        out_strides = [t.stride(0) for t in targets] + [0] * (_SLOTS - len(targets))
        table_np, order_np = table.numpy(), elements.order.numpy()
        coefficient = plan.coefficient.astype(np_dtype)

        def task(first, last):
            lines = np.empty((plan.lines, B), np_dtype)
            lines[plan.one] = 1
            acc = np.empty((max(len(plan.acc_out), 1), B), np_dtype)
            _kernel(first, last, table_np, order_np, B, tuple(data), np.array(strides, np.int64), plan.load_slot,
                    plan.load_base, plan.load_step, plan.load_line, plan.load_kind, plan.op, plan.target, plan.a,
                    plan.b, coefficient, tuple(outs), np.array(out_strides, np.int64), plan.acc_out,
                    plan.acc_base, plan.acc_step, plan.acc_kind, lines, acc)

        threads = max(1, torch.get_num_threads()) if N * B * plan.steps >= SERIAL_WORK else 1
        thread_pool.run(task, tiles, min(threads, tiles))
    for i, j in enumerate(outputs):
        if results[i] is None:
            width = program.outputs[j].width
            summed = torch.empty(E, width, dtype=dtype)
            if N:
                _sum_tiles(targets[i].numpy().ravel(), width, offsets.numpy(), summed.numpy())
            else:
                summed.zero_()
            results[i] = summed
    return tuple(r if r.dtype == operand.dtype else r.to(operand.dtype) for r in results)
