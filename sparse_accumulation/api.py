"""Public functions: validation, dispatch to an implementation, and the three layouts of the peer API.

``accumulate`` computes, for every ``k``::

    out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]

All structural checks here use shapes, dtypes and devices only, so they are traced by ``torch.compile``
without graph breaks; checks of index values run inside the registered ops (see :mod:`.ops`).
"""
from __future__ import annotations

import math

import torch

from . import backends, eager, ops
from .kernels import reference
from .rules import check_index_tensor, prepare_rule

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _validate(X1, X2, mu, output_size, m1, m2, C, active: str) -> None:
    """Raise ``TypeError``/``ValueError`` for inputs of the wrong kind, shape, dtype or device."""
    for name, t in (("X1", X1), ("X2", X2), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must have a floating dtype (float16, bfloat16, float32 or float64), "
                            f"got {t.dtype}")
    for name, t in (("X2", X2), ("C", C)):
        if t.dtype != X1.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but X1 has dtype {X1.dtype}; they must match")
    for name, t in (("m1", m1), ("m2", m2), ("mu", mu)):
        check_index_tensor(name, t)
    for name, t in (("X2", X2), ("C", C), ("m1", m1), ("m2", m2), ("mu", mu)):
        if t.device != X1.device:
            raise ValueError(f"{name} is on {t.device} but X1 is on {X1.device}; all tensors must be on one device")
    if isinstance(output_size, bool) or not isinstance(output_size, (int, torch.SymInt)):
        raise TypeError(f"output_size must be an int, got {type(output_size).__name__}")
    if output_size < 0:
        raise ValueError(f"output_size must be non-negative, got {output_size}")
    if X1.dim() < 1 or X2.dim() < 1:
        raise ValueError(f"X1 and X2 need at least one dimension (the {active} active dimension), "
                         f"got shapes {tuple(X1.shape)} and {tuple(X2.shape)}")
    nnz = m1.shape[0]
    if m2.shape[0] != nnz or mu.shape[0] != nnz:
        raise ValueError(f"m1, m2 and mu must have the same length, got {nnz}, {m2.shape[0]} and {mu.shape[0]}")
    if C.dim() != 1 or C.shape[0] != nnz:
        raise ValueError(f"C must be 1-D with one coefficient per index (length {nnz}), got shape {tuple(C.shape)}")


def _check_leading(X1, X2, lead1, lead2, active: str) -> None:
    if tuple(lead1) != tuple(lead2):
        raise ValueError(f"X1 and X2 must have equal dimensions besides the {active} active one, "
                         f"got shapes {tuple(X1.shape)} and {tuple(X2.shape)}")


def _accumulate_rows(X1, X2, mu, output_size, m1, m2, C, implementation):
    """The op on ``[..., M]`` inputs whose leading dimensions were checked to match."""
    name = backends.resolve(implementation, X1.device)
    if name in backends.REFERENCES:
        prepare_rule(m1, m2, mu, X1.shape[-1], X2.shape[-1], output_size)
        return reference.BY_NAME[name](X1, X2, mu, output_size, m1, m2, C).contiguous()
    if eager.applies(X1, X2, C, m1, m2, mu):
        rule = prepare_rule(m1, m2, mu, X1.shape[-1], X2.shape[-1], output_size)
        return eager.accumulate(X1, X2, C, rule, backends.kernels(name))
    lead = X1.shape[:-1]
    rows = math.prod(lead)
    out = ops.accumulate(X1.reshape(rows, X1.shape[-1]), X2.reshape(rows, X2.shape[-1]), C, m1, m2, mu,
                         output_size, name)
    return out.reshape(*lead, output_size)


def accumulate(X1, X2, mu, output_size, m1, m2, C, *, implementation=None):
    """Sparse accumulation with the active dimension last: ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]``.

    Args:
        X1: ``[..., M1]`` floating tensor (float16, bfloat16, float32 or float64).
        X2: ``[..., M2]``, same leading dimensions (any number, including none and zero rows), dtype and
            device as X1.
        mu: output index of each nonzero, 1-D integer tensor (any integer dtype, any order, duplicates allowed).
        output_size: size of the output's last dimension.
        m1, m2: indices into X1 and X2, 1-D integer tensors of the same length as ``mu``.
        C: coefficients, 1-D, same length and dtype as the indices / X1.
        implementation: ``None`` (the process default, normally ``"auto"``), ``"auto"``, a kernel
            (``"numba"``, ``"triton"``, ``"torch"``) or a reference (``"loops"``, ``"index_add"``,
            ``"dense"``, ``"sparse"``); see :mod:`sparse_accumulation.backends`.

    Returns:
        Contiguous ``[..., output_size]`` tensor of X1's dtype and device. 16-bit inputs are accumulated in
        float32. Differentiable with respect to X1, X2 and C, to any order.

    Raises:
        TypeError: non-tensor or non-floating data, non-integer indices, dtypes of X1, X2 and C differ.
        ValueError: shapes do not fit, tensors on different devices, unknown implementation.
        IndexError: an index is negative or out of range (``mu >= output_size`` included).
        RuntimeError: the requested implementation is not available for the device.
    """
    _validate(X1, X2, mu, output_size, m1, m2, C, "last")
    _check_leading(X1, X2, X1.shape[:-1], X2.shape[:-1], "last")
    return _accumulate_rows(X1, X2, mu, output_size, m1, m2, C, implementation)


def accumulate_active_dim_first(X1, X2, mu, output_size, m1, m2, C, *, implementation=None):
    """:func:`accumulate` with the active dimension first: X1 ``[M1, ...]``, X2 ``[M2, ...]`` -> ``[output_size, ...]``.

    The inputs are read in place (a strided view); the output is returned contiguous. Same arguments,
    dtypes and errors as :func:`accumulate`.
    """
    _validate(X1, X2, mu, output_size, m1, m2, C, "first")
    _check_leading(X1, X2, X1.shape[1:], X2.shape[1:], "first")
    out = _accumulate_rows(X1.movedim(0, -1), X2.movedim(0, -1), mu, output_size, m1, m2, C, implementation)
    return out.movedim(-1, 0).contiguous()


def accumulate_active_dim_middle(X1, X2, mu, output_size, m1, m2, C, *, implementation=None):
    """:func:`accumulate` with the active dimension second: X1 ``[A, M1, ...]``, X2 ``[A, M2, ...]`` -> ``[A, output_size, ...]``.

    The inputs are copied to the active-last layout when that is not a view; the output is contiguous.
    Same arguments, dtypes and errors as :func:`accumulate`.
    """
    _validate(X1, X2, mu, output_size, m1, m2, C, "middle")
    if X1.dim() < 2 or X2.dim() < 2:
        raise ValueError(f"X1 and X2 need at least two dimensions for the middle layout, "
                         f"got shapes {tuple(X1.shape)} and {tuple(X2.shape)}")
    lead1 = X1.shape[:1] + X1.shape[2:]
    _check_leading(X1, X2, lead1, X2.shape[:1] + X2.shape[2:], "middle")
    out = _accumulate_rows(X1.movedim(1, -1), X2.movedim(1, -1), mu, output_size, m1, m2, C, implementation)
    return out.movedim(-1, 1).contiguous()
