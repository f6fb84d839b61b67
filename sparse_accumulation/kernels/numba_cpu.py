"""CPU kernels with numba: row-blocked, parallel over blocks of rows, no races, no ``[rows, nnz]`` buffer.

Each parallel iteration copies a block of rows of every input into component-major scratch (``[M, block]``),
so that the work runs as contiguous, vectorizable loops over the rows of the block; results are written back
row-major. Nonzeros are visited grouped by the component they write (the rule sorted by ``mu`` for the
forward, by ``m1`` / ``m2`` for the input gradients) and four at a time, so each accumulator row is loaded
and stored once per four products. Arrays reach numba as flat buffers plus (row, component) strides, so one
compiled specialization per dtype serves every memory layout (transposed and broadcast views included).

16-bit inputs are computed in float32. numba's default threading layer is not safe for concurrent calls
from several Python threads, so calls are serialized with a lock (each call already uses every core).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import numba
import numpy as np
import torch

from .. import layout
from . import accumulation_dtype

FORWARD_BLOCK = 128
BACKWARD_BLOCK = 128

#: below this many rows a call runs on one thread: waking the thread pool costs more than the work
SERIAL_ROWS = 512

_lock = threading.Lock()


@contextmanager
def _launch(rows: int):
    """Serialize kernel calls (numba's thread pool is not reentrant) and pick the thread count."""
    with _lock:
        if rows >= SERIAL_ROWS:
            yield
            return
        previous = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            yield
        finally:
            numba.set_num_threads(previous)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


@numba.njit(inline="always")
def _load_block(x, row_stride, col_stride, first_row, n, scratch):
    for r in range(n):
        base = (first_row + r) * row_stride
        for m in range(scratch.shape[0]):
            scratch[m, r] = x[base + m * col_stride]


@numba.njit(inline="always")
def _store_block(scratch, first_row, n, out):
    width = scratch.shape[0]
    for r in range(n):
        base = (first_row + r) * width
        for j in range(width):
            out[base + j] = scratch[j, r]


@numba.njit(inline="always")
def _grouped_products(target, a, b, c, ia, ib, starts, n):
    """``target[j, :n] += sum over k in group j of c[k] * a[ia[k], :n] * b[ib[k], :n]``."""
    for j in range(target.shape[0]):
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
def _grouped_products_and_sums(target, own, a, b, c, ia, ib, starts, order, n, partial, zero):
    """:func:`_grouped_products`, plus ``partial[order[k]] = sum_r own[j, r] * a[ia[k], r] * b[ib[k], r]``.

    With ``target`` the gradient of ``own`` this gives dC for free: the products ``a * b`` are already loaded.
    """
    for j in range(target.shape[0]):
        o = target[j]
        x = own[j]
        k = starts[j]
        end = starts[j + 1]
        while k + 4 <= end:
            a0, b0, c0 = a[ia[k]], b[ib[k]], c[k]
            a1, b1, c1 = a[ia[k + 1]], b[ib[k + 1]], c[k + 1]
            a2, b2, c2 = a[ia[k + 2]], b[ib[k + 2]], c[k + 2]
            a3, b3, c3 = a[ia[k + 3]], b[ib[k + 3]], c[k + 3]
            s0 = s1 = s2 = s3 = zero
            for r in range(n):
                p0 = a0[r] * b0[r]
                p1 = a1[r] * b1[r]
                p2 = a2[r] * b2[r]
                p3 = a3[r] * b3[r]
                o[r] += (c0 * p0 + c1 * p1) + (c2 * p2 + c3 * p3)
                s0 += x[r] * p0
                s1 += x[r] * p1
                s2 += x[r] * p2
                s3 += x[r] * p3
            partial[order[k]] = s0
            partial[order[k + 1]] = s1
            partial[order[k + 2]] = s2
            partial[order[k + 3]] = s3
            k += 4
        while k < end:
            a0, b0, c0 = a[ia[k]], b[ib[k]], c[k]
            s0 = zero
            for r in range(n):
                p0 = a0[r] * b0[r]
                o[r] += c0 * p0
                s0 += x[r] * p0
            partial[order[k]] = s0
            k += 1


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _forward(x1, s1r, s1m, M1, x2, s2r, s2m, M2, c, m1, m2, starts, out, output_size, rows, block):
    n_blocks = (rows + block - 1) // block
    for index in numba.prange(n_blocks):
        first = index * block
        n = min(block, rows - first)
        t1 = np.empty((M1, block), dtype=out.dtype)
        t2 = np.empty((M2, block), dtype=out.dtype)
        acc = np.zeros((output_size, block), dtype=out.dtype)
        _load_block(x1, s1r, s1m, first, n, t1)
        _load_block(x2, s2r, s2m, first, n, t2)
        _grouped_products(acc, t1, t2, c, m1, m2, starts, n)
        _store_block(acc, first, n, out)


@numba.njit(parallel=True, cache=True, fastmath={"contract", "reassoc"})
def _backward(g, sgr, sgm, output_size, x1, s1r, s1m, M1, x2, s2r, s2m, M2,
              c_1, mu_1, m2_1, starts_1, order_1, c_2, m1_2, mu_2, starts_2, m1, m2, mu,
              d1, d2, partial, rows, block, zero, want_x1, want_x2, want_c):
    n_blocks = (rows + block - 1) // block
    for index in numba.prange(n_blocks):
        first = index * block
        n = min(block, rows - first)
        tg = np.empty((output_size, block), dtype=x1.dtype)
        t1 = np.empty((M1, block), dtype=x1.dtype)
        t2 = np.empty((M2, block), dtype=x1.dtype)
        _load_block(g, sgr, sgm, first, n, tg)
        _load_block(x1, s1r, s1m, first, n, t1)
        _load_block(x2, s2r, s2m, first, n, t2)
        if want_x1:  # dX1[m1] += C G[mu] X2[m2], grouped by m1 (and dC on the way when wanted)
            a1 = np.zeros((M1, block), dtype=x1.dtype)
            if want_c:
                _grouped_products_and_sums(a1, t1, tg, t2, c_1, mu_1, m2_1, starts_1, order_1, n,
                                           partial[index], zero)
            else:
                _grouped_products(a1, tg, t2, c_1, mu_1, m2_1, starts_1, n)
            _store_block(a1, first, n, d1)
        if want_x2:  # dX2[m2] += C X1[m1] G[mu], grouped by m2
            a2 = np.zeros((M2, block), dtype=x1.dtype)
            _grouped_products(a2, t1, tg, c_2, m1_2, mu_2, starts_2, n)
            _store_block(a2, first, n, d2)
        if want_c and not want_x1:  # dC[k] = sum_r G[mu] X1[m1] X2[m2], one partial sum per block
            for k in range(m1.shape[0]):
                u, v, w = tg[mu[k]], t1[m1[k]], t2[m2[k]]
                total = zero
                for r in range(n):
                    total += u[r] * v[r] * w[r]
                partial[index, k] = total


def _flat(x: torch.Tensor, dtype: torch.dtype):
    """``(buffer, row_stride, col_stride)`` for a 2-D tensor: a flat numpy view spanning its elements."""
    x = x.detach()
    if x.dtype != dtype:
        x = x.to(dtype)
    rows, cols = x.shape
    row_stride, col_stride = x.stride()
    if rows == 0 or cols == 0:
        return np.zeros(1, dtype=_NUMPY[dtype]), 0, 0
    span = 1 + (rows - 1) * row_stride + (cols - 1) * col_stride
    return x.as_strided((span,), (1,)).numpy(), row_stride, col_stride


def _empty(shape, dtype: torch.dtype) -> torch.Tensor:
    # numpy asks for transparent huge pages on large buffers; first-touch page faults of a fresh torch
    # allocation cost as much as the whole kernel on some machines.
    return torch.from_numpy(np.empty(shape, dtype=_NUMPY[dtype]))


def _coefficients(C: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    return C.detach().to(dtype).contiguous().numpy()


def _accumulate_rows(X1, X2, C, rule, output_size):
    """``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] * C[k]`` on 2-D ``[rows, M]`` operands."""
    dtype = accumulation_dtype(X1.dtype)
    rows = X1.shape[0]
    out = _empty((rows, output_size), dtype)
    if rows and output_size:
        order, starts = rule.grouped_by("mu")
        m1, m2 = rule.array("m1"), rule.array("m2")
        x1, s1r, s1m = _flat(X1, dtype)
        x2, s2r, s2m = _flat(X2, dtype)
        c = _coefficients(C, dtype)[order]
        with _launch(rows):
            _forward(x1, s1r, s1m, X1.shape[1], x2, s2r, s2m, X2.shape[1], c, m1[order], m2[order], starts,
                     out.view(-1).numpy(), output_size, rows, FORWARD_BLOCK)
    return out.to(X1.dtype)


def _backward_rows(G, X1, X2, C, rule, want_x1=True, want_x2=True, want_c=True):
    """Gradients ``(dX1, dX2, dC)`` of :func:`_accumulate_rows` in one pass over the rows (``None`` where not
    wanted)."""
    dtype = accumulation_dtype(X1.dtype)
    rows, (M1, M2) = X1.shape[0], rule.input_sizes
    d1 = _empty((rows, M1) if want_x1 else (0,), dtype)
    d2 = _empty((rows, M2) if want_x2 else (0,), dtype)
    n_blocks = (rows + BACKWARD_BLOCK - 1) // BACKWARD_BLOCK
    partial = np.zeros((n_blocks if want_c else 0, rule.nnz), dtype=_NUMPY[dtype])
    if rows and (want_x1 or want_x2 or want_c):
        m1, m2, mu = rule.array("m1"), rule.array("m2"), rule.array("mu")
        order_1, starts_1 = rule.grouped_by("m1")
        order_2, starts_2 = rule.grouped_by("m2")
        g, sgr, sgm = _flat(G, dtype)
        x1, s1r, s1m = _flat(X1, dtype)
        x2, s2r, s2m = _flat(X2, dtype)
        c = _coefficients(C, dtype)
        with _launch(rows):
            _backward(g, sgr, sgm, G.shape[1], x1, s1r, s1m, M1, x2, s2r, s2m, M2,
                      c[order_1], mu[order_1], m2[order_1], starts_1, order_1,
                      c[order_2], m1[order_2], mu[order_2], starts_2, m1, m2, mu,
                      d1.view(-1).numpy(), d2.view(-1).numpy(), partial, rows, BACKWARD_BLOCK,
                      _NUMPY[dtype](0), want_x1, want_x2, want_c)
    # dC sums the per-block partials in float64 in a fixed order: deterministic and accurate.
    dC = torch.from_numpy(partial.sum(axis=0, dtype=np.float64)).to(X1.dtype) if want_c else None
    return (d1.to(X1.dtype) if want_x1 else None, d2.to(X1.dtype) if want_x2 else None, dC)


def _rows(t, folded, A, B):
    return layout.view3(t, folded).expand(A, B, t.shape[-1]).reshape(A * B, t.shape[-1])


def _reduced(grad, like, folded, A, B):
    grad = grad.reshape(A, B, grad.shape[1])
    if folded[1] == 1 and B != 1:
        grad = grad.sum(1, keepdim=True)
    if folded[0] == 1 and A != 1:
        grad = grad.sum(0, keepdim=True)
    return grad.reshape(like.shape).contiguous()


def accumulate(X1, X2, W, C, rule, rows):
    """``out[..., mu[k]] += X1[m1[k]] * X2[m2[k]] * C[k]``; see :mod:`sparse_accumulation.kernels`."""
    if W is not None:
        raise NotImplementedError("the numba kernels do not support weighted rules yet")
    A, B = rows.A, rows.B
    (f1, f2) = rows.operands
    out = _accumulate_rows(_rows(X1, f1, A, B), _rows(X2, f2, A, B), C, rule, rule.output_size)
    return out.reshape(*rows.lead, rule.output_size)


def accumulate_backward(G, X1, X2, W, C, rule, rows, want_x1=True, want_x2=True, want_w=False, want_c=True):
    """Gradients ``(dX1, dX2, dW, dC)``; see :mod:`sparse_accumulation.kernels`."""
    if W is not None:
        raise NotImplementedError("the numba kernels do not support weighted rules yet")
    A, B = rows.A, rows.B
    (f1, f2) = rows.operands
    if A * B == 0:
        return (X1.new_zeros(X1.shape) if want_x1 else None, X2.new_zeros(X2.shape) if want_x2 else None, None,
                C.new_zeros(C.shape) if want_c else None)
    G = G.reshape(A * B, G.shape[-1])
    d1, d2, dC = _backward_rows(G, _rows(X1, f1, A, B), _rows(X2, f2, A, B), C, rule, want_x1, want_x2, want_c)
    return (None if d1 is None else _reduced(d1, X1, f1, A, B), None if d2 is None else _reduced(d2, X2, f2, A, B),
            None, dC)
