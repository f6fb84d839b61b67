"""CPU kernels with numba: row-blocked, parallel over blocks of rows, no races, no ``[rows, nnz]`` buffer.

Each parallel iteration copies a block of ``BLOCK`` rows of every input into component-major scratch
(``[M, BLOCK]``), so that the loop over nonzeros runs a contiguous, vectorizable loop over the rows of the
block; the output block is then written back. Arrays reach numba as flat buffers plus (row, component)
strides, so one compiled specialization per dtype serves every memory layout (transposed views included).

16-bit inputs are computed in float32. numba's default threading layer is not safe for concurrent calls
from several Python threads, so calls are serialized with a lock (each call already uses every core).
"""
from __future__ import annotations

import threading

import numba
import numpy as np
import torch

BLOCK = 128

_lock = threading.Lock()


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


@numba.njit(parallel=True, cache=True, fastmath={"contract"})
def _forward(x1, s1r, s1m, M1, x2, s2r, s2m, M2, c, m1, m2, mu, out, output_size, rows):
    n_blocks = (rows + BLOCK - 1) // BLOCK
    for block in numba.prange(n_blocks):
        first = block * BLOCK
        n = min(BLOCK, rows - first)
        t1 = np.empty((M1, BLOCK), dtype=out.dtype)
        t2 = np.empty((M2, BLOCK), dtype=out.dtype)
        acc = np.zeros((output_size, BLOCK), dtype=out.dtype)
        _load_block(x1, s1r, s1m, first, n, t1)
        _load_block(x2, s2r, s2m, first, n, t2)
        for k in range(c.shape[0]):
            ck = c[k]
            a = t1[m1[k]]
            b = t2[m2[k]]
            o = acc[mu[k]]
            for r in range(n):
                o[r] += ck * a[r] * b[r]
        _store_block(acc, first, n, out)


@numba.njit(parallel=True, cache=True, fastmath={"contract", "reassoc"})
def _backward(g, sgr, sgm, output_size, x1, s1r, s1m, M1, x2, s2r, s2m, M2, c, m1, m2, mu,
              d1, d2, partial, rows, zero, want_x1, want_x2, want_c):
    n_blocks = (rows + BLOCK - 1) // BLOCK
    for block in numba.prange(n_blocks):
        first = block * BLOCK
        n = min(BLOCK, rows - first)
        tg = np.empty((output_size, BLOCK), dtype=x1.dtype)
        t1 = np.empty((M1, BLOCK), dtype=x1.dtype)
        t2 = np.empty((M2, BLOCK), dtype=x1.dtype)
        a1 = np.zeros((M1, BLOCK), dtype=x1.dtype)
        a2 = np.zeros((M2, BLOCK), dtype=x1.dtype)
        _load_block(g, sgr, sgm, first, n, tg)
        _load_block(x1, s1r, s1m, first, n, t1)
        _load_block(x2, s2r, s2m, first, n, t2)
        for k in range(m1.shape[0]):
            gk = tg[mu[k]]
            u = t1[m1[k]]
            v = t2[m2[k]]
            ck = c[k]
            if want_x1 and want_x2 and want_c:
                # The common case in one loop: each operand is loaded once for all three gradients.
                o1 = a1[m1[k]]
                o2 = a2[m2[k]]
                total = zero
                for r in range(n):
                    cg = ck * gk[r]
                    o1[r] += cg * v[r]
                    o2[r] += cg * u[r]
                    total += gk[r] * u[r] * v[r]
                partial[block, k] = total
                continue
            if want_x1:
                o = a1[m1[k]]
                for r in range(n):
                    o[r] += ck * gk[r] * v[r]
            if want_x2:
                o = a2[m2[k]]
                for r in range(n):
                    o[r] += ck * gk[r] * u[r]
            if want_c:
                total = zero
                for r in range(n):
                    total += gk[r] * u[r] * v[r]
                partial[block, k] = total
        if want_x1:
            _store_block(a1, first, n, d1)
        if want_x2:
            _store_block(a2, first, n, d2)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


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


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def accumulate(X1, X2, C, rule, output_size):
    """``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] * C[k]``; see :mod:`sparse_accumulation.kernels`."""
    dtype = _compute_dtype(X1.dtype)
    rows = X1.shape[0]
    out = torch.empty(rows, output_size, dtype=dtype)
    if rows and output_size:
        m1, m2, mu = rule.numpy()
        x1, s1r, s1m = _flat(X1, dtype)
        x2, s2r, s2m = _flat(X2, dtype)
        c = C.detach().to(dtype).contiguous().numpy()
        with _lock:
            _forward(x1, s1r, s1m, X1.shape[1], x2, s2r, s2m, X2.shape[1], c, m1, m2, mu,
                     out.view(-1).numpy(), output_size, rows)
    return out.to(X1.dtype)


def accumulate_backward(G, X1, X2, C, rule, want_x1=True, want_x2=True, want_c=True):
    """Fused gradients ``(dX1, dX2, dC)`` of the forward for the output gradient ``G`` in one pass over rows.

    Entries not wanted come back as ``None``. See :mod:`sparse_accumulation.kernels`.
    """
    dtype = _compute_dtype(X1.dtype)
    rows, (M1, M2) = X1.shape[0], rule.input_sizes
    d1 = torch.zeros(rows, M1, dtype=dtype) if want_x1 else torch.empty(0, dtype=dtype)
    d2 = torch.zeros(rows, M2, dtype=dtype) if want_x2 else torch.empty(0, dtype=dtype)
    partial = np.zeros(((rows + BLOCK - 1) // BLOCK if want_c else 0, rule.nnz), dtype=_NUMPY[dtype])
    if rows and rule.nnz and (want_x1 or want_x2 or want_c):
        m1, m2, mu = rule.numpy()
        g, sgr, sgm = _flat(G, dtype)
        x1, s1r, s1m = _flat(X1, dtype)
        x2, s2r, s2m = _flat(X2, dtype)
        c = C.detach().to(dtype).contiguous().numpy()
        with _lock:
            _backward(g, sgr, sgm, G.shape[1], x1, s1r, s1m, M1, x2, s2r, s2m, M2, c, m1, m2, mu,
                      d1.view(-1).numpy(), d2.view(-1).numpy(), partial, rows, _NUMPY[dtype](0),
                      want_x1, want_x2, want_c)
    # dC sums the per-block partials in float64 in a fixed order: deterministic and accurate.
    dC = torch.from_numpy(partial.sum(axis=0, dtype=np.float64)).to(X1.dtype) if want_c else None
    return (d1.to(X1.dtype) if want_x1 else None, d2.to(X1.dtype) if want_x2 else None, dC)
