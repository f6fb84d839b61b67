"""CPU kernels of the pair sums (:mod:`sparse_accumulation.ops.pair_sums`) with numba.

Each sum is a serial numba function over a range of atoms, summing the pairs of each atom from its CSR segment
(:class:`sparse_accumulation.indices.Pairs`) in the segment's fixed order, so no two work items write the same output row:

* ``envsum``: ``env[a, nu] = sum over pairs p of atom a (by pair_first) of s[p, nu] * z[pair_second[p]]``;
* ``sensesum``: for the pairs of atom ``a`` (by pair_first), four at a time,
  ``sense[p, nu] = env[a, nu, :] . z[pair_second[p], :]``;
* ``featsum``: ``feat[b] = sum over pairs p of atom b (by pair_second) and nu of sense[p, nu] *
  env[pair_first[p], nu]``.

The terms of a sum are listed first (branch-free), then added four rows per sweep of the accumulator row. A term
whose sensitivity is exactly zero is left out where the row it multiplies is finite (it would add exactly
zero; hippynn's sensitivities vanish beyond the cut-off), so NaN and infinity propagate as in the formulas.
No ``[pairs, nu, feat]`` or ``[pairs, feat]`` intermediate exists. Large calls are cut into tasks of whole atoms
(cut from the segment sizes alone, never from the thread count) that the thread pool of :mod:`.threads` runs on
``numba.config.NUMBA_NUM_THREADS`` threads (the functions release the GIL); each output element is computed
by one task in one order, so results are bitwise reproducible. 16-bit inputs are computed in float32. The
functions are compiled on first use per dtype and cached on disk (numba's cache).
"""
from __future__ import annotations

import numba
import numpy as np
import torch

from .. import accumulation_dtype
from . import buffers
from . import threads as thread_pool

#: multiply-adds below which a call runs in the calling thread only
SERIAL_WORK = 1 << 20
#: multiply-adds per task, at least (a task per chunk of this much work, up to MAX_TASKS)
TASK_WORK = 1 << 20
#: most tasks per call
MAX_TASKS = 64

_FAST = {"contract", "reassoc"}  # fused multiply-adds and vectorised sums; NaN and infinity kept as IEEE says


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _all_finite(x, row):
    """Whether row ``row`` of the 2-D array ``x`` is all finite (``x * 0`` is exactly 0 for a finite ``x``)."""
    total = x.dtype.type(0)
    for f in range(x.shape[1]):
        total += x[row, f] * 0
    return total == 0


@numba.njit(cache=True, nogil=True)
def _longest(offsets, first_atom, last_atom):
    longest = 0
    for a in range(first_atom, last_atom):
        longest = max(longest, offsets[a + 1] - offsets[a])
    return longest


# The kernels below index arrays element by element and call no function with array arguments in their loops:
# a row view or such a call per term costs more (reference counting of the views) than the term's arithmetic.


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _envsum_atoms(s, z, second, order, offsets, out, first_atom, last_atom):
    """``out[a, nu] = sum over the pairs p of atom a of s[p, nu] * z[second[p]]`` for atoms ``first_atom ..
    last_atom - 1``, four terms per sweep of ``out[a, nu]``. A term with ``s[p, nu] == 0`` is left out where
    ``z[second[p]]`` is finite (it would add exactly zero)."""
    n_nu = s.shape[1]
    n_feat = z.shape[1]
    longest = _longest(offsets, first_atom, last_atom)
    pairs = np.empty(longest, dtype=np.int64)
    seconds = np.empty(longest, dtype=np.int64)
    keep = np.empty(longest, dtype=np.bool_)
    rows = np.empty(longest, dtype=np.int64)
    values = np.empty(longest, dtype=s.dtype)
    memo = np.zeros(z.shape[0], dtype=np.uint8)  # per atom of z: 0 not known, 1 finite, 2 not
    for a in range(first_atom, last_atom):
        start = offsets[a]
        n = offsets[a + 1] - start
        for j in range(n):
            p = order[start + j]
            b = second[p]
            if memo[b] == 0:
                memo[b] = 1 if _all_finite(z, b) else 2
            pairs[j] = p
            seconds[j] = b
            keep[j] = memo[b] == 2
        for nu in range(n_nu):
            count = 0
            for j in range(n):  # branch-free: every term is written, and kept by counting it
                v = s[pairs[j], nu]
                rows[count] = seconds[j]
                values[count] = v
                count += (v != 0) | keep[j]
            for f in range(n_feat):
                out[a, nu, f] = 0
            j = 0
            while j + 4 <= count:
                v0, v1, v2, v3 = values[j], values[j + 1], values[j + 2], values[j + 3]
                r0, r1, r2, r3 = rows[j], rows[j + 1], rows[j + 2], rows[j + 3]
                for f in range(n_feat):
                    out[a, nu, f] += (v0 * z[r0, f] + v1 * z[r1, f]) + (v2 * z[r2, f] + v3 * z[r3, f])
                j += 4
            while j < count:
                v0 = values[j]
                r0 = rows[j]
                for f in range(n_feat):
                    out[a, nu, f] += v0 * z[r0, f]
                j += 1


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _sensesum_atoms(env, z, second, order, offsets, out, zero, first_atom, last_atom):
    """``out[p, nu] = env[a, nu] . z[second[p]]`` for the pairs p of atoms ``first_atom .. last_atom - 1``, four
    pairs per sweep of ``env[a, nu]``."""
    n_nu = env.shape[1]
    n_feat = env.shape[2]
    for a in range(first_atom, last_atom):
        i = offsets[a]
        end = offsets[a + 1]
        while i + 4 <= end:
            p0, p1, p2, p3 = order[i], order[i + 1], order[i + 2], order[i + 3]
            b0, b1, b2, b3 = second[p0], second[p1], second[p2], second[p3]
            for nu in range(n_nu):
                t0 = t1 = t2 = t3 = zero
                for f in range(n_feat):
                    e = env[a, nu, f]
                    t0 += e * z[b0, f]
                    t1 += e * z[b1, f]
                    t2 += e * z[b2, f]
                    t3 += e * z[b3, f]
                out[p0, nu] = t0
                out[p1, nu] = t1
                out[p2, nu] = t2
                out[p3, nu] = t3
            i += 4
        while i < end:
            p0 = order[i]
            b0 = second[p0]
            for nu in range(n_nu):
                t0 = zero
                for f in range(n_feat):
                    t0 += env[a, nu, f] * z[b0, f]
                out[p0, nu] = t0
            i += 1


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _featsum_atoms(env, sense, first, order, offsets, out, first_atom, last_atom):
    """``out[b] = sum over the pairs p of atom b and nu of sense[p, nu] * env[first[p], nu]`` for atoms
    ``first_atom .. last_atom - 1``, four terms per sweep of ``out[b]``. Terms with ``sense[p, nu] == 0`` are left
    out where ``env[first[p]]`` is finite."""
    n_nu = sense.shape[1]
    n_feat = env.shape[2]
    rows_of = env.reshape(env.shape[0] * n_nu, n_feat)  # row a * n_nu + nu: env[a, nu]
    atoms_of = env.reshape(env.shape[0], n_nu * n_feat)
    longest = _longest(offsets, first_atom, last_atom) * n_nu
    rows = np.empty(longest, dtype=np.int64)
    values = np.empty(longest, dtype=sense.dtype)
    memo = np.zeros(env.shape[0], dtype=np.uint8)  # per atom of env: 0 not known, 1 finite, 2 not
    for b in range(first_atom, last_atom):
        count = 0
        for i in range(offsets[b], offsets[b + 1]):
            p = order[i]
            a = first[p]
            base = a * n_nu
            start = count
            for nu in range(n_nu):  # branch-free, as in _envsum_atoms
                v = sense[p, nu]
                rows[count] = base + nu
                values[count] = v
                count += v != 0
            if count - start < n_nu:
                if memo[a] == 0:
                    memo[a] = 1 if _all_finite(atoms_of, a) else 2
                if memo[a] == 2:
                    count = start
                    for nu in range(n_nu):
                        rows[count] = base + nu
                        values[count] = sense[p, nu]
                        count += 1
        for f in range(n_feat):
            out[b, f] = 0
        j = 0
        while j + 4 <= count:
            v0, v1, v2, v3 = values[j], values[j + 1], values[j + 2], values[j + 3]
            r0, r1, r2, r3 = rows[j], rows[j + 1], rows[j + 2], rows[j + 3]
            for f in range(n_feat):
                out[b, f] += (v0 * rows_of[r0, f] + v1 * rows_of[r1, f]) + (v2 * rows_of[r2, f] + v3 * rows_of[r3, f])
            j += 4
        while j < count:
            v0 = values[j]
            r0 = rows[j]
            for f in range(n_feat):
                out[b, f] += v0 * rows_of[r0, f]
            j += 1


# ----------------------------------------------------------------------------------------------------------
# thread pool


def _threads() -> int:
    return max(1, numba.config.NUMBA_NUM_THREADS)


def _tasks(offsets: np.ndarray, work_per_pair: int, work_per_atom: int) -> list:
    """Ranges of atoms of about equal work (pairs and atoms weighed), from the segment sizes alone."""
    n_atoms = offsets.shape[0] - 1
    total = int(offsets[-1]) * work_per_pair + n_atoms * work_per_atom
    count = min(MAX_TASKS, n_atoms, total // TASK_WORK) if total >= SERIAL_WORK else 1
    if count <= 1:
        return [(0, n_atoms)]
    cumulative = offsets * work_per_pair + np.arange(n_atoms + 1) * work_per_atom
    cuts = np.searchsorted(cumulative, np.arange(1, count) * (total / count))
    bounds = [0] + sorted(set(int(c) for c in cuts if 0 < c < n_atoms)) + [n_atoms]
    return list(zip(bounds[:-1], bounds[1:]))


def _run(kernel, args: tuple, offsets: np.ndarray, work_per_pair: int, work_per_atom: int) -> None:
    """``kernel(*args, first, last)`` over every atom (``offsets``: the CSR segments), in tasks that the calling
    thread and the pool's helpers take in turn (which thread runs a task does not change its results)."""
    thread_pool.run_tasks(lambda first, last: kernel(*args, first, last),
                            _tasks(offsets, work_per_pair, work_per_atom), _threads())


# ----------------------------------------------------------------------------------------------------------
# kernel interface (see sparse_accumulation.ops.pair_sums)


def _arrays(*tensors, dtype):
    return [t.detach().to(dtype).contiguous().numpy() for t in tensors]


def _finish(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return out if out.dtype == dtype else out.to(dtype)


def envsum(sensitivities, features, pairs):
    """``env[pair_first[p], nu, f] += sensitivities[p, nu] * features[pair_second[p], f]``: ``[n_atoms, n_nu,
    n_feat]`` (see :func:`sparse_accumulation.envsum`); CPU tensors whose shapes were checked, ``pairs``
    a :class:`sparse_accumulation.indices.Pairs`."""
    n_atoms, n_feat = features.shape
    n_nu = sensitivities.shape[1]
    dtype = accumulation_dtype(features.dtype)
    order, offsets, second = pairs.by_first()
    s, z = _arrays(sensitivities, features, dtype=dtype)
    out = buffers.tensor((n_atoms, n_nu, n_feat), dtype)
    _run(_envsum_atoms, (s, z, second.numpy(), order.numpy(), offsets.numpy(), out.numpy()),
         offsets.numpy(), n_nu * n_feat, n_nu * n_feat)
    return _finish(out, features.dtype)


def sensesum(env, features, pairs):
    """``sense[p, nu] = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]``: ``[n_pairs, n_nu]``
    (see :func:`sparse_accumulation.sensesum`); CPU tensors whose shapes were checked, ``pairs``
    a :class:`sparse_accumulation.indices.Pairs`."""
    n_atoms, n_nu, n_feat = env.shape
    dtype = accumulation_dtype(env.dtype)
    order, offsets, second = pairs.by_first()
    e, z = _arrays(env, features, dtype=dtype)
    out = buffers.tensor((len(pairs), n_nu), dtype)
    zero = np.dtype(buffers.NUMPY_DTYPES[dtype]).type(0)
    _run(_sensesum_atoms, (e, z, second.numpy(), order.numpy(), offsets.numpy(), out.numpy(), zero),
         offsets.numpy(), n_nu * n_feat, 1)
    return _finish(out, env.dtype)


def featsum(env, sense, pairs):
    """``feat[pair_second[p], f] += sum_nu env[pair_first[p], nu, f] * sense[p, nu]``: ``[n_atoms, n_feat]``
    (see :func:`sparse_accumulation.featsum`); CPU tensors whose shapes were checked, ``pairs``
    a :class:`sparse_accumulation.indices.Pairs`."""
    n_atoms, n_nu, n_feat = env.shape
    dtype = accumulation_dtype(env.dtype)
    order, offsets, first = pairs.by_second()
    e, s = _arrays(env, sense, dtype=dtype)
    out = buffers.tensor((n_atoms, n_feat), dtype)
    _run(_featsum_atoms, (e, s, first.numpy(), order.numpy(), offsets.numpy(), out.numpy()),
         offsets.numpy(), n_nu * n_feat, n_feat)
    return _finish(out, env.dtype)
