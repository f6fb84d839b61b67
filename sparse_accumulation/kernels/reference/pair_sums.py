"""Reference formulas of the pair sums (:mod:`sparse_accumulation.ops.pair_sums`): gather, multiply, ``index_add``.

Plain, differentiable torch on any device (autograd by torch), for validation and as the portable fallback's
building blocks. They materialise the per-pair terms, ``[n_pairs, n_nu, n_feat]`` for ``envsum`` and
``featsum``, so their memory grows with pairs * nu * feat; use :func:`sparse_accumulation.envsum` and
its siblings for real work. 16-bit inputs are computed in float32; the result has the inputs' dtype. No
validation beyond torch's own.
"""
from __future__ import annotations


from .. import accumulation_dtype

__all__ = ["envsum", "sensesum", "featsum", "envsum_terms", "featsum_terms"]


def envsum_terms(sensitivities, features, pair_second):
    """``[n_pairs, n_nu, n_feat]``: ``sensitivities[p, nu] * features[pair_second[p], f]``."""
    return sensitivities.unsqueeze(2) * features[pair_second].unsqueeze(1)


def featsum_terms(env, sense, pair_first):
    """``[n_pairs, n_feat]``: ``sum_nu env[pair_first[p], nu, f] * sense[p, nu]``."""
    return (env[pair_first] * sense.unsqueeze(2)).sum(1)


def envsum(sensitivities, features, pair_first, pair_second):
    """``env[pair_first[p], nu, f] += sensitivities[p, nu] * features[pair_second[p], f]`` -> ``[n_atoms, n_nu,
    n_feat]``."""
    dtype = accumulation_dtype(features.dtype)
    terms = envsum_terms(sensitivities.to(dtype), features.to(dtype), pair_second)
    out = terms.new_zeros((features.shape[0], sensitivities.shape[1], features.shape[1]))
    return out.index_add(0, pair_first, terms).to(features.dtype)


def sensesum(env, features, pair_first, pair_second):
    """``sense[p, nu] = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]`` -> ``[n_pairs, n_nu]``."""
    dtype = accumulation_dtype(env.dtype)
    return (env.to(dtype)[pair_first] * features.to(dtype)[pair_second].unsqueeze(1)).sum(2).to(env.dtype)


def featsum(env, sense, pair_first, pair_second):
    """``feat[pair_second[p], f] += sum_nu env[pair_first[p], nu, f] * sense[p, nu]`` -> ``[n_atoms, n_feat]``."""
    dtype = accumulation_dtype(env.dtype)
    terms = featsum_terms(env.to(dtype), sense.to(dtype), pair_first)
    out = terms.new_zeros((env.shape[0], env.shape[2]))
    return out.index_add(0, pair_second, terms).to(env.dtype)
