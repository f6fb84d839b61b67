"""Exact Condon-Shortley Clebsch-Gordan coefficients from Racah's formula.

Everything here is integer arithmetic on Python ints.  For a triple ``(l1, l2, L)``
every non-zero coefficient is written as

    <l1 m1; l2 m2 | L M> = sign * sqrt(num / den)

with ``num``, ``den`` positive integers.  Racah's sum is rewritten with binomial
coefficients so that the alternating sum is an integer ``T``:

    T   = sum_k (-1)^k  binom(a, k) binom(A, l1 - m1 - k) binom(B, l2 + m2 - k)
    C^2 = (2L + 1) T^2 (L+M)! (L-M)! (l1-m1)! (l1+m1)! (l2-m2)! (l2+m2)!
          / ((l1 + l2 + L + 1)! a! A! B!)

with ``a = l1 + l2 - L``, ``A = L + l1 - l2``, ``B = L - l1 + l2``, and sign(C) = sign(T).
Floats are produced by one correctly rounded integer division and one square root,
so each float coefficient is within one ulp or so of the exact value.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

__all__ = ["ExactEntries", "complex_entries", "complex_sparse_float", "complex_cg_dense"]

_FACT: list[int] = [1]
_BINOM: list[list[int]] = [[1]]


def _factorials(n: int) -> list[int]:
    """Return the shared list of factorials, grown so that it holds ``0! .. n!``."""
    while len(_FACT) <= n:
        _FACT.append(_FACT[-1] * len(_FACT))
    return _FACT


def _binomial_rows(n: int) -> list[list[int]]:
    """Return Pascal's triangle as a list of rows, grown so that row ``n`` exists."""
    while len(_BINOM) <= n:
        prev = _BINOM[-1]
        _BINOM.append([1] + [prev[i] + prev[i + 1] for i in range(len(prev) - 1)] + [1])
    return _BINOM


class ExactEntries(NamedTuple):
    """The non-zero complex CG coefficients of one triple, exactly.

    Attributes:
        m1, m2: tuples of ints, the magnetic numbers (not offset), ``M = m1 + m2``.
        sign: tuple of +1/-1.
        num, den: tuples of positive Python ints; ``C = sign * sqrt(num / den)``
            (the fraction is not reduced).
    """

    m1: tuple
    m2: tuple
    sign: tuple
    num: tuple
    den: int


@functools.lru_cache(maxsize=None)
def complex_entries(l1: int, l2: int, L: int) -> ExactEntries:
    """Exact non-zero Condon-Shortley coefficients ``<l1 m1; l2 m2 | L M>``.

    Args:
        l1, l2, L: validated non-negative ints with ``|l1 - l2| <= L <= l1 + l2``.

    Returns:
        :class:`ExactEntries` listing every (m1, m2) with a non-zero coefficient,
        ordered by m1 then m2.  The result is cached; it is immutable.
    """
    a = l1 + l2 - L
    A = L + l1 - l2
    B = L - l1 + l2
    fact = _factorials(l1 + l2 + L + 1)
    binom = _binomial_rows(max(a, A, B))
    ba, bA, bB = binom[a], binom[A], binom[B]
    den = fact[l1 + l2 + L + 1] * fact[a] * fact[A] * fact[B]
    two_l_plus_1 = 2 * L + 1

    m1s, m2s, signs, nums = [], [], [], []
    for m1 in range(-l1, l1 + 1):
        b = l1 - m1
        f1 = fact[l1 - m1] * fact[l1 + m1] * two_l_plus_1
        lo_m2 = max(-l2, -L - m1)
        hi_m2 = min(l2, L - m1)
        for m2 in range(lo_m2, hi_m2 + 1):
            c = l2 + m2
            k_lo = max(0, b - A, c - B)
            k_hi = min(a, b, c)
            t = 0
            for k in range(k_lo, k_hi + 1):
                term = ba[k] * bA[b - k] * bB[c - k]
                t = t - term if k & 1 else t + term
            if t == 0:
                continue
            M = m1 + m2
            m1s.append(m1)
            m2s.append(m2)
            signs.append(1 if t > 0 else -1)
            nums.append(f1 * fact[l2 - m2] * fact[l2 + m2] * fact[L + M] * fact[L - M] * t * t)
    return ExactEntries(tuple(m1s), tuple(m2s), tuple(signs), tuple(nums), den)


@functools.lru_cache(maxsize=None)
def complex_sparse_float(l1: int, l2: int, L: int):
    """Float64 non-zero complex coefficients of a triple as numpy arrays.

    Returns:
        ``(m1, m2, values)``: two int64 arrays of magnetic numbers (not offset) and a
        float64 array of coefficients, all read-only.
    """
    ent = complex_entries(l1, l2, L)
    den = ent.den
    sqrt = math.sqrt
    values = np.array([s * sqrt(n / den) for s, n in zip(ent.sign, ent.num)], dtype=np.float64)
    m1 = np.array(ent.m1, dtype=np.int64)
    m2 = np.array(ent.m2, dtype=np.int64)
    for arr in (m1, m2, values):
        arr.setflags(write=False)
    return m1, m2, values


def complex_cg_dense(l1: int, l2: int, L: int) -> np.ndarray:
    """Dense float64 complex CG array of shape ``(2l1+1, 2l2+1, 2L+1)`` (a new array)."""
    m1, m2, values = complex_sparse_float(l1, l2, L)
    out = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * L + 1), dtype=np.float64)
    out[m1 + l1, m2 + l2, m1 + m2 + L] = values
    return out
