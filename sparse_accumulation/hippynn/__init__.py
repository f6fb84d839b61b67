"""HIP-NN's interaction sums (hippynn's ``envsum``, ``sensesum``, ``featsum``: the pair sums of
:mod:`sparse_accumulation.ops.pair_sums`, under the names hippynn's users know) and a hippynn kernel backend.

With ``P`` pairs ``(pair_first[p], pair_second[p])`` of ``n_atoms`` atoms::

    envsum:   env[pair_first[p], nu, f]  += sensitivities[p, nu] * features[pair_second[p], f]   [n_atoms, n_nu, n_feat]
    sensesum: sense[p, nu]                = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]   [P, n_nu]
    featsum:  feat[pair_second[p], f]    += sum_nu env[pair_first[p], nu, f] * sense[p, nu]      [n_atoms, n_feat]

The three are each other's gradients, so they are differentiable to any order with the same kernels (numba on
the CPU, Triton on CUDA), in memory ``O(n_pairs * n_nu + n_atoms * n_nu * n_feat)``: no ``[n_pairs, n_nu,
n_feat]`` tensor is ever made. :func:`register` makes them a hippynn custom-kernel implementation; hippynn itself
is only imported there.
"""
from .backend import DEFAULT_NAME, register
from ..ops.pair_sums.api import IMPLEMENTATIONS, envsum, featsum, sensesum

__all__ = ["envsum", "sensesum", "featsum", "register", "DEFAULT_NAME", "IMPLEMENTATIONS"]
