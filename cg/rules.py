"""Flattened sparse transformation rules ``(m1, m2, mu, C)``."""
from __future__ import annotations

import numpy as np

from .coefficients import _cached_float
from ._validation import check_basis, check_triple

__all__ = ["transformation_rule", "rule_from_dense", "ZERO_TOLERANCE"]

#: Coefficients with ``|C|`` below this are dropped from rules.
ZERO_TOLERANCE = 1e-15


def rule_from_dense(dense: np.ndarray):
    """Flatten a dense ``(n1, n2, nL)`` coefficient array into a sparse rule.

    Args:
        dense: float array of shape ``(2l1+1, 2l2+1, 2L+1)``.

    Returns:
        ``(m1, m2, mu, C)``: three int64 arrays of offset indices and a float64 array,
        sorted by ``mu``, then ``m1``, then ``m2``, with no entry of ``|C| < 1e-15``.
        Every index triple occurs once (a dense array has no duplicates).
    """
    dense = np.asarray(dense, dtype=np.float64)
    # transpose so that C-order nonzero() yields (mu, m1, m2) lexicographic order
    mu, m1, m2 = np.nonzero(np.abs(dense.transpose(2, 0, 1)) >= ZERO_TOLERANCE)
    coeff = dense[m1, m2, mu]
    return (
        m1.astype(np.int64),
        m2.astype(np.int64),
        mu.astype(np.int64),
        coeff.astype(np.float64),
    )


def transformation_rule(l1, l2, L, basis: str = "real"):
    """Sparse rule for coupling ``l1 x l2 -> L``, ready for sparse accumulation.

    ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]`` reproduces the dense
    coupling of :func:`cg.clebsch_gordan` with the same basis.

    Args:
        l1, l2, L: coupling triple (see :func:`cg.clebsch_gordan`).
        basis: ``"real"`` (default), ``"complex"`` or ``"e3nn"``.

    Returns:
        ``(m1, m2, mu, C)``, int64 index arrays offset by ``+l`` (``0 .. 2l``) and a
        float64 coefficient array, all of equal length; sorted by ``mu``, then ``m1``,
        then ``m2``; no duplicate index triples and no ``|C| < 1e-15``.  New arrays.

    Raises:
        ValueError: as :func:`cg.clebsch_gordan`.
    """
    l1, l2, L = check_triple(l1, l2, L)
    basis = check_basis(basis)
    return rule_from_dense(_cached_float(l1, l2, L, basis))
