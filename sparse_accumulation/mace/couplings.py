"""MACE's generalised Clebsch-Gordan couplings as sparse symmetric polynomials.

For an output irrep ``L`` and a correlation order ``nu``, MACE's ``Contraction`` contracts a dense tensor
``U[M, i_1, ..., i_nu, k]`` (its "U matrix", one column ``k`` per coupling path) with ``nu`` copies of the
node's features ``x[i]`` and a weight ``W[element, k, channel]``::

    out[M] = sum_k W[k] * sum_{i_1..i_nu} U[M, i_1, ..., i_nu, k] * x[i_1] * ... * x[i_nu]

Only the part of ``U`` symmetric in ``i_1 .. i_nu`` reaches the output. Written on monomials
``m = (i_1 <= ... <= i_nu)``, the sum is ``sum over terms t = (M, m) of B[t, k] * W[k] * x^m`` with
``B[t, k]`` the sum of ``U`` over the orderings of ``m``: a few hundred terms where ``U`` has millions of
entries (:class:`Couplings`).

:func:`mace_paths` builds the columns of ``U`` as MACE 0.3.16 does (``mace.tools.cg.U_matrix_real`` without
cuequivariance: e3nn's ``wigner_3j`` coupling chains ``((x x)_{L12} x)_{L123} ...`` in "component"
normalisation, paths in MACE's order) from this project's e3nn-basis coefficients, sparse;
:func:`couplings_from_dense` reads a module's own ``U`` tensors instead (any basis, e.g. the reduced one of
cuequivariance).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

import cg

from .irreps import Irrep

#: intermediate irreps MACE keeps for correlation order 4 (``filter_ir_mid`` of ``U_matrix_real``)
ORDER_FOUR_FILTER = tuple(Irrep(l, 1 if l % 2 == 0 else -1) for l in range(12))


class Coupling(NamedTuple):
    """One coupling path: its irrep and its sparse tensor ``U[M, i_1, ..., i_nu]`` as ``indices [nnz, 1 + nu]``
    and ``values [nnz]``."""

    ir: Irrep
    indices: np.ndarray
    values: np.ndarray


@functools.lru_cache(maxsize=None)
def _wigner(L: int, l_left: int, l_right: int) -> tuple:
    """Nonzeros ``(M, j, m, value)`` of e3nn's ``wigner_3j(L, l_left, l_right) * sqrt(2L + 1)``."""
    dense = cg.clebsch_gordan(L, l_left, l_right, "e3nn") * np.sqrt((2 * L + 1) / (2 * l_right + 1))
    M, j, m = np.nonzero(dense)
    return M, j, m, dense[M, j, m]


@functools.lru_cache(maxsize=64)
def mace_paths(coupling: tuple, nu: int, filter_mid=None) -> tuple:
    """Every coupling path of ``nu`` copies of the irreps ``coupling`` (one copy of each, in order; their
    components concatenated) in MACE's ``_wigner_nj`` order: for ``nu == 1`` the irreps as given, else the
    paths sorted by irrep (stable).

    Args:
        coupling: tuple of :class:`~.irreps.Irrep`.
        nu: correlation order (>= 1).
        filter_mid: irreps allowed at every coupling step (None: all).

    Returns:
        tuple of :class:`Coupling`.
    """
    if nu == 1:
        paths, offset = [], 0
        for ir in coupling:
            m = np.arange(ir.dim)
            paths.append(Coupling(ir, np.stack([m, offset + m], axis=1), np.ones(ir.dim)))
            offset += ir.dim
        return tuple(paths)
    paths = []
    for left in mace_paths(coupling, nu - 1, filter_mid):
        by_j = {}
        for row, value in zip(left.indices, left.values):
            by_j.setdefault(int(row[0]), []).append((row[1:], value))
        offset = 0
        for ir in coupling:
            for L in range(abs(left.ir.l - ir.l), left.ir.l + ir.l + 1):
                out = Irrep(L, left.ir.p * ir.p)
                if filter_mid is not None and out not in filter_mid:
                    continue
                rows, values = [], []
                for M, j, m, c in zip(*_wigner(L, left.ir.l, ir.l)):
                    for rest, value in by_j.get(int(j), ()):
                        rows.append((int(M), *rest, offset + int(m)))
                        values.append(value * c)
                indices = np.array(rows, dtype=np.int64).reshape(-1, nu + 1)
                paths.append(Coupling(out, indices, np.array(values, dtype=np.float64)))
            offset += ir.dim
    return tuple(sorted(paths, key=lambda path: path.ir))


class Couplings(NamedTuple):
    """The symmetric couplings of one output irrep and correlation order: term ``t`` adds
    ``sum_k B[t, k] W[k]`` times the monomial ``monomials[t]`` (sorted input components) to component
    ``components[t]`` of the irrep; ``paths`` is the number of weights ``k`` (MACE's ``num_params``)."""

    components: np.ndarray
    monomials: np.ndarray
    B: np.ndarray

    @property
    def paths(self) -> int:
        return self.B.shape[1]

    @property
    def order(self) -> int:
        return self.monomials.shape[1]


def _symmetrised(columns, nu: int, tolerance: float) -> Couplings:
    """:class:`Couplings` of sparse columns ``(indices [nnz, 1 + nu], values)``, one per path."""
    sums = {}
    for k, (indices, values) in enumerate(columns):
        if len(values) == 0:
            continue
        keys = np.concatenate([indices[:, :1], np.sort(indices[:, 1:], axis=1)], axis=1)
        for key, value in zip(map(tuple, keys.tolist()), values):
            entry = sums.setdefault(key, {})
            entry[k] = entry.get(k, 0.0) + float(value)
    largest = max((abs(v) for entry in sums.values() for v in entry.values()), default=0.0)
    kept = sorted(key for key, entry in sums.items() if any(abs(v) > tolerance * largest for v in entry.values()))
    B = np.zeros((len(kept), len(columns)))
    for t, key in enumerate(kept):
        for k, value in sums[key].items():
            if abs(value) > tolerance * largest:
                B[t, k] = value
    keys = np.array(kept, dtype=np.int64).reshape(-1, nu + 1)
    return Couplings(keys[:, 0].copy(), keys[:, 1:].copy(), B)


#: symmetrised sums below this fraction of the largest coefficient are zero (cancellations in float64)
TOLERANCE = 1e-12


def mace_couplings(coupling: tuple, target: Irrep, nu: int) -> Couplings:
    """The couplings of MACE's ``U_matrix_real(coupling, target, correlation=nu)``: its paths to ``target``
    in MACE's order (one zero path if there is none, as MACE keeps one zeroed weight then)."""
    filter_mid = ORDER_FOUR_FILTER if nu == 4 else None
    columns = [(p.indices, p.values) for p in mace_paths(tuple(coupling), nu, filter_mid) if p.ir == target]
    if not columns:
        columns = [(np.zeros((0, nu + 1), np.int64), np.zeros(0))]
    return _symmetrised(columns, nu, TOLERANCE)


def mace_has_paths(coupling: tuple, target: Irrep, nu: int) -> bool:
    """Whether MACE's ``U_matrix_real(coupling, target, correlation=nu)`` has an entry that is not zero (a
    coupling path reaches ``target``; its symmetric part may still vanish). MACE freezes the weights of the
    orders where it has none (the ``weights_*_zeroed`` flags of its ``Contraction``)."""
    filter_mid = ORDER_FOUR_FILTER if nu == 4 else None
    return any(p.ir == target and np.any(p.values != 0) for p in mace_paths(tuple(coupling), nu, filter_mid))


def couplings_from_dense(U: np.ndarray, dim_out: int, dim_in: int, nu: int, tolerance: float) -> Couplings:
    """The couplings of a dense ``U`` of ``dim_out * dim_in**nu * paths`` entries in MACE's order
    (``[M, i_1, ..., i_nu, k]``, size-1 dimensions possibly squeezed)."""
    U = np.asarray(U, dtype=np.float64)
    paths = U.shape[-1] if U.ndim else 1
    if U.size != dim_out * dim_in ** nu * paths:
        raise ValueError(f"a U tensor of shape {U.shape} does not fit {dim_out} output components, {dim_in} "
                         f"input components and correlation order {nu}")
    U = U.reshape((dim_out,) + (dim_in,) * nu + (paths,))
    columns = []
    for k in range(paths):
        column = U[..., k]
        indices = np.argwhere(column != 0)
        columns.append((indices, column[tuple(indices.T)]))
    return _symmetrised(columns, nu, tolerance)
