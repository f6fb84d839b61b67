"""Change-of-basis matrices and the complex -> real / e3nn transform of CG arrays.

Conventions
-----------
For every basis a unitary matrix ``U_l`` of shape ``(2l+1, 2l+1)`` maps complex
(Condon-Shortley) spherical-harmonic components to the basis components::

    R_a = sum_m U_l[a + l, m + l] Y_m          (a, m in -l..l)

Components ``x`` that transform like ``Y`` are thus ``x = U^dagger r``.  Writing the
complex coupling ``out_M = sum C[m1, m2, M] x1_m1 x2_m2`` in basis components gives::

    C_basis[a, b, c] = phase * sum_{m1, m2, M} conj(U1[a, m1]) conj(U2[b, m2]) U_L[c, M] C[m1, m2, M]

``"real"``: Wikipedia's real spherical harmonics, i.e. for m > 0
``R_m = sqrt(2) (-1)^m Re Y_m`` and ``R_-m = sqrt(2) (-1)^m Im Y_m``, ``R_0 = Y_0``::

    U[m, m] = (-1)^m / sqrt2,   U[m, -m] = 1 / sqrt2,
    U[-m, -m] = i / sqrt2,      U[-m, m] = -i (-1)^m / sqrt2,

and ``phase = +i`` when ``l1 + l2 - L`` is odd (1 otherwise) so that all coefficients
are real.

``"e3nn"``: e3nn's real basis.  Its matrix is the real one times an extra ``i^l`` per
irrep, ``U_e3nn = i^l U_real`` (``phase = 1``; e3nn's y-polar axis only relabels which
Cartesian rotation a D matrix belongs to, it does not change these matrices).  Hence
``C_e3nn = (-i)^(l1+l2-L) * (complex coupling in real components)``, which equals
``+-C_real`` entry by entry.
(With these, ``C_e3nn = sqrt(2L+1) * e3nn.o3.wigner_3j(l1, l2, L)``.)

Every entry of every ``U`` is ``unit * 2^(-k/2)`` with ``unit`` in ``{1, -1, i, -i}`` and
``k`` in ``{0, 1}``, and only ``m`` and ``-m`` mix.  The transform is therefore done
sparsely: each complex coefficient feeds at most 8 basis entries, and any basis entry
receives contributions from a ``(m1, m2, M)`` / ``(-m1, -m2, -M)`` pair of complex
coefficients of equal magnitude, so it is ``sign * sqrt(rational)`` exactly.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .racah import complex_entries, complex_sparse_float

__all__ = ["BASES", "basis_matrix", "transform_sparse_float", "transform_exact"]

#: Supported bases, in a stable order.
BASES = ("real", "complex", "e3nn")

_I_POW = (1, 1j, -1, -1j)


@functools.lru_cache(maxsize=None)
def _unit_matrix(l: int, basis: str):
    """Entries of ``U_l`` as (gaussian-integer units, exponent k) with U = unit * 2^(-k/2).

    Returns a dict ``{(a, m): (unit_re, unit_im, k)}`` holding the non-zero entries
    (a, m not offset).  ``basis`` is ``"real"``, ``"complex"`` or ``"e3nn"``.
    """
    entries = {}
    if basis == "complex":
        for m in range(-l, l + 1):
            entries[(m, m)] = (1, 0, 0)
        return entries
    glob = _I_POW[l % 4] if basis == "e3nn" else 1
    entries[(0, 0)] = (glob, 0)
    for m in range(1, l + 1):
        s = -1 if m & 1 else 1
        vals = {(m, m): s, (m, -m): 1, (-m, -m): 1j, (-m, m): -1j * s}
        for key, v in vals.items():
            entries[key] = (glob * v, 1)
    out = {}
    for key, (v, k) in entries.items():
        v = complex(v)
        out[key] = (int(v.real), int(v.imag), k)
    return out


def basis_matrix(l: int, basis: str) -> np.ndarray:
    """Unitary change-of-basis matrix ``U_l`` (complex128, shape ``(2l+1, 2l+1)``).

    ``U[a + l, m + l]`` is the weight of the complex harmonic ``Y_m`` in basis
    component ``a``; see the module docstring.  Returns a new array.

    Args:
        l: non-negative int (validated by the caller).
        basis: one of :data:`BASES`.
    """
    out = np.zeros((2 * l + 1, 2 * l + 1), dtype=np.complex128)
    for (a, m), (re, im, k) in _unit_matrix(l, basis).items():
        out[a + l, m + l] = complex(re, im) * (0.5 ** (k / 2))
    return out


def _phase(l1: int, l2: int, L: int, basis: str) -> complex:
    return 1j if (basis == "real" and (l1 + l2 - L) % 2 == 1) else 1


@functools.lru_cache(maxsize=None)
def _targets(l: int, basis: str):
    """Column structure of ``U_l``: each complex m feeds at most two basis components.

    Returns read-only arrays of shape ``(2l+1, 2)`` indexed ``[m + l, slot]``: the basis
    index ``a + l`` (int64), the gaussian unit of ``U[a, m]`` (complex128), its exponent
    ``k`` (int64) and whether the slot is used (bool).
    """
    n = 2 * l + 1
    idx = np.zeros((n, 2), dtype=np.int64)
    unit = np.zeros((n, 2), dtype=np.complex128)
    kexp = np.zeros((n, 2), dtype=np.int64)
    used = np.zeros((n, 2), dtype=bool)
    fill = np.zeros(n, dtype=np.int64)
    for (a, m), (re, im, k) in sorted(_unit_matrix(l, basis).items()):
        slot = fill[m + l]
        idx[m + l, slot], unit[m + l, slot], kexp[m + l, slot] = a + l, complex(re, im), k
        used[m + l, slot] = True
        fill[m + l] += 1
    for arr in (idx, unit, kexp, used):
        arr.setflags(write=False)
    return idx, unit, kexp, used


@functools.lru_cache(maxsize=None)
def _scatter_plan(l1: int, l2: int, L: int, basis: str):
    """Vectorised scatter plan of the complex -> basis transform of one triple.

    Returns ``(src, flat_target, weight_unit, kexp)``: for contribution j, complex entry
    ``src[j]`` (index into ``complex_entries``) is multiplied by the gaussian unit
    ``weight_unit[j]`` (complex128, phase included) and by ``2^(-kexp[j]/2)``, and added
    into the flattened basis array at ``flat_target[j]``.
    """
    m1, m2, _ = complex_sparse_float(l1, l2, L)
    i1, i2, iL = m1 + l1, m2 + l2, m1 + m2 + L
    t1, t2, tL = _targets(l1, basis), _targets(l2, basis), _targets(L, basis)
    phase = _phase(l1, l2, L, basis)
    n2, nL = 2 * l2 + 1, 2 * L + 1
    src_all = np.arange(len(m1), dtype=np.int64)
    parts = []
    for s1 in (0, 1):
        for s2 in (0, 1):
            for s3 in (0, 1):
                used = t1[3][i1, s1] & t2[3][i2, s2] & tL[3][iL, s3]
                if not used.any():
                    continue
                j1, j2, jL = i1[used], i2[used], iL[used]
                flat = (t1[0][j1, s1] * n2 + t2[0][j2, s2]) * nL + tL[0][jL, s3]
                unit = np.conj(t1[1][j1, s1]) * np.conj(t2[1][j2, s2]) * tL[1][jL, s3] * phase
                kexp = t1[2][j1, s1] + t2[2][j2, s2] + tL[2][jL, s3]
                parts.append((src_all[used], flat, unit, kexp))
    plan = tuple(np.concatenate([p[i] for p in parts]) for i in range(4))
    for arr in plan:
        arr.setflags(write=False)
    return plan


def transform_sparse_float(l1: int, l2: int, L: int, basis: str) -> np.ndarray:
    """Dense float64 CG array of a triple in ``basis`` (a new array).

    Args:
        l1, l2, L: validated triple.
        basis: one of :data:`BASES`.

    Returns:
        float64 array of shape ``(2l1+1, 2l2+1, 2L+1)`` indexed ``[m1+l1, m2+l2, M+L]``.
    """
    shape = (2 * l1 + 1, 2 * l2 + 1, 2 * L + 1)
    m1, m2, values = complex_sparse_float(l1, l2, L)
    if basis == "complex":
        out = np.zeros(shape, dtype=np.float64)
        out[m1 + l1, m2 + l2, m1 + m2 + L] = values
        return out
    src, flat, unit, kexp = _scatter_plan(l1, l2, L, basis)
    scale = np.where(kexp % 2 == 1, math.sqrt(0.5), 1.0) * (0.5 ** (kexp // 2))
    contrib = unit * (values[src] * scale)
    acc = np.zeros(math.prod(shape), dtype=np.complex128)
    np.add.at(acc, flat, contrib)
    # Contributions to one entry are equal in magnitude, so sums are exact and any
    # imaginary part is exactly zero; a non-zero one would be a convention bug.
    if np.any(acc.imag != 0.0):  # pragma: no cover - internal consistency check
        raise AssertionError(f"non-real coefficient for {(l1, l2, L, basis)}")
    return acc.real.reshape(shape).copy()


def transform_exact(l1: int, l2: int, L: int, basis: str):
    """Exact CG coefficients of a triple in ``basis``.

    Returns:
        dict ``{(a, b, c): (sign, num, den)}`` (offset indices) for the non-zero entries,
        with value ``sign * sqrt(num / den)``, ``num`` and ``den`` positive Python ints.
    """
    ent = complex_entries(l1, l2, L)
    if basis == "complex":
        return {
            (m1 + l1, m2 + l2, m1 + m2 + L): (s, n, ent.den)
            for m1, m2, s, n in zip(ent.m1, ent.m2, ent.sign, ent.num)
        }
    src, flat, unit, kexp = _scatter_plan(l1, l2, L, basis)
    acc: dict[int, list] = {}
    for j, f, u, k in zip(src.tolist(), flat.tolist(), unit.tolist(), kexp.tolist()):
        g = complex(u) * ent.sign[j]
        slot = acc.get(f)
        if slot is None:
            acc[f] = [g, k, j]
        else:
            # paired contributions share magnitude and exponent
            if k != slot[1] or ent.num[j] != ent.num[slot[2]]:  # pragma: no cover
                raise AssertionError("inconsistent exact transform")
            slot[0] += g
    n2, nL = 2 * l2 + 1, 2 * L + 1
    out = {}
    for f, (g, k, j) in acc.items():
        if g.imag != 0:  # pragma: no cover - internal consistency check
            raise AssertionError(f"non-real coefficient for {(l1, l2, L, basis)}")
        gi = int(round(g.real))
        if gi == 0:
            continue
        idx = (f // (n2 * nL), (f // nL) % n2, f % nL)
        out[idx] = (1 if gi > 0 else -1, ent.num[j] * gi * gi, ent.den * 2**k)
    return out
