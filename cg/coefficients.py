"""Public dense Clebsch-Gordan arrays: :func:`clebsch_gordan`."""
from __future__ import annotations

import functools

import numpy as np

from ._validation import check_basis, check_triple
from .bases import transform_exact, transform_sparse_float

__all__ = ["clebsch_gordan"]


@functools.lru_cache(maxsize=None)
def _cached_float(l1: int, l2: int, L: int, basis: str) -> np.ndarray:
    arr = transform_sparse_float(l1, l2, L, basis)
    arr.setflags(write=False)
    return arr


@functools.lru_cache(maxsize=256)
def _cached_exact(l1: int, l2: int, L: int, basis: str) -> np.ndarray:
    import sympy  # deferred: only the exact path needs sympy

    out = np.empty((2 * l1 + 1, 2 * l2 + 1, 2 * L + 1), dtype=object)
    out.fill(sympy.Integer(0))
    for idx, (sign, num, den) in transform_exact(l1, l2, L, basis).items():
        out[idx] = sign * sympy.sqrt(sympy.Rational(num, den))
    out.setflags(write=False)
    return out


def clebsch_gordan(l1, l2, L, basis: str = "real", exact: bool = False) -> np.ndarray:
    """Dense Clebsch-Gordan coefficients coupling ``l1 x l2 -> L``.

    Args:
        l1, l2, L: non-negative integers (Python or numpy ints, not bool) with
            ``|l1 - l2| <= L <= l1 + l2``.
        basis: ``"complex"`` (Condon-Shortley ``<l1 m1; l2 m2 | L M>``), ``"real"``
            (real spherical harmonics of DESIGN.md, times ``+i`` when ``l1+l2-L`` is
            odd) or ``"e3nn"`` (``sqrt(2L+1) * e3nn.o3.wigner_3j(l1, l2, L)``).
            See :mod:`cg.bases` for the exact conventions.
        exact: if True return exact sympy numbers instead of floats.

    Returns:
        A new array of shape ``(2*l1+1, 2*l2+1, 2*L+1)`` indexed ``[m1+l1, m2+l2, M+L]``,
        float64 if ``exact`` is False, otherwise an object array whose entries are
        sympy numbers of the form ``sign * sqrt(rational)`` (zeros are ``sympy.Integer(0)``).
        The coupled output is ``out[M] = sum C[m1, m2, M] x1[m1] x2[m2]``.

    Raises:
        ValueError: for a negative or non-integer ``l``, an ``L`` outside the triangle,
            or an unknown basis; the message names the argument.
    """
    l1, l2, L = check_triple(l1, l2, L)
    basis = check_basis(basis)
    if exact:
        return _cached_exact(l1, l2, L, basis).copy()
    return _cached_float(l1, l2, L, basis).copy()
