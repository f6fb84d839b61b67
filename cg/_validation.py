"""Argument validation shared by the public functions of :mod:`cg`."""
from __future__ import annotations

import numbers

import numpy as np

from .bases import BASES

__all__ = ["check_l", "check_triple", "check_basis"]


def check_l(value, name: str) -> int:
    """Return ``value`` as a Python int if it is a non-negative integer.

    Python ints and numpy integer scalars are accepted; bool, floats (even integral
    ones such as ``2.0``), strings and everything else are rejected.

    Raises:
        ValueError: naming ``name``, e.g. ``"l1 must be a non-negative integer, got -1"``.
    """
    ok = isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok or int(value) < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def check_triple(l1, l2, L) -> tuple[int, int, int]:
    """Validate a coupling triple and return it as Python ints.

    Raises:
        ValueError: if any entry is not a non-negative integer, or if ``L`` is outside
            ``|l1 - l2| .. l1 + l2``.
    """
    l1 = check_l(l1, "l1")
    l2 = check_l(l2, "l2")
    L = check_l(L, "L")
    lo, hi = abs(l1 - l2), l1 + l2
    if not lo <= L <= hi:
        raise ValueError(f"L={L} is outside |l1-l2|..l1+l2 = {lo}..{hi}")
    return l1, l2, L


def check_basis(basis) -> str:
    """Return ``basis`` if it is one of :data:`cg.BASES`.

    Raises:
        ValueError: naming the argument and listing the valid choices.
    """
    if not isinstance(basis, str) or basis not in BASES:
        choices = ", ".join(repr(b) for b in BASES)
        raise ValueError(f"basis must be one of {choices}, got {basis!r}")
    return basis
