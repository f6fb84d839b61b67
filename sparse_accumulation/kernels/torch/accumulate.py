"""Portable torch kernels (any device): gather and ``index_add`` over bounded chunks of rows.

The fallback when neither numba (CPU) nor Triton (CUDA) is available. Operands are viewed as ``[A_i, B_i, M]``
in the folded row space (see :mod:`sparse_accumulation.kernels`); work is done in chunks of the outer
dimension, each holding a ``[chunk, B, nnz]`` intermediate of about :data:`CHUNK_ELEMENTS` elements at most.
"""
from __future__ import annotations

import torch

from .. import layout
from .. import accumulation_dtype

CHUNK_ELEMENTS = 1 << 22


def _chunks(A: int, B: int, nnz: int):
    step = max(1, CHUNK_ELEMENTS // max(B * nnz, 1))
    return (slice(start, min(start + step, A)) for start in range(0, A, step))


def _gathered(t, index, chunk, B, dtype):
    """``t[chunk, :, index]`` broadcast to ``[n, B, nnz]`` (a view over what ``t`` broadcasts)."""
    part = t if t.shape[0] == 1 else t[chunk]
    return part.to(dtype)[:, :, index].expand(-1, B, -1)


def _product(factors, chunk, B, dtype, coefficients):
    result = coefficients
    for t, index in factors:
        result = _gathered(t, index, chunk, B, dtype) * result
    return result


def _reduce_to(contribution, like):
    """Sum ``[n, B, M]`` over the dimensions ``like`` (``[A_i, B_i, M]``) broadcasts."""
    if like.shape[1] == 1 and contribution.shape[1] != 1:
        contribution = contribution.sum(1, keepdim=True)
    if like.shape[0] == 1 and contribution.shape[0] != 1:
        contribution = contribution.sum(0, keepdim=True)
    return contribution


def _indices(rule, device):
    return {name: rule.tensor(name, device) for name in ("m1", "m2", "mu") + (("w",) if rule.weighted else ())}


def _views(operands, rows):
    return [layout.view3(t, folded) for t, folded in zip(operands, rows.operands)]


def accumulate(X1, X2, W, C, rule, rows):
    """``out[..., mu[k]] += X1[m1[k]] * X2[m2[k]] * W[w[k]] * C[k]``; see :mod:`sparse_accumulation.kernels`."""
    dtype = accumulation_dtype(X1.dtype)
    A, B = rows.A, rows.B
    X1, X2, *rest = _views((X1, X2) if W is None else (X1, X2, W), rows)
    W = rest[0] if rest else None
    index = _indices(rule, X1.device)
    factors = [(X1, index["m1"]), (X2, index["m2"])] + ([] if W is None else [(W, index["w"])])
    out = torch.zeros(A, B, rule.output_size, dtype=dtype, device=X1.device)
    coefficients = C.to(dtype)
    for chunk in _chunks(A, B, rule.nnz):
        out[chunk].index_add_(2, index["mu"], _product(factors, chunk, B, dtype, coefficients))
    return out.to(X1.dtype).view(*rows.lead, rule.output_size)


def accumulate_backward(G, X1, X2, W, C, rule, rows, want_x1=True, want_x2=True, want_w=False, want_c=True):
    """Gradients ``(dX1, dX2, dW, dC)`` for the output gradient ``G`` (``None`` where not wanted)."""
    dtype = accumulation_dtype(X1.dtype)
    A, B = rows.A, rows.B
    shapes = [t.shape for t in ((X1, X2) if W is None else (X1, X2, W))]
    if A * B == 0:
        zeros = [torch.zeros(shape, dtype=X1.dtype, device=X1.device) for shape in shapes] + [None]
        wanted = (want_x1, want_x2, want_w and W is not None)
        return (*(z if w else None for z, w in zip(zeros, wanted)),
                torch.zeros(rule.nnz, dtype=X1.dtype, device=X1.device) if want_c else None)
    G = layout.view3(*layout.output_rows(G, rows))
    X1, X2, *rest = _views((X1, X2) if W is None else (X1, X2, W), rows)
    W = rest[0] if rest else None
    index = _indices(rule, X1.device)
    slots = [("m1", X1, want_x1), ("m2", X2, want_x2)] + ([] if W is None else [("w", W, want_w)])
    grads = {name: torch.zeros(t.shape, dtype=dtype, device=t.device) for name, t, wanted in slots if wanted}
    dC = torch.zeros(rule.nnz, dtype=dtype, device=X1.device) if want_c else None
    coefficients = C.to(dtype)
    ones = torch.ones_like(coefficients)
    for chunk in _chunks(A, B, rule.nnz):
        for name, t, wanted in slots:
            if not wanted:
                continue
            others = [(G, index["mu"])] + [(u, index[n]) for n, u, _ in slots if n != name]
            contribution = torch.zeros(chunk.stop - chunk.start, B, t.shape[2], dtype=dtype, device=t.device)
            contribution.index_add_(2, index[name], _product(others, chunk, B, dtype, coefficients))
            contribution = _reduce_to(contribution, t)
            target = grads[name] if t.shape[0] == 1 else grads[name][chunk]
            target += contribution
        if want_c:
            everything = [(G, index["mu"])] + [(u, index[n]) for n, u, _ in slots]
            dC += _product(everything, chunk, B, dtype, ones).sum((0, 1))
    d = [grads[name].to(X1.dtype).view(shape) if name in grads else None for name, shape in zip(("m1", "m2", "w"),
                                                                                               shapes + [None])]
    return d[0], d[1], d[2], None if dC is None else dC.to(X1.dtype)
