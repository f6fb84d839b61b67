"""CPU kernels of the interaction sums (:mod:`sparse_accumulation.hippynn`) with numba.

Each sum is a serial numba function over a range of atoms, summing the pairs of each atom from its CSR segment
(:mod:`.pair_segments`) in the segment's fixed order, so no two work items write the same output row:

* ``envsum``: ``env[a] = sum over pairs p of atom a (by pair_first) of s[p, :, None] * z[pair_second[p], None, :]``,
  four pairs per sweep of the ``[n_nu, n_feat]`` accumulator;
* ``sensesum``: for the pairs of atom ``a`` (by pair_first), four at a time,
  ``sense[p, nu] = env[a, nu, :] . z[pair_second[p], :]``;
* ``featsum``: ``feat[b] = sum over pairs p of atom b (by pair_second) of sense[p, :] @ env[pair_first[p]]``,
  four ``nu`` per sweep of the ``[n_feat]`` accumulator.

No ``[pairs, nu, feat]`` or ``[pairs, feat]`` intermediate exists. Large calls are cut into tasks of whole atoms
(cut from the segment sizes alone, never from the thread count) that a thread pool of
``numba.config.NUMBA_NUM_THREADS`` threads runs (the functions release the GIL); each output element is computed
by one task in one order, so results are bitwise reproducible. 16-bit inputs are computed in float32. The
functions are compiled on first use per dtype and cached on disk (numba's cache).

Also here, for :mod:`.pair_segments`: the range check of an index tensor and its counting sort into segments.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch

from . import accumulation_dtype, buffers
from . import pair_segments

#: multiply-adds below which a call runs in the calling thread only
SERIAL_WORK = 1 << 20
#: multiply-adds per task, at least (a task per chunk of this much work, up to MAX_TASKS)
TASK_WORK = 1 << 20
#: most tasks per call
MAX_TASKS = 64

_FAST = {"contract", "reassoc"}  # fused multiply-adds and vectorised sums; NaN and infinity kept as IEEE says


@numba.njit(cache=True, nogil=True)
def _first_outside(key, n):
    for p in range(key.shape[0]):
        if key[p] < 0 or key[p] >= n:
            return p
    return -1


@numba.njit(cache=True, nogil=True)
def _counting_sort(key, n, order, offsets):
    """``order``: positions of ``key`` sorted stably by value (values in ``[0, n)``); ``offsets[a]``: where the
    positions of value ``a`` start (``n + 1`` entries)."""
    for a in range(n + 1):
        offsets[a] = 0
    for p in range(key.shape[0]):
        offsets[key[p] + 1] += 1
    for a in range(n):
        offsets[a + 1] += offsets[a]
    cursor = offsets[:n].copy()
    for p in range(key.shape[0]):
        k = key[p]
        order[cursor[k]] = p
        cursor[k] += 1


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _all_finite(x):
    """Whether every element of the 1-D array ``x`` is finite (``x * 0`` is 0 exactly for finite ``x``)."""
    total = x.dtype.type(0) if x.shape[0] == 0 else x[0] * 0
    for f in range(x.shape[0]):
        total += x[f] * 0
    return total == 0


@numba.njit(cache=True, nogil=True)
def _finite_row(x, row, memo):
    """Whether row ``row`` of the 2-D array ``x`` is all finite, remembered in ``memo`` (0: not yet known)."""
    if memo[row] == 0:
        memo[row] = 1 if _all_finite(x[row]) else 2
    return memo[row] == 1


@numba.njit(cache=True, nogil=True)
def _longest(offsets, first_atom, last_atom):
    longest = 0
    for a in range(first_atom, last_atom):
        longest = max(longest, offsets[a + 1] - offsets[a])
    return longest


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _add_rows(acc, x, rows, values, count):
    """``acc = sum over j < count of values[j] * x[rows[j]]``, four rows per sweep of ``acc``."""
    n = acc.shape[0]
    for f in range(n):
        acc[f] = 0
    j = 0
    while j + 4 <= count:
        v0, v1, v2, v3 = values[j], values[j + 1], values[j + 2], values[j + 3]
        x0, x1, x2, x3 = x[rows[j]], x[rows[j + 1]], x[rows[j + 2]], x[rows[j + 3]]
        for f in range(n):
            acc[f] += (v0 * x0[f] + v1 * x1[f]) + (v2 * x2[f] + v3 * x3[f])
        j += 4
    while j < count:
        v0 = values[j]
        x0 = x[rows[j]]
        for f in range(n):
            acc[f] += v0 * x0[f]
        j += 1


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _envsum_atoms(s, z, second, order, offsets, out, first_atom, last_atom):
    """``out[a, nu] = sum over the pairs p of atom a of s[p, nu] * z[second[p]]`` for atoms ``first_atom ..
    last_atom - 1``. A term with ``s[p, nu] == 0`` is left out where ``z[second[p]]`` is finite (adding it would
    add exactly zero)."""
    n_nu = s.shape[1]
    longest = _longest(offsets, first_atom, last_atom)
    pairs = np.empty(longest, dtype=np.int64)
    seconds = np.empty(longest, dtype=np.int64)
    keep = np.empty(longest, dtype=np.bool_)
    rows = np.empty(longest, dtype=np.int64)
    values = np.empty(longest, dtype=s.dtype)
    memo = np.zeros(z.shape[0], dtype=np.uint8)
    for a in range(first_atom, last_atom):
        start = offsets[a]
        n = offsets[a + 1] - start
        for j in range(n):
            p = order[start + j]
            pairs[j] = p
            seconds[j] = second[p]
            keep[j] = not _finite_row(z, seconds[j], memo)
        for nu in range(n_nu):
            count = 0
            for j in range(n):  # branch-free: a term is written, and kept by counting it
                v = s[pairs[j], nu]
                rows[count] = seconds[j]
                values[count] = v
                count += (v != 0) | keep[j]
            _add_rows(out[a, nu], z, rows, values, count)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _sensesum_atoms(env, z, second, order, offsets, out, zero, first_atom, last_atom):
    """``out[p, nu] = env[a, nu] . z[second[p]]`` for the pairs p of atoms ``first_atom .. last_atom - 1``."""
    n_nu = env.shape[1]
    n_feat = env.shape[2]
    for a in range(first_atom, last_atom):
        e = env[a]
        i = offsets[a]
        end = offsets[a + 1]
        while i + 4 <= end:
            p0, p1, p2, p3 = order[i], order[i + 1], order[i + 2], order[i + 3]
            z0, z1, z2, z3 = z[second[p0]], z[second[p1]], z[second[p2]], z[second[p3]]
            for nu in range(n_nu):
                row = e[nu]
                t0 = t1 = t2 = t3 = zero
                for f in range(n_feat):
                    r = row[f]
                    t0 += r * z0[f]
                    t1 += r * z1[f]
                    t2 += r * z2[f]
                    t3 += r * z3[f]
                out[p0, nu] = t0
                out[p1, nu] = t1
                out[p2, nu] = t2
                out[p3, nu] = t3
            i += 4
        while i < end:
            p0 = order[i]
            z0 = z[second[p0]]
            for nu in range(n_nu):
                row = e[nu]
                t0 = zero
                for f in range(n_feat):
                    t0 += row[f] * z0[f]
                out[p0, nu] = t0
            i += 1


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _featsum_atoms(env, sense, first, order, offsets, out, first_atom, last_atom):
    """``out[b] = sum over the pairs p of atom b and nu of sense[p, nu] * env[first[p], nu]`` for atoms
    ``first_atom .. last_atom - 1``. Terms with ``sense[p, nu] == 0`` are left out where ``env[first[p]]`` is
    finite."""
    n_nu = sense.shape[1]
    rows_of = env.reshape(env.shape[0] * n_nu, env.shape[2])
    atoms_of = env.reshape(env.shape[0], n_nu * env.shape[2])
    longest = _longest(offsets, first_atom, last_atom) * n_nu
    rows = np.empty(longest, dtype=np.int64)
    values = np.empty(longest, dtype=sense.dtype)
    memo = np.zeros(env.shape[0], dtype=np.uint8)
    for b in range(first_atom, last_atom):
        count = 0
        for i in range(offsets[b], offsets[b + 1]):
            p = order[i]
            a = first[p]
            base = a * n_nu
            kept = count
            for nu in range(n_nu):  # branch-free, as in _envsum_atoms
                v = sense[p, nu]
                rows[count] = base + nu
                values[count] = v
                count += v != 0
            if count - kept < n_nu and not _finite_row(atoms_of, a, memo):
                count = kept
                for nu in range(n_nu):
                    rows[count] = base + nu
                    values[count] = sense[p, nu]
                    count += 1
        _add_rows(out[b], rows_of, rows, values, count)


# ----------------------------------------------------------------------------------------------------------
# index tools for pair_segments


def check_range(key: torch.Tensor, n_atoms: int, name: str) -> None:
    """Raise ``IndexError`` naming ``name`` unless every value of the int64 CPU tensor ``key`` is in
    ``[0, n_atoms)``."""
    position = _first_outside(key.numpy(), n_atoms)
    if position >= 0:
        raise IndexError(f"{name} must hold atom indices in [0, {n_atoms}) (n_atoms from the atom dimension), "
                         f"got {name}[{position}] = {int(key[position])}")


def counting_sort(key: torch.Tensor, n_atoms: int) -> tuple:
    """``(order, offsets)`` of an int64 CPU tensor with values in ``[0, n_atoms)`` (see :mod:`.pair_segments`)."""
    order = torch.empty(key.shape[0], dtype=torch.int64)
    offsets = torch.empty(n_atoms + 1, dtype=torch.int64)
    _counting_sort(key.numpy(), n_atoms, order.numpy(), offsets.numpy())
    return order, offsets


# ----------------------------------------------------------------------------------------------------------
# thread pool


_pool = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS),
                                       thread_name_prefix="sparse_accumulation_pairs")
        return _pool


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


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
    """``kernel(*args, first, last)`` over every atom (``offsets``: the CSR segments), in tasks on the thread
    pool."""
    tasks = _tasks(offsets, work_per_pair, work_per_atom)
    if len(tasks) == 1:
        kernel(*args, *tasks[0])
        return
    futures = [_executor().submit(kernel, *args, *task) for task in tasks[1:]]
    kernel(*args, *tasks[0])
    for future in futures:
        future.result()


# ----------------------------------------------------------------------------------------------------------
# kernel interface (see sparse_accumulation.hippynn.ops)


def _arrays(*tensors, dtype):
    return [t.detach().to(dtype).contiguous().numpy() for t in tensors]


def _finish(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return out if out.dtype == dtype else out.to(dtype)


def envsum(sensitivities, features, pair_first, pair_second):
    """``env[pair_first[p], nu, f] += sensitivities[p, nu] * features[pair_second[p], f]``: ``[n_atoms, n_nu,
    n_feat]`` (see :func:`sparse_accumulation.hippynn.envsum`); CPU tensors whose shapes were checked."""
    n_atoms, n_feat = features.shape
    n_nu = sensitivities.shape[1]
    dtype = accumulation_dtype(features.dtype)
    order, offsets, second = pair_segments.prepare(pair_first, "pair_first", pair_second, "pair_second", n_atoms)
    s, z = _arrays(sensitivities, features, dtype=dtype)
    out = buffers.tensor((n_atoms, n_nu, n_feat), dtype)
    _run(_envsum_atoms, (s, z, second.numpy(), order.numpy(), offsets.numpy(), out.numpy()),
         offsets.numpy(), n_nu * n_feat, n_nu * n_feat)
    return _finish(out, features.dtype)


def sensesum(env, features, pair_first, pair_second):
    """``sense[p, nu] = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]``: ``[n_pairs, n_nu]``
    (see :func:`sparse_accumulation.hippynn.sensesum`); CPU tensors whose shapes were checked."""
    n_atoms, n_nu, n_feat = env.shape
    dtype = accumulation_dtype(env.dtype)
    order, offsets, second = pair_segments.prepare(pair_first, "pair_first", pair_second, "pair_second", n_atoms)
    e, z = _arrays(env, features, dtype=dtype)
    out = buffers.tensor((pair_first.shape[0], n_nu), dtype)
    zero = np.dtype(buffers.NUMPY_DTYPES[dtype]).type(0)
    _run(_sensesum_atoms, (e, z, second.numpy(), order.numpy(), offsets.numpy(), out.numpy(), zero),
         offsets.numpy(), n_nu * n_feat, 1)
    return _finish(out, env.dtype)


def featsum(env, sense, pair_first, pair_second):
    """``feat[pair_second[p], f] += sum_nu env[pair_first[p], nu, f] * sense[p, nu]``: ``[n_atoms, n_feat]``
    (see :func:`sparse_accumulation.hippynn.featsum`); CPU tensors whose shapes were checked."""
    n_atoms, n_nu, n_feat = env.shape
    dtype = accumulation_dtype(env.dtype)
    order, offsets, first = pair_segments.prepare(pair_second, "pair_second", pair_first, "pair_first", n_atoms)
    e, s = _arrays(env, sense, dtype=dtype)
    out = buffers.tensor((n_atoms, n_feat), dtype)
    _run(_featsum_atoms, (e, s, first.numpy(), order.numpy(), offsets.numpy(), out.numpy()),
         offsets.numpy(), n_nu * n_feat, n_feat)
    return _finish(out, env.dtype)
