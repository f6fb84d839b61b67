"""The steps of the numba kernels on one block of rows: address, gather, multiply, write back.

A block of every operand is gathered into component-major scratch (``[M, block]``) so that the products run
as contiguous, vectorizable loops over the rows of the block, and results are scattered back to rows (rows
that lie one after the other move in vector tiles, :mod:`.transpose`); the products prefetch the next
block's rows (:mod:`.prefetch`). Rows are addressed through the table of
:mod:`sparse_accumulation.kernels.numba.accumulate` (row ``r = a * B + b`` of operand ``i`` starts at
``a * s_a + b * s_b``), so broadcast operands are read in place, with stride 0, never expanded. Nonzeros are
visited grouped by the component they write, so each accumulator row is loaded and stored once per several
products.

The plain and weighted products, like the small steps, are copied into their call site by numba
(``inline="always"``: one call site each in the kernel, :mod:`.accumulate_kernel`); compiled as functions of their
own they made a 2x2->2 forward 15-20% slower for the same compile time. The products that also sum the
gradient of C, and the coefficient sums, stay compiled functions of their own (:data:`LEAF`).
"""
from __future__ import annotations

import numba

from .prefetch import share
from .transpose import columns_to_rows, rows_to_columns

#: rows per block of scratch: long enough for the vector loops, short enough to stay in L1/L2
BLOCK = 256

#: options of the functions called only from compiled code: no wrappers to call them from Python or C
LEAF = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}

# how a task writes the gradient of an operand
SKIP, STORE, ADD_SHARED, ADD_PRIVATE = 0, 1, 2, 3


@numba.njit(inline="always")
def gather(x, row, first, n, offsets, scratch):
    """``scratch[m, r]``: component ``m`` of row ``first + r`` of an operand (``row``: its line of the table).
    Rows that lie one after the other in memory are transposed as a block (:mod:`.transpose`)."""
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
def write(scratch, first, n, d, targets, mode, task, private_size):
    """Write a block of an operand's gradient as its ``mode`` says: rows ``first .. first + n`` of the
    contiguous ``d`` (:data:`STORE`), or added to their targets in ``d`` (:data:`ADD_SHARED`) or in the task's
    private copy of it (:data:`ADD_PRIVATE`, copies ``private_size`` apart), in row order (several rows may
    share a target)."""
    width = scratch.shape[0]
    if mode == STORE:
        columns_to_rows(scratch, first * width, n, d)
    elif mode != SKIP:
        base = task * private_size if mode == ADD_PRIVATE else 0
        for j in range(width):
            t = scratch[j]
            for r in range(n):
                d[base + targets[r] * width + j] += t[r]


# fastmath: "contract" fuses multiply-adds; sums over rows also need "reassoc" to vectorize


@numba.njit(inline="always", fastmath={"contract"})
def products(target, a, b, c, ia, ib, starts, n, sources, ahead):
    """``target[j, :n] += sum over k in group j of c[k] * a[ia[k], :n] * b[ib[k], :n]``, prefetching the
    ranges ``ahead`` of ``sources`` on the way (:func:`.prefetch.share`), once."""
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
    ahead[:, 1] = 0


@numba.njit(inline="always", fastmath={"contract"})
def weighted_products(target, a, b, w, c, ia, ib, iw, starts, n, sources, ahead):
    """``target[j, :n] += sum over k in group j of c[k] * a[ia[k], :n] * b[ib[k], :n] * w[iw[k], :n]`` (and
    prefetches as :func:`products`)."""
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
    ahead[:, 1] = 0


@numba.njit(**LEAF, fastmath={"contract", "reassoc"})
def products_and_sums(target, a, b, w, c, ia, ib, iw, starts, n, weighted, x, order, partial, zero, sources,
                      ahead):
    """:func:`products` (:func:`weighted_products` if ``weighted``), and for each nonzero ``k`` of group ``j``:
    ``partial[order[k]] +=`` the sum over the rows of its product without ``c`` times ``x[j]``. With the groups
    by ``m1`` and ``x`` the block of X1, that is the share of ``dC`` of the rows, from the products the
    gradient of X1 computes anyway."""
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


@numba.njit(**LEAF, fastmath={"contract", "reassoc"})
def coefficient_sums(tg, t1, t2, t3, m1, m2, mu, w, nnz, n, weighted, partial, zero):
    """``partial[k] +=`` the sum over the block's rows of ``G[mu] X1[m1] X2[m2] (W[w])`` for ``k < nnz``: the
    share of ``dC`` of the rows when no gradient of X1 is computed."""
    for k in range(nnz):
        u, v, s = tg[mu[k]], t1[m1[k]], t2[m2[k]]
        total = zero
        if weighted:
            q = t3[w[k]]
            for r in range(n):
                total += u[r] * v[r] * s[r] * q[r]
        else:
            for r in range(n):
                total += u[r] * v[r] * s[r]
        partial[k] += total
