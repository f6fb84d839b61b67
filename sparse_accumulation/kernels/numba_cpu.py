"""CPU kernels with numba: row-blocked, parallel over tasks of rows, deterministic, no ``[rows, nnz]`` buffer.

Each task walks its rows in blocks; a block of every operand is gathered into component-major scratch
(``[M, block]``) so that the products run as contiguous, vectorizable loops over the rows of the block, and
results are scattered back to rows (rows that lie one after the other move in vector tiles,
:mod:`.numba_transpose`); the products prefetch the next block's rows (:mod:`.numba_prefetch`). Rows are
addressed through the plan of :mod:`sparse_accumulation.layout` (row ``r = a * B + b`` of operand ``i``
starts at ``a * s_a + b * s_b``), so broadcast operands are read in place, with stride 0, never expanded.
Nonzeros are visited grouped by the component they write (by ``mu`` for the forward, by ``m1`` / ``m2`` /
``w`` for the gradients), so each accumulator row is loaded and stored once per several products; ``dC``
comes from the products of the ``m1`` pass (:func:`_products_and_sums`) when ``dX1`` is computed.

The gradient of an operand that broadcasts is summed over its repeated rows without races: where each of its
rows is reached by one task only (an operand shared along ``B`` with tasks cut at multiples of ``B``) tasks add
into it directly, otherwise each task fills a private copy and the copies are summed in task order. Tasks are
cut from the shapes alone, never from the thread count, so results are bitwise reproducible.

Calls below :data:`SERIAL_ROWS` rows run serial twins of the kernels (no thread pool); the host-side plan of
a call is made once per rule, row space and operand layout, and a call hands the kernels its tensors as data
addresses (:func:`_forward_at`, :func:`_backward_at`), so a small call costs a few microseconds of Python;
large outputs come from :mod:`~sparse_accumulation.kernels.buffers`. 16-bit inputs are computed in float32.
numba's default threading layer is not safe for concurrent calls from several Python threads, so calls are
serialized with a lock (each call already uses every core).
"""
from __future__ import annotations

import hashlib
import threading
import types
from pathlib import Path

import numba
import numpy as np
import torch
from numba import types as nbtypes
from numba.extending import intrinsic

from .. import layout
from . import accumulation_dtype, buffers, memo
from . import numba_prefetch, numba_transpose
from .numba_prefetch import share
from .numba_transpose import columns_to_rows, rows_to_columns

#: rows per block of scratch: long enough for the vector loops, short enough to stay in L1/L2
BLOCK = 256
#: at most this many tasks per call (each holds its scratch and, for some broadcasts, a private gradient)
MAX_TASKS = 16
#: below this many rows a call runs the serial twin of a kernel: waking the thread pool costs more than the work
SERIAL_ROWS = 2048

# how a task writes the gradient of an operand (mode per operand, see _backward)
_SKIP, _STORE, _ADD_SHARED, _ADD_PRIVATE = 0, 1, 2, 3

_lock = threading.Lock()


@numba.njit(inline="always")
def _address(first, n, B, table, offsets, targets):
    """For rows ``first .. first + n`` and each operand ``i`` (``table[i] = A_i, B_i, s_a, s_b, col_stride,
    linear, reduced``): ``offsets[i, r]``, where the row starts in the operand's buffer (unless ``linear``), and
    ``targets[i, r]``, the row of the operand's own contiguous ``[A_i, B_i]`` gradient that it adds to (if
    ``reduced``)."""
    for i in range(table.shape[0]):
        row = table[i]
        if row[5] and not row[6]:
            continue
        a = first // B
        b = first - a * B
        for r in range(n):
            offsets[i, r] = a * row[2] + b * row[3]
            targets[i, r] = (a if row[0] > 1 else 0) * row[1] + (b if row[1] > 1 else 0)
            b += 1
            if b == B:
                b = 0
                a += 1


@numba.njit(inline="always")
def _gather(x, row, first, n, offsets, scratch):
    """``scratch[m, r]``: component ``m`` of row ``first + r`` of an operand (``row``: its line of the table).
    Rows that lie one after the other in memory are transposed as a block (:mod:`.numba_transpose`)."""
    M = scratch.shape[0]
    if row[5]:
        rows_to_columns(x, first * M, n, scratch)
        return
    col_stride = row[4]
    for m in range(M):
        t = scratch[m]
        shift = m * col_stride
        for r in range(n):
            t[r] = x[offsets[r] + shift]


@numba.njit(inline="always")
def _scatter(scratch, first, n, out):
    """Rows ``first .. first + n`` of the contiguous ``[rows, width]`` buffer ``out`` from ``scratch[width, n]``
    (as :func:`_gather` transposes)."""
    columns_to_rows(scratch, first * scratch.shape[0], n, out)


@numba.njit(inline="always")
def _scatter_add(scratch, targets, n, out, base):
    """``out[base + targets[r] * width + j] += scratch[j, r]``, in row order (several rows may share a target)."""
    width = scratch.shape[0]
    for j in range(width):
        t = scratch[j]
        for r in range(n):
            out[base + targets[r] * width + j] += t[r]


@numba.njit(inline="always")
def _products(target, a, b, c, ia, ib, starts, n, sources, ahead):
    """``target[j, :n] += sum over k in group j of c[k] * a[ia[k], :n] * b[ib[k], :n]``, prefetching the
    ranges ``ahead`` of ``sources`` on the way (:func:`.numba_prefetch.share`)."""
    for j in range(target.shape[0]):
        share(sources, ahead, j, target.shape[0])
        o = target[j]
        k = starts[j]
        end = starts[j + 1]
        while k + 4 <= end:
            a0, b0, c0 = a[ia[k]], b[ib[k]], c[k]
            a1, b1, c1 = a[ia[k + 1]], b[ib[k + 1]], c[k + 1]
            a2, b2, c2 = a[ia[k + 2]], b[ib[k + 2]], c[k + 2]
            a3, b3, c3 = a[ia[k + 3]], b[ib[k + 3]], c[k + 3]
            for r in range(n):
                o[r] += (c0 * a0[r] * b0[r] + c1 * a1[r] * b1[r]) + (c2 * a2[r] * b2[r] + c3 * a3[r] * b3[r])
            k += 4
        while k < end:
            a0, b0, c0 = a[ia[k]], b[ib[k]], c[k]
            for r in range(n):
                o[r] += c0 * a0[r] * b0[r]
            k += 1


@numba.njit(inline="always")
def _weighted_products(target, a, b, w, c, ia, ib, iw, starts, n, sources, ahead):
    """``target[j, :n] += sum over k in group j of c[k] * a[ia[k], :n] * b[ib[k], :n] * w[iw[k], :n]`` (and
    prefetches as :func:`_products`)."""
    for j in range(target.shape[0]):
        share(sources, ahead, j, target.shape[0])
        o = target[j]
        k = starts[j]
        end = starts[j + 1]
        while k + 2 <= end:
            a0, b0, w0, c0 = a[ia[k]], b[ib[k]], w[iw[k]], c[k]
            a1, b1, w1, c1 = a[ia[k + 1]], b[ib[k + 1]], w[iw[k + 1]], c[k + 1]
            for r in range(n):
                o[r] += c0 * a0[r] * b0[r] * w0[r] + c1 * a1[r] * b1[r] * w1[r]
            k += 2
        if k < end:
            a0, b0, w0, c0 = a[ia[k]], b[ib[k]], w[iw[k]], c[k]
            for r in range(n):
                o[r] += c0 * a0[r] * b0[r] * w0[r]


@numba.njit(inline="always")
def _any_products(target, a, b, w, c, ia, ib, iw, starts, n, weighted, sources, ahead):
    if weighted:
        _weighted_products(target, a, b, w, c, ia, ib, iw, starts, n, sources, ahead)
    else:
        _products(target, a, b, c, ia, ib, starts, n, sources, ahead)
    ahead[:, 1] = 0  # prefetched once


@numba.njit(inline="always")
def _products_and_sums(target, a, b, w, c, ia, ib, iw, starts, n, weighted, x, order, partial, zero, sources,
                       ahead):
    """:func:`_any_products`, and for each nonzero ``k`` of group ``j``: ``partial[order[k]] +=`` the sum over
    the rows of its product without ``c`` times ``x[j]``. With the groups by ``m1`` and ``x`` the block of X1,
    that is the share of ``dC`` of the rows, from the products the gradient of X1 computes anyway."""
    for j in range(target.shape[0]):
        share(sources, ahead, j, target.shape[0])
        o, xj = target[j], x[j]
        k = starts[j]
        end = starts[j + 1]
        while k < end:
            a0, b0, c0 = a[ia[k]], b[ib[k]], c[k]
            pair = k + 1 < end
            a1, b1 = a[ia[k + pair]], b[ib[k + pair]]  # a second nonzero, or the first again with c = 0
            c1 = c[k + 1] if pair else zero
            first, second = zero, zero
            if weighted:
                w0, w1 = w[iw[k]], w[iw[k + pair]]
                for r in range(n):
                    p0, p1 = a0[r] * b0[r] * w0[r], a1[r] * b1[r] * w1[r]
                    o[r] += c0 * p0 + c1 * p1
                    first += p0 * xj[r]
                    second += p1 * xj[r]
            else:
                for r in range(n):
                    p0, p1 = a0[r] * b0[r], a1[r] * b1[r]
                    o[r] += c0 * p0 + c1 * p1
                    first += p0 * xj[r]
                    second += p1 * xj[r]
            partial[order[k]] += first
            if pair:
                partial[order[k + 1]] += second
            k += 2
    ahead[:, 1] = 0


@numba.njit(inline="always")
def _ahead(table, sizes, start, count, weighted, ahead):
    """``ahead[i]``: the element range of rows ``start .. start + count`` of operand ``i`` where its rows lie
    one after the other (else an empty range)."""
    for i in range(ahead.shape[0]):
        read = table[i, 5] and count > 0 and (i != 2 or weighted)  # operand 2 is W
        ahead[i, 0] = start * sizes[i]
        ahead[i, 1] = count * sizes[i] if read else 0


@numba.njit(inline="always")
def _permuted(c, order):
    """``c[order]`` (in the kernel: cheaper than a numpy fancy index per call)."""
    out = np.empty_like(c)
    for k in range(order.shape[0]):
        out[k] = c[order[k]]
    return out


@numba.njit(inline="always")
def _scratch(sizes, operands, dtype):
    """A task's scratch: blocks of X1, X2 and W (``[M, BLOCK]``) and the rows' offsets and gradient targets."""
    return (np.empty((sizes[0], BLOCK), dtype=dtype), np.empty((sizes[1], BLOCK), dtype=dtype),
            np.empty((sizes[2], BLOCK), dtype=dtype), np.empty((operands, BLOCK), dtype=np.int64),
            np.empty((operands, BLOCK), dtype=np.int64))


@numba.njit(inline="always")
def _load(first, n, B, table, x1, x2, x3, weighted, t1, t2, t3, offsets, targets):
    """Address rows ``first .. first + n`` and gather the block of X1, X2 and (if ``weighted``) W."""
    _address(first, n, B, table, offsets, targets)
    _gather(x1, table[0], first, n, offsets[0], t1)
    _gather(x2, table[1], first, n, offsets[1], t2)
    if weighted:
        _gather(x3, table[2], first, n, offsets[2], t3)


def _forward(x1, x2, x3, table, sizes, c, order, i1, i2, i3, starts, out, rows, B, span, tasks, weighted):
    """``out[r, mu] += c * x1[m1] * x2[m2] (* x3[w])`` over rows ``0 .. rows``; ``order`` sorts the nonzeros by
    ``mu`` (``starts``: the groups; ``i1, i2, i3`` are in that order already, ``c`` is not);
    ``table[i]`` describes operand ``i`` (:func:`_address`); ``sizes = (M1, M2, Mw, O)``; task ``t``
    does rows ``t * span ..``."""
    ck = _permuted(c, order)
    for task in numba.prange(tasks):
        t1, t2, t3, offsets, targets = _scratch(sizes, table.shape[0], out.dtype)
        acc = np.empty((sizes[3], BLOCK), dtype=out.dtype)
        ahead = np.empty((3, 2), dtype=np.int64)
        end = min(rows, (task + 1) * span)
        for first in range(task * span, end, BLOCK):
            n = min(BLOCK, end - first)
            _load(first, n, B, table, x1, x2, x3, weighted, t1, t2, t3, offsets, targets)
            _ahead(table, sizes, first + n, min(BLOCK, end - first - n), weighted, ahead)
            acc[:] = 0
            _any_products(acc, t1, t2, t3, ck, i1, i2, i3, starts, n, weighted, (x1, x2, x3), ahead)
            _scatter(acc, first, n, out)


@numba.njit(inline="always")
def _write(scratch, first, n, d, targets, mode, task, private_size):
    """Write a block of an operand's gradient as its ``mode`` says (private copies ``private_size`` apart)."""
    if mode == _STORE:
        _scatter(scratch, first, n, d)
    elif mode == _ADD_SHARED:
        _scatter_add(scratch, targets, n, d, 0)
    elif mode == _ADD_PRIVATE:
        _scatter_add(scratch, targets, n, d, task * private_size)


def _backward(g, x1, x2, x3, table, sizes,
              c, o1, f1a, f1b, f1w, starts1, o2, f2a, f2b, f2w, starts2, o3, f3a, f3b, f3c, starts3,
              m1, m2, mu, w, d1, d2, d3, modes, private_sizes, partial, rows, B, span, tasks, weighted, want_c, zero):
    """Gradients of :func:`_forward` for the output gradient ``g`` (operand 3 of ``table``): ``d1`` grouped by
    ``m1`` (``f1a, f1b, f1w`` index ``g, x2, x3``), ``d2`` by ``m2`` (``x1, g, x3``), ``d3`` by ``w``
    (``x1, x2, g``), each written as ``modes[i]`` says (private copies ``private_sizes[i]`` apart);
    ``partial[task, k]`` the task's share of ``dC[k]``."""
    c1, c2, c3 = _permuted(c, o1), _permuted(c, o2), _permuted(c, o3)
    for task in numba.prange(tasks):
        t1, t2, t3, offsets, targets = _scratch(sizes, table.shape[0], x1.dtype)
        tg = np.empty((sizes[3], BLOCK), dtype=x1.dtype)
        # one C-contiguous block per gradient (a row slice of a shared block types as non-contiguous)
        a1 = np.empty((sizes[0], BLOCK), dtype=x1.dtype)
        a2 = np.empty((sizes[1], BLOCK), dtype=x1.dtype)
        a3 = np.empty((sizes[2], BLOCK), dtype=x1.dtype)
        ahead = np.empty((4, 2), dtype=np.int64)
        sources = (x1, x2, x3, g)
        end = min(rows, (task + 1) * span)
        for first in range(task * span, end, BLOCK):
            n = min(BLOCK, end - first)
            _load(first, n, B, table, x1, x2, x3, weighted, t1, t2, t3, offsets, targets)
            _gather(g, table[3], first, n, offsets[3], tg)
            _ahead(table, sizes, first + n, min(BLOCK, end - first - n), weighted, ahead)
            if modes[0] != _SKIP:  # dX1[m1] += C G[mu] X2[m2] (W[w]), and dC from the same products
                a1[:] = 0
                if want_c:
                    _products_and_sums(a1, tg, t2, t3, c1, f1a, f1b, f1w, starts1, n, weighted, t1, o1,
                                       partial[task], zero, sources, ahead)
                else:
                    _any_products(a1, tg, t2, t3, c1, f1a, f1b, f1w, starts1, n, weighted, sources, ahead)
                _write(a1, first, n, d1, targets[0], modes[0], task, private_sizes[0])
            if modes[1] != _SKIP:  # dX2[m2] += C X1[m1] G[mu] (W[w])
                a2[:] = 0
                _any_products(a2, t1, tg, t3, c2, f2a, f2b, f2w, starts2, n, weighted, sources, ahead)
                _write(a2, first, n, d2, targets[1], modes[1], task, private_sizes[1])
            if modes[2] != _SKIP:  # dW[w] += C X1[m1] X2[m2] G[mu]
                a3[:] = 0
                _weighted_products(a3, t1, t2, tg, c3, f3a, f3b, f3c, starts3, n, sources, ahead)
                _write(a3, first, n, d3, targets[2], modes[2], task, private_sizes[2])
            if want_c and modes[0] == _SKIP:  # dC[k] = sum over rows of G[mu] X1[m1] X2[m2] (W[w])
                for k in range(m1.shape[0]):
                    u, v, s = tg[mu[k]], t1[m1[k]], t2[m2[k]]
                    total = zero
                    if weighted:
                        q = t3[w[k]]
                        for r in range(n):
                            total += u[r] * v[r] * s[r] * q[r]
                    else:
                        for r in range(n):
                            total += u[r] * v[r] * s[r]
                    partial[task, k] += total


def _source_tag() -> str:
    """A digest of the kernel sources (this file and the helper modules compiled into its kernels)."""
    digest = hashlib.sha256()
    for path in (__file__, numba_prefetch.__file__, numba_transpose.__file__):
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:12]


_SOURCE_TAG = _source_tag()


def _cached(function, name: str, **options):
    """``function`` compiled with numba's disk cache, as a function named ``name`` and the digest of the kernel
    sources. numba's cache keys compiled code by function name and signature, not by options, so each variant
    (the parallel kernels and their serial twins) needs a name of its own; and it checks only the file of the
    function it caches, so without the digest a change to a helper in another file would go unnoticed."""
    name = f"{name}_{_SOURCE_TAG}"
    named = types.FunctionType(function.__code__, function.__globals__, name, function.__defaults__,
                               function.__closure__)
    named.__qualname__ = name
    return numba.njit(cache=True, **options)(named)


# serial twins: prange runs as range, no thread pool
_forward_serial = _cached(_forward, "_forward_serial", fastmath={"contract"})
_backward_serial = _cached(_backward, "_backward_serial", fastmath={"contract", "reassoc"})
_forward = _cached(_forward, "_forward", parallel=True, fastmath={"contract"})
_backward = _cached(_backward, "_backward", parallel=True, fastmath={"contract", "reassoc"})


@intrinsic
def _pointer(typingctx, address, zero):
    """The integer ``address`` as a pointer to elements of the type of ``zero``."""
    pointer = nbtypes.CPointer(zero)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(address, zero), codegen


@numba.njit(inline="always")
def _array(address, count, zero):
    """The ``count`` elements at ``address`` as a 1-D array; the caller keeps the memory alive."""
    return numba.carray(_pointer(address, zero), count)


# Entry points. The host passes each tensor as its data address and the number of elements the kernel may
# touch (a few hundred nanoseconds less per tensor than a numpy view); arrays are made here, outside the
# parallel kernels (numba's parallel passes treat arrays made inside them as local and drop their writes).


def _forward_at(parallel, addresses, spans, zero, table, sizes, order, i1, i2, i3, starts, shape):
    """:func:`_forward` (or its serial twin) with X1, X2, W, C and out at ``addresses`` (``spans`` elements
    each), ``zero`` of the compute dtype, ``shape = (rows, B, span, tasks, weighted)``."""
    x1, x2, x3 = _array(addresses[0], spans[0], zero), _array(addresses[1], spans[1], zero), \
        _array(addresses[2], spans[2], zero)
    c, out = _array(addresses[3], spans[3], zero), _array(addresses[4], spans[4], zero)
    rows, B, span, tasks, weighted = shape[0], shape[1], shape[2], shape[3], shape[4] != 0
    if parallel:
        _forward(x1, x2, x3, table, sizes, c, order, i1, i2, i3, starts, out, rows, B, span, tasks, weighted)
    else:
        _forward_serial(x1, x2, x3, table, sizes, c, order, i1, i2, i3, starts, out, rows, B, span, tasks,
                        weighted)


@numba.njit(inline="always")
def _gradient(address, size, mode, tasks, zero, like):
    """Where the kernel writes a gradient of ``size`` elements: the target itself (zeroed where it adds), or
    ``tasks`` private copies of it (of ``like``'s dtype) for :data:`_ADD_PRIVATE`."""
    if mode == _ADD_PRIVATE:
        return np.zeros(tasks * size, dtype=like.dtype)
    target = _array(address, size if mode != _SKIP else 0, zero)
    if mode == _ADD_SHARED:
        target[:] = 0
    return target


@numba.njit(inline="always")
def _sum_copies(copies, address, size, tasks, zero):
    """The target at ``address`` = the sum of the ``tasks`` private copies, in task order."""
    target = _array(address, size, zero)
    for j in range(size):
        total = copies[j]
        for task in range(1, tasks):
            total += copies[task * size + j]
        target[j] = total


def _backward_at(parallel, addresses, spans, zero, table, sizes, grouped, index, modes, private_sizes, shape):
    """:func:`_backward` (or its serial twin) with G, X1, X2, W, C at ``addresses[:5]`` and the gradients dX1,
    dX2, dW, dC written to ``addresses[5:]`` (``spans`` elements each); ``grouped``: the 15 sorted index
    arrays, ``index``: m1, m2, mu, w; ``shape = (rows, B, span, tasks, weighted, want_c)``. Private copies
    of gradients and the per-task shares of dC are summed in task order (dC in float64)."""
    g, x1 = _array(addresses[0], spans[0], zero), _array(addresses[1], spans[1], zero)
    x2, x3 = _array(addresses[2], spans[2], zero), _array(addresses[3], spans[3], zero)
    c = _array(addresses[4], spans[4], zero)
    rows, B, span, tasks = shape[0], shape[1], shape[2], shape[3]
    weighted, want_c = shape[4] != 0, shape[5] != 0
    d1 = _gradient(addresses[5], private_sizes[0], modes[0], tasks, zero, c)
    d2 = _gradient(addresses[6], private_sizes[1], modes[1], tasks, zero, c)
    d3 = _gradient(addresses[7], private_sizes[2], modes[2], tasks, zero, c)
    nnz = index[0].shape[0]
    partial = np.zeros((tasks if want_c else 0, nnz), dtype=x1.dtype)
    o1, s1, f1a, f1b, f1w, o2, s2, f2a, f2b, f2w, o3, s3, f3a, f3b, f3c = grouped
    m1, m2, mu, w = index
    if parallel:
        _backward(g, x1, x2, x3, table, sizes, c, o1, f1a, f1b, f1w, s1, o2, f2a, f2b, f2w, s2, o3, f3a, f3b, f3c,
                  s3, m1, m2, mu, w, d1, d2, d3, modes, private_sizes, partial, rows, B, span, tasks, weighted,
                  want_c, zero)
    else:
        _backward_serial(g, x1, x2, x3, table, sizes, c, o1, f1a, f1b, f1w, s1, o2, f2a, f2b, f2w, s2, o3, f3a,
                         f3b, f3c, s3, m1, m2, mu, w, d1, d2, d3, modes, private_sizes, partial, rows, B, span,
                         tasks, weighted, want_c, zero)
    for i, d in enumerate((d1, d2, d3)):
        if modes[i] == _ADD_PRIVATE:
            _sum_copies(d, addresses[5 + i], private_sizes[i], tasks, zero)
    if want_c:
        dc = _array(addresses[8], nnz, zero)
        for k in range(nnz):
            total = 0.0
            for task in range(tasks):
                total += partial[task, k]
            dc[k] = total


_forward_at = _cached(_forward_at, "_forward_at")
_backward_at = _cached(_backward_at, "_backward_at")


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
    """``([A_i, B_i, s_a, s_b, col_stride, linear, 0], span)`` of an operand in the compute dtype: its line of
    the kernels' table (:func:`_address`) and the number of elements from its data pointer that the kernels
    may read. ``linear``: its rows, in the order of the row space, lie one after the other (row ``r`` at
    ``r * M``); the last entry, ``reduced``, is set by the backward for gradients that add into targets."""
    A_i, B_i, s_a, s_b = folded
    M, col_stride = t.shape[-1], t.stride(-1)
    if A_i * B_i * M == 0:
        return [A_i, B_i, 0, 0, 0, 0, 0], 0
    linear = (A_i == rows.A and B_i == rows.B and col_stride == 1 and (s_b == M or rows.B == 1)
              and (s_a == rows.B * M or rows.A == 1))
    span = 1 + (A_i - 1) * s_a + (B_i - 1) * s_b + (M - 1) * col_stride
    return [A_i, B_i, s_a, s_b, col_stride, int(linear), 0], span


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
    return rule._cached(("numba", name, factors), build)


def _zero(dtype: torch.dtype):
    return buffers.NUMPY_DTYPES[dtype](0)


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
            table = np.array(list(lines) + ([] if weighted else [[1, 1, 0, 0, 0, 1, 0]]), dtype=np.int64)
            sizes = np.array([*rule.input_sizes, rule.weight_size if weighted else 1, O], dtype=np.int64)
            order, starts, i1, i2, i3 = _grouped(rule, "mu", ("m1", "m2", "w" if weighted else None))
            tasks, span = _tasks(count, rows.B, False)
            spans = (*spans, *([] if weighted else spans[:1]), rule.nnz, count * O)
            return spans, _zero(dtype), table, sizes, order, i1, i2, i3, starts, \
                (count, rows.B, span, tasks, int(weighted))

        plan = _plans.get(("fwd", rule.key, rows, dtype, folds, tuple(t.stride(-1) for t in operands)), build)
        c = _coefficients(C, dtype)
        weights = operands[2] if weighted else operands[0]  # X1 holds the place of a missing W (never read)
        addresses = (operands[0].data_ptr(), operands[1].data_ptr(), weights.data_ptr(), c.data_ptr(),
                     out.data_ptr())
        with _lock:
            _forward_at(count >= SERIAL_ROWS, addresses, *plan)
    return out if dtype == X1.dtype else out.to(X1.dtype)


def _gradient_mode(folded, rows, wanted: bool, aligned: bool, tasks: int) -> int:
    """How tasks write the gradient of an operand of extents ``folded[:2]``."""
    A_i, B_i = folded[:2]
    if not wanted:
        return _SKIP
    if A_i * B_i == rows.count:
        return _STORE
    if tasks == 1 or (A_i == rows.A and B_i == 1 and aligned):
        return _ADD_SHARED
    return _ADD_PRIVATE


def _backward_plan(rows, lines, spans, wanted, want_c, rule, weighted, zero) -> tuple:
    """The arguments of :func:`_backward_at` after ``parallel`` and the addresses."""
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
    table[:3, 6] = modes >= _ADD_SHARED
    if not weighted:
        table[2, 5] = 1  # the placeholder of W is never read
    sizes = [*rule.input_sizes, rule.weight_size if weighted else 1, rule.output_size]
    private_sizes = np.array([A_i * B_i * M for (A_i, B_i), M in zip(folds, sizes)], dtype=np.int64)
    w_name = "w" if weighted else None
    grouped = (_grouped(rule, "m1", ("mu", "m2", w_name)) + _grouped(rule, "m2", ("m1", "mu", w_name))
               + (_grouped(rule, "w", ("m1", "m2", "mu")) if weighted
                  else _grouped(rule, "m1", ("mu", "mu", "mu"))))  # the last is unused without W
    index = tuple(np.ascontiguousarray(rule.array(n) if n else np.zeros(rule.nnz, np.int64), dtype=np.int64)
                  for n in ("m1", "m2", "mu", w_name))
    # G first, then X1, X2, W (X1 in its place without weights), C and the gradients
    spans = (spans[3], *spans[:3], rule.nnz, *(int(n) if m != _SKIP else 0 for n, m in zip(private_sizes, modes)),
             rule.nnz if want_c else 0)
    shape = (rows.count, rows.B, span, tasks, int(weighted), int(want_c))
    return (spans, zero, table, np.array(sizes, dtype=np.int64), grouped, index, modes,
            private_sizes, shape)


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

    plan = _plans.get(("bwd", rule.key, rows, dtype, wanted, want_c, folds, g_fold,
                       tuple(t.stride(-1) for t in tensors)), build)
    grads = [buffers.tensor(t.shape, dtype) if w else None for t, w in zip(originals, wanted)]
    grads += [None] * (3 - len(grads))
    dC = torch.empty(rule.nnz, dtype=dtype) if want_c else None
    c = _coefficients(C, dtype)
    addresses = (G.data_ptr(), tensors[0].data_ptr(), tensors[1].data_ptr(), tensors[2].data_ptr(), c.data_ptr(),
                 *(c.data_ptr() if d is None else d.data_ptr() for d in (*grads, dC)))
    with _lock:
        _backward_at(rows.count >= SERIAL_ROWS, addresses, *plan)
    if dtype != X1.dtype:
        grads, dC = [None if d is None else d.to(X1.dtype) for d in grads], None if dC is None else dC.to(X1.dtype)
    return grads[0], grads[1], grads[2], dC
