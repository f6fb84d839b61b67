"""Public functions: the pair sums, HIP-NN's interaction sums with hippynn's signatures, validated and
dispatched.

With ``P`` pairs ``(pair_first[p], pair_second[p])`` of ``n_atoms`` atoms (any order, repeats and self-pairs
allowed, atoms without pairs allowed)::

    envsum:   env[pair_first[p], nu, f]  += sensitivities[p, nu] * features[pair_second[p], f]
    sensesum: sense[p, nu]                = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]
    featsum:  feat[pair_second[p], f]    += sum_nu env[pair_first[p], nu, f] * sense[p, nu]

Shapes, dtypes and devices are checked here, in Python, so ``torch.compile`` traces the checks away; index
values are checked where the pairs are prepared (:class:`sparse_accumulation.indices.Pairs`): on the CPU before
anything is computed (``IndexError``), on CUDA with a device-side assertion that never forces a
synchronisation (the kernels never read or write through an out-of-range index).
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import backends
from ...kernels.reference import pair_sums as reference
from ..dispatch import eager_applies
from ..scripted import check_index, check_like
from . import eager, registered

__all__ = ["envsum", "sensesum", "featsum", "IMPLEMENTATIONS"]

#: accepted values of ``implementation=`` (``None`` means the process default, see :mod:`sparse_accumulation.backends`)
IMPLEMENTATIONS = ("auto", "numba", "triton", "torch", "index_add")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDICES = (torch.int32, torch.int64)


def _check_data(named, ndims) -> None:
    """Floating tensors of the given dimensions, one dtype and one device."""
    (first_name, first), _ = named
    for (name, t), ndim in zip(named, ndims):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
        if t.dim() != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
        if t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; they must match")
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; "
                             f"all tensors must be on one device")


def _check_pairs(pair_first, pair_second, device, n_pairs=None, pairs_from="pair_first") -> None:
    """1-D int64/int32 index tensors on ``device`` with ``n_pairs`` entries each (pair_first's by default)."""
    for name, t in (("pair_first", pair_first), ("pair_second", pair_second)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _INDICES:
            raise TypeError(f"{name} must be int64 or int32, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the data is on {device}; all tensors must be on one "
                             f"device")
    n_pairs = pair_first.shape[0] if n_pairs is None else n_pairs
    for name, t in (("pair_first", pair_first), ("pair_second", pair_second)):
        if t.shape[0] != n_pairs and name != pairs_from:
            raise ValueError(f"{name} has {t.shape[0]} pairs but {pairs_from} has {n_pairs}; they must match")


def _check_scripted(a_name: str, a: torch.Tensor, a_dim: int, b_name: str, b: torch.Tensor, b_dim: int,
                    pair_first: torch.Tensor, pair_second: torch.Tensor, n_pairs: int, pairs_from: str) -> None:
    """The checks of the public functions under TorchScript (the ops check the index values themselves): the
    data's dimensions, one floating dtype and device, 1-D integer pairs of ``n_pairs`` entries each (the count of
    ``pairs_from``)."""
    for name, t, ndim in ((a_name, a, a_dim), (b_name, b, b_dim)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64")
        if t.dim() != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions, got shape {t.shape}")
    check_like(b_name, b, a_name, a)
    for name, t in (("pair_first", pair_first), ("pair_second", pair_second)):
        check_index(name, t)
        check_like(name, t, a_name, a, t.dtype)
        if t.shape[0] != n_pairs:
            raise ValueError(f"{name} has {t.shape[0]} pairs but {pairs_from} has {n_pairs}; they must match")


def _equal(what: str, a_name: str, a: int, b_name: str, b: int) -> None:
    if a != b:
        raise ValueError(f"{what}: {a_name} is {a} but {b_name} is {b}; they must match")


def _sum(name: str, a, b, pair_first, pair_second, implementation):
    """Sum ``name`` of checked inputs: the reference formulas (a reference name), the eager path, or the
    registered op (which resolves the requested name where it runs: an exported graph keeps ``"auto"``)."""
    if implementation is not None and implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)} or None, "
                         f"got {implementation!r}")
    requested = backends.get_default_implementation() if implementation is None else implementation
    resolved = backends.resolved(requested, a.device)
    if resolved in backends.REFERENCES:
        registered.pairs_of(name, a, b, pair_first, pair_second).checked()
        return getattr(reference, name)(a, b, pair_first, pair_second)
    if eager_applies(a, b, pair_first, pair_second):
        return eager.run(name, a, b, pair_first, pair_second, resolved)
    return getattr(registered, name)(a, b, pair_first, pair_second, requested)


def envsum(sensitivities: torch.Tensor, features: torch.Tensor, pair_first: torch.Tensor, pair_second: torch.Tensor,
           implementation: Optional[str] = None) -> torch.Tensor:
    """Sum the outer products of pair sensitivities and neighbour features onto the first atom of each pair:
    ``env[pair_first[p], nu, f] += sensitivities[p, nu] * features[pair_second[p], f]``.

    hippynn's ``envsum`` (same signature, shapes and results); differentiable with respect to ``sensitivities``
    and ``features`` to any order (gradients: :func:`sensesum` and :func:`featsum`).

    Args:
        sensitivities: ``[n_pairs, n_nu]`` float16, bfloat16, float32 or float64.
        features: ``[n_atoms, n_feat]``, same dtype and device.
        pair_first: ``[n_pairs]`` int64 or int32, atom receiving each pair, in ``[0, n_atoms)``; any order,
            repeats allowed.
        pair_second: ``[n_pairs]`` int64 or int32, atom whose features each pair brings, in ``[0, n_atoms)``.
        implementation: ``None`` (the process default), ``"auto"`` (numba on CPU, Triton on CUDA), ``"numba"``,
            ``"triton"``, ``"torch"`` (portable, chunked) or ``"index_add"`` (the reference formulas, torch's
            autograd; memory grows with ``n_pairs * n_nu * n_feat``). Called from TorchScript (hippynn's
            interaction layers in a scripted model), the function calls the registered op, ``None`` meaning
            ``"auto"`` and ``"index_add"`` the portable kernels.

    Returns:
        ``[n_atoms, n_nu, n_feat]`` of the inputs' dtype and device (zeros for atoms without pairs). 16-bit
        inputs are summed in float32.

    Raises:
        TypeError: a non-tensor, non-floating data, data dtypes differ, indices not int64/int32.
        ValueError: wrong number of dimensions, ``n_pairs`` differ, tensors on different devices, unknown
            implementation.
        IndexError: (CPU) an index outside ``[0, n_atoms)``. On CUDA a device-side assertion reports it
            asynchronously (nothing is read or written through it).
        RuntimeError: the requested implementation is not available for the device.
    """
    if torch.jit.is_scripting():
        _check_scripted("sensitivities", sensitivities, 2, "features", features, 2, pair_first, pair_second,
                        sensitivities.shape[0], "sensitivities")
        return torch.ops.sparse_accumulation.envsum(sensitivities, features, pair_first, pair_second,
                                                    "auto" if implementation is None else implementation)
    _check_data((("sensitivities", sensitivities), ("features", features)), (2, 2))
    _check_pairs(pair_first, pair_second, features.device, sensitivities.shape[0], "sensitivities")
    return _sum("envsum", sensitivities, features, pair_first, pair_second, implementation)


def sensesum(env: torch.Tensor, features: torch.Tensor, pair_first: torch.Tensor, pair_second: torch.Tensor,
             implementation: Optional[str] = None) -> torch.Tensor:
    """Contract the environment of each pair's first atom with the features of its second atom:
    ``sense[p, nu] = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]``.

    hippynn's ``sensesum``; the gradient of :func:`envsum` with respect to ``sensitivities``. Differentiable with
    respect to ``env`` and ``features`` to any order.

    Args:
        env: ``[n_atoms, n_nu, n_feat]`` float16, bfloat16, float32 or float64.
        features: ``[n_atoms, n_feat]``, same dtype and device.
        pair_first, pair_second: ``[n_pairs]`` int64 or int32 atom indices in ``[0, n_atoms)``.
        implementation: as for :func:`envsum`.

    Returns:
        ``[n_pairs, n_nu]`` of the inputs' dtype and device.

    Raises:
        TypeError, ValueError, IndexError, RuntimeError: as for :func:`envsum` (also: ``env`` and ``features``
        disagree on ``n_atoms`` or ``n_feat``).
    """
    if torch.jit.is_scripting():
        _check_scripted("env", env, 3, "features", features, 2, pair_first, pair_second, pair_first.shape[0],
                        "pair_first")
        if env.shape[0] != features.shape[0] or env.shape[2] != features.shape[1]:
            raise ValueError(f"env [n_atoms, n_nu, n_feat] and features [n_atoms, n_feat] disagree: shapes "
                             f"{env.shape} and {features.shape}")
        return torch.ops.sparse_accumulation.sensesum(env, features, pair_first, pair_second,
                                                      "auto" if implementation is None else implementation)
    _check_data((("env", env), ("features", features)), (3, 2))
    _equal("n_atoms", "env.shape[0]", env.shape[0], "features.shape[0]", features.shape[0])
    _equal("n_feat", "env.shape[2]", env.shape[2], "features.shape[1]", features.shape[1])
    _check_pairs(pair_first, pair_second, env.device)
    return _sum("sensesum", env, features, pair_first, pair_second, implementation)


def featsum(env: torch.Tensor, sense: torch.Tensor, pair_first: torch.Tensor, pair_second: torch.Tensor,
            implementation: Optional[str] = None) -> torch.Tensor:
    """Contract the environment of each pair's first atom with the pair's sensitivities and sum onto the second
    atom: ``feat[pair_second[p], f] += sum_nu env[pair_first[p], nu, f] * sense[p, nu]``.

    hippynn's ``featsum``; the gradient of :func:`envsum` with respect to ``features``. Differentiable with
    respect to ``env`` and ``sense`` to any order.

    Args:
        env: ``[n_atoms, n_nu, n_feat]`` float16, bfloat16, float32 or float64.
        sense: ``[n_pairs, n_nu]``, same dtype and device.
        pair_first, pair_second: ``[n_pairs]`` int64 or int32 atom indices in ``[0, n_atoms)``.
        implementation: as for :func:`envsum`.

    Returns:
        ``[n_atoms, n_feat]`` of the inputs' dtype and device (zeros for atoms that are no pair's second atom).

    Raises:
        TypeError, ValueError, IndexError, RuntimeError: as for :func:`envsum` (also: ``env`` and ``sense``
        disagree on ``n_nu``).
    """
    if torch.jit.is_scripting():
        _check_scripted("env", env, 3, "sense", sense, 2, pair_first, pair_second, sense.shape[0], "sense")
        if env.shape[1] != sense.shape[1]:
            raise ValueError(f"n_nu: env.shape[1] is {env.shape[1]} but sense.shape[1] is {sense.shape[1]}; they "
                             "must match")
        return torch.ops.sparse_accumulation.featsum(env, sense, pair_first, pair_second,
                                                     "auto" if implementation is None else implementation)
    _check_data((("env", env), ("sense", sense)), (3, 2))
    _equal("n_nu", "env.shape[1]", env.shape[1], "sense.shape[1]", sense.shape[1])
    _check_pairs(pair_first, pair_second, env.device, sense.shape[0], "sense")
    return _sum("featsum", env, sense, pair_first, pair_second, implementation)
