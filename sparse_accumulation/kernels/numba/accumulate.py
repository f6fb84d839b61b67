"""CPU kernels with numba, host side: the plan of a call, its tasks, and which kernel variant runs them.

One kernel (:mod:`.accumulate_kernel`, built from the block steps of :mod:`.blocks`) computes the gradients
of the op; the forward runs through it as the gradient of X1 with the roles of X1 and the output gradient
swapped (the op is closed under differentiation), so a first call compiles one kernel variant for both
directions, and caches it on disk.

A call is cut into at most :data:`MAX_TASKS` tasks of rows, from the shapes alone, never from the thread
count, so results are bitwise reproducible. Calls of at least :data:`SERIAL_ROWS` rows run their tasks as a
few ranges on threads (:mod:`.threads`, as many as ``torch.get_num_threads()``), smaller ones in one
kernel call.

The gradient of an operand that broadcasts is summed over its repeated rows without races: where each of its
rows is reached by one task only (an operand shared along ``B`` with tasks cut at multiples of ``B``) tasks add
into it directly, otherwise each task fills a private copy and the copies are summed in task order.

The host-side plan of a call is made once per rule, row space and operand layout, and a call hands the
kernels its tensors as data addresses, so a small call costs a few microseconds of Python; large outputs come
from :mod:`~sparse_accumulation.kernels.numba.buffers`. 16-bit inputs are computed in float32.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import accumulation_dtype, layout, memo
from . import buffers
from . import threads as thread_pool
from .blocks import ADD_PRIVATE, ADD_SHARED, BLOCK, SKIP, STORE
from .accumulate_kernel import FINISH, PREPARE, TASKS, all_variants, variant  # noqa: F401  (all_variants: warm-up)

#: at most this many tasks per call (each holds its scratch and, for some broadcasts, a private gradient)
MAX_TASKS = 16
#: below this many rows a call runs in one kernel call: handing tasks to threads costs more than the work
SERIAL_ROWS = 2048


def _run(kernel, args: tuple, tasks: int, count: int, stages: int) -> None:
    """``kernel(*args, first_task, last_task, stages)`` over every task, on threads for large calls."""
    threads = min(tasks, torch.get_num_threads()) if count >= SERIAL_ROWS else 1
    if threads <= 1:
        kernel(*args, 0, tasks, stages)
    else:
        kernel(*args, 0, 0, stages & PREPARE)
        thread_pool.run(lambda first, last: kernel(*args, first, last, TASKS), tasks, threads)
        kernel(*args, 0, 0, stages & FINISH)


def _converted(operands, rows, dtype: torch.dtype) -> tuple:
    """``(tensors, folds)``: the operands in the compute ``dtype`` and how each folds into the row space (a
    conversion may lay out an overlapping view anew, which folds differently)."""
    if operands[0].dtype == dtype:
        return operands, rows.operands
    converted = tuple(t.detach().to(dtype) for t in operands)
    folds = tuple(f if c.stride() == t.stride() else f[:2] + tuple(rows.strides_of(c))
                  for t, c, f in zip(operands, converted, rows.operands))
    return converted, folds


def _describe(t: torch.Tensor, folded, rows) -> tuple:
    """``([A_i, B_i, s_a, s_b, col_stride, linear, 0, 1], span)`` of an operand in the compute dtype: its line
    of the kernel's table (:func:`.accumulate_kernel._accumulate`) and the number of elements from its data
    pointer that the kernel may read. ``linear``: its rows, in the order of the row space, lie one after the
    other (row ``r`` at ``r * M``); the last two entries, ``reduced`` and ``read``, are set by the plan."""
    A_i, B_i, s_a, s_b = folded
    M, col_stride = t.shape[-1], t.stride(-1)
    if A_i * B_i * M == 0:
        return [A_i, B_i, 0, 0, 0, 0, 0, 1], 0
    linear = (A_i == rows.A and B_i == rows.B and col_stride == 1 and (s_b == M or rows.B == 1)
              and (s_a == rows.B * M or rows.A == 1))
    span = 1 + (A_i - 1) * s_a + (B_i - 1) * s_b + (M - 1) * col_stride
    return [A_i, B_i, s_a, s_b, col_stride, int(linear), 0, 1], span


#: the table line of an operand the kernel does not read
_UNREAD = [1, 1, 0, 0, 0, 1, 0, 0]


def _coefficients(C: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return C if C.dtype == dtype and C.is_contiguous() else C.detach().to(dtype).contiguous()


#: host-side plans of calls (tables, task split, sorted index arrays) per rule, row space, operand layout,
#: dtype and options
_plans = memo.Memo(1024)


def _tasks(count: int, B: int, align: bool) -> tuple:
    """``(tasks, span)``: rows per task, from the shape only; a multiple of ``B`` when ``align``."""
    tasks = max(1, min(MAX_TASKS, -(-count // BLOCK)))
    span = -(-count // tasks)
    if align:
        span = -(-span // B) * B
    span = max(span, 1)
    return -(-count // span), span


def _grouped(rule, name: str, factors: tuple) -> tuple:
    """``(order, starts, *index arrays of factors)`` of ``rule`` sorted by ``name`` (cached on the rule)."""
    def build():
        order, starts = rule.grouped_by(name)
        arrays = [order, starts] + [rule.array(f)[order] if f is not None else np.zeros(len(order), np.int64)
                                    for f in factors]
        return tuple(np.ascontiguousarray(a, dtype=np.int64) for a in arrays)
    return rule.cached(("numba", name, factors), build)


def _zero(dtype: torch.dtype):
    return buffers.NUMPY_DTYPES[dtype](0)


def _index(rule, weighted: bool) -> tuple:
    """``(m1, m2, mu, w)`` of ``rule`` as int64 arrays (``w`` zeros without weights)."""
    return tuple(np.ascontiguousarray(rule.array(n) if n else np.zeros(rule.nnz, np.int64), dtype=np.int64)
                 for n in ("m1", "m2", "mu", "w" if weighted else None))


def _packed(table, sizes, modes, private_sizes, shape, spans, grouped, index) -> tuple:
    """The kernel's arguments after the addresses and ``zero``: the table, the numbers (sizes, modes, private
    sizes, shape, spans) and the index arrays as the rows of one array (:func:`.accumulate_kernel._accumulate`)."""
    arrays = tuple(grouped) + tuple(index)
    indices = np.zeros((len(arrays), max(len(a) for a in arrays)), dtype=np.int64)
    for row, a in zip(indices, arrays):
        row[:len(a)] = a
    numbers = np.array([*sizes, *modes, *private_sizes, *shape, *spans], dtype=np.int64)
    return np.ascontiguousarray(table, dtype=np.int64), numbers, indices


def _forward_plan(rows, lines, spans, rule, weighted, zero) -> tuple:
    """``(kernel, tasks, arguments)`` of a forward: the ``dX1`` pass of the kernel with X1 in the place of
    the output gradient and the output in the place of dX1, the nonzeros grouped by ``mu``; the kernel's
    arguments after the addresses."""
    count, O = rows.count, rule.output_size
    w_line, w_span = (lines[2], spans[2]) if weighted else (_UNREAD, 0)
    table = [_UNREAD, lines[1], w_line, lines[0]]
    sizes = [O, rule.input_sizes[1], rule.weight_size if weighted else 1, rule.input_sizes[0]]
    grouped = _grouped(rule, "mu", ("m1", "m2", "w" if weighted else None))
    tasks, span = _tasks(count, rows.B, False)
    modes, private_sizes = [STORE, SKIP, SKIP], [count * O, 0, 0]
    spans = (spans[0], 0, spans[1], w_span, rule.nnz, count * O, 0, 0, 0)
    return variant(weighted, False), tasks, (zero, *_packed(table, sizes, modes, private_sizes,
                                                            (count, rows.B, span, tasks), spans, grouped * 3,
                                                            _index(rule, weighted)))


def accumulate(X1, X2, W, C, rule, rows):
    """``out[..., mu[k]] += X1[m1[k]] * X2[m2[k]] * W[w[k]] * C[k]``; see :mod:`sparse_accumulation.kernels`."""
    dtype = accumulation_dtype(X1.dtype)
    count, O = rows.count, rule.output_size
    out = buffers.tensor((*rows.lead, O), dtype)
    if count and O:
        weighted = W is not None
        operands, folds = _converted((X1, X2, W) if weighted else (X1, X2), rows, dtype)

        def build():
            lines, spans = zip(*(_describe(t, f, rows) for t, f in zip(operands, folds)))
            return _forward_plan(rows, lines, spans, rule, weighted, _zero(dtype))

        kernel, tasks, plan = _plans.get(("fwd", rule.key, rows, dtype, folds, tuple(t.stride(-1) for t in operands)),
                                         build)
        c = _coefficients(C, dtype)
        x1, unused = operands[0].data_ptr(), c.data_ptr()
        weights = operands[2].data_ptr() if weighted else x1  # X1 holds the place of a missing W (never read)
        # X1 in the place of G (and of the unread X1), the output in the place of dX1
        addresses = (x1, x1, operands[1].data_ptr(), weights, c.data_ptr(), out.data_ptr(), unused, unused, unused,
                     0, 0, 0, 0)
        _run(kernel, (addresses, *plan), tasks, count, PREPARE | TASKS | FINISH)
    return out if dtype == X1.dtype else out.to(X1.dtype)


def _gradient_mode(folded, rows, wanted: bool, aligned: bool, tasks: int) -> int:
    """How tasks write the gradient of an operand of extents ``folded[:2]``."""
    A_i, B_i = folded[:2]
    if not wanted:
        return SKIP
    if A_i * B_i == rows.count:
        return STORE
    if tasks == 1 or (A_i == rows.A and B_i == 1 and aligned):
        return ADD_SHARED
    return ADD_PRIVATE


def _backward_plan(rows, lines, spans, wanted, want_c, rule, weighted, zero) -> tuple:
    """``(kernel, tasks, offsets, arguments)``: the backward variant, the number of tasks, where the private
    copies and dC's shares lie in the scratch of a call (element offsets), and the kernel's arguments after the
    addresses."""
    table = np.array(lines, dtype=np.int64)
    folds = [tuple(int(v) for v in line[:2]) for line in table]
    # an operand shared along B (A_i == A, B_i == 1) is reduced race-free if no task splits a run of B rows
    # (when a task holds at least B rows; otherwise private copies of it are small: A is)
    tasks, span = _tasks(rows.count, rows.B, False)
    aligned = rows.B <= span and any(w and A_i == rows.A and B_i == 1 < rows.B
                                     for w, (A_i, B_i) in zip(wanted, folds))
    if aligned:
        tasks, span = _tasks(rows.count, rows.B, True)
    modes = np.array([_gradient_mode(f, rows, w, aligned, tasks) for f, w in zip(folds, wanted)], dtype=np.int64)
    table[:3, 6] = modes >= ADD_SHARED
    # X1 is read for dX2, dW and dC, X2 for dX1, dW and dC, W where there are weights
    table[:3, 7] = (wanted[1] or wanted[2] or want_c, wanted[0] or wanted[2] or want_c, weighted)
    if not weighted:
        table[2] = _UNREAD
    sizes = [*rule.input_sizes, rule.weight_size if weighted else 1, rule.output_size]
    private_sizes = np.array([A_i * B_i * M for (A_i, B_i), M in zip(folds[:3], sizes)], dtype=np.int64)
    w_name = "w" if weighted else None
    grouped = (_grouped(rule, "m1", ("mu", "m2", w_name)) + _grouped(rule, "m2", ("m1", "mu", w_name))
               + (_grouped(rule, "w", ("m1", "m2", "mu")) if weighted
                  else _grouped(rule, "m1", ("mu", "mu", "mu"))))  # the last is unused without W
    index = _index(rule, weighted)
    # the scratch of a call: the tasks' private copies of gradients, then their shares of dC
    extra = [tasks * int(n) if m == ADD_PRIVATE else 0 for n, m in zip(private_sizes, modes)]
    extra.append(tasks * rule.nnz if want_c else 0)
    # G first, then X1, X2, W (X1 in its place without weights), C, the gradients (or their copies) and dC's
    # shares
    spans = (spans[3], *spans[:3], rule.nnz,
             *(e or (int(n) if m != SKIP else 0) for e, n, m in zip(extra, private_sizes, modes)), extra[3])
    arguments = (zero, *_packed(table, sizes, modes, private_sizes, (rows.count, rows.B, span, tasks), spans,
                                grouped, index))
    return (variant(weighted, want_c), tasks,
            tuple(int(o) for o in np.cumsum([0] + extra)), arguments)


def accumulate_backward(G, X1, X2, W, C, rule, rows, want_x1=True, want_x2=True, want_w=False, want_c=True):
    """Gradients ``(dX1, dX2, dW, dC)``; see :mod:`sparse_accumulation.kernels`."""
    dtype = accumulation_dtype(X1.dtype)
    weighted = W is not None
    originals = (X1, X2, W) if weighted else (X1, X2)
    wanted = (want_x1, want_x2, want_w and weighted)
    if rows.count == 0:
        zeros = [torch.zeros(t.shape, dtype=X1.dtype) if w else None for t, w in zip(originals + (None,), wanted)]
        return (*zeros[:3], torch.zeros(rule.nnz, dtype=X1.dtype) if want_c else None)
    G = G if G.dtype == dtype else G.detach().to(dtype)
    G, g_fold = layout.output_rows(G, rows)
    operands, folds = _converted(originals, rows, dtype)
    tensors = operands + (() if weighted else operands[:1]) + (G,)  # X1 holds the place of a missing W

    def build():
        all_folds = folds + (() if weighted else ((1, 1, 0, 0),)) + (g_fold,)
        lines, spans = zip(*(_describe(t, f, rows) for t, f in zip(tensors, all_folds)))
        return _backward_plan(rows, lines, spans, wanted, want_c, rule, weighted, _zero(dtype))

    kernel, tasks, offsets, plan = _plans.get(("bwd", rule.key, rows, dtype, wanted, want_c, folds, g_fold,
                                               tuple(t.stride(-1) for t in tensors)), build)
    grads = [buffers.tensor(t.shape, dtype) if w else None for t, w in zip(originals, wanted)]
    grads += [None] * (3 - len(grads))
    dC = torch.empty(rule.nnz, dtype=dtype) if want_c else None
    c = _coefficients(C, dtype)
    extra = torch.zeros(offsets[-1], dtype=dtype) if offsets[-1] else None
    scratch, itemsize = (0 if extra is None else extra.data_ptr()), dtype.itemsize
    addresses = (G.data_ptr(), tensors[0].data_ptr(), tensors[1].data_ptr(), tensors[2].data_ptr(), c.data_ptr(),
                 *(c.data_ptr() if d is None else d.data_ptr() for d in (*grads, dC)),
                 *(scratch + o * itemsize for o in offsets[:4]))
    _run(kernel, (addresses, *plan), tasks, rows.count, PREPARE | TASKS | FINISH)
    if dtype != X1.dtype:
        grads, dC = [None if d is None else d.to(X1.dtype) for d in grads], None if dC is None else dC.to(X1.dtype)
    return grads[0], grads[1], grads[2], dC
