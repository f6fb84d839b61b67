"""Portable kernels of the pair sums (any device): the reference formulas over bounded chunks of pairs.

The fallback where neither numba (CPU) nor Triton (CUDA) runs. Each chunk of pairs holds a ``[chunk, n_nu,
n_feat]`` intermediate of at most about :data:`CHUNK_ELEMENTS` elements. Index values are checked as for the
other kernels (:class:`sparse_accumulation.indices.Pairs`). ``index_add`` on CUDA adds with atomics, so there
the order of the sums (and the last bits of the results) may vary from run to run.
"""
from __future__ import annotations

import torch

from .. import accumulation_dtype
from ..reference import pair_sums as pair_sums_reference

CHUNK_ELEMENTS = 1 << 22


def _chunks(n_pairs: int, per_pair: int):
    step = max(1, CHUNK_ELEMENTS // max(per_pair, 1))
    return [slice(start, min(start + step, n_pairs)) for start in range(0, n_pairs, step)]


def envsum(sensitivities, features, pairs):
    """As :func:`sparse_accumulation.kernels.numba.pair_sums.envsum`, on any device."""
    n_atoms, n_feat = features.shape
    n_nu = sensitivities.shape[1]
    pair_first, pair_second = pairs.checked()
    dtype = accumulation_dtype(features.dtype)
    s, z = sensitivities.to(dtype), features.to(dtype)
    out = z.new_zeros((n_atoms, n_nu, n_feat))
    for chunk in _chunks(s.shape[0], n_nu * n_feat):
        out.index_add_(0, pair_first[chunk], pair_sums_reference.envsum_terms(s[chunk], z, pair_second[chunk]))
    return out.to(features.dtype)


def sensesum(env, features, pairs):
    """As :func:`sparse_accumulation.kernels.numba.pair_sums.sensesum`, on any device."""
    n_atoms, n_nu, n_feat = env.shape
    pair_first, pair_second = pairs.checked()
    parts = [pair_sums_reference.sensesum(env, features, pair_first[chunk], pair_second[chunk])
             for chunk in _chunks(pair_first.shape[0], n_nu * n_feat)]
    return torch.cat(parts) if parts else env.new_empty((0, n_nu))


def featsum(env, sense, pairs):
    """As :func:`sparse_accumulation.kernels.numba.pair_sums.featsum`, on any device."""
    n_atoms, n_nu, n_feat = env.shape
    pair_first, pair_second = pairs.checked()
    dtype = accumulation_dtype(env.dtype)
    e, s = env.to(dtype), sense.to(dtype)
    out = e.new_zeros((n_atoms, n_feat))
    for chunk in _chunks(s.shape[0], n_nu * n_feat):
        out.index_add_(0, pair_second[chunk], pair_sums_reference.featsum_terms(e, s[chunk], pair_first[chunk]))
    return out.to(env.dtype)
