"""Portable torch kernels (any device): gather and ``index_add`` over bounded chunks of rows.

The fallback when neither numba (CPU) nor Triton (CUDA) is available. Work per chunk is ``[chunk, nnz]``,
with the chunk sized so that this intermediate stays under about :data:`CHUNK_ELEMENTS` elements.
"""
from __future__ import annotations

import torch

from . import accumulation_dtype

CHUNK_ELEMENTS = 1 << 22


def _chunk_rows(nnz: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(nnz, 1))


def accumulate(X1, X2, C, rule, output_size):
    """``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] * C[k]``; see :mod:`sparse_accumulation.kernels`."""
    dtype = accumulation_dtype(X1.dtype)
    m1, m2, mu = (rule.tensor(name, X1.device) for name in ("m1", "m2", "mu"))
    out = torch.zeros(X1.shape[0], output_size, dtype=dtype, device=X1.device)
    coefficients = C.to(dtype)
    step = _chunk_rows(rule.nnz)
    for start in range(0, X1.shape[0], step):
        x1 = X1[start:start + step].to(dtype)
        x2 = X2[start:start + step].to(dtype)
        out[start:start + step].index_add_(1, mu, x1[:, m1] * x2[:, m2] * coefficients)
    return out.to(X1.dtype)


def accumulate_backward(G, X1, X2, C, rule, want_x1=True, want_x2=True, want_c=True):
    """Gradients ``(dX1, dX2, dC)`` for the output gradient ``G`` (``None`` where not wanted)."""
    dtype = accumulation_dtype(X1.dtype)
    m1, m2, mu = (rule.tensor(name, X1.device) for name in ("m1", "m2", "mu"))
    (M1, M2), rows = rule.input_sizes, X1.shape[0]
    d1 = torch.zeros(rows, M1, dtype=dtype, device=X1.device) if want_x1 else None
    d2 = torch.zeros(rows, M2, dtype=dtype, device=X1.device) if want_x2 else None
    dC = torch.zeros(rule.nnz, dtype=dtype, device=X1.device) if want_c else None
    coefficients = C.to(dtype)
    step = _chunk_rows(rule.nnz)
    for start in range(0, rows, step):
        chunk = slice(start, start + step)
        g, x1, x2 = (t[chunk].to(dtype)[:, index] for t, index in ((G, mu), (X1, m1), (X2, m2)))
        if want_x1:
            d1[chunk].index_add_(1, m1, g * x2 * coefficients)
        if want_x2:
            d2[chunk].index_add_(1, m2, g * x1 * coefficients)
        if want_c:
            dC += (g * x1 * x2).sum(0)
    return tuple(None if t is None else t.to(X1.dtype) for t in (d1, d2, dC))
