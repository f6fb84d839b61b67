"""Public functions: the interaction sums of HIP-NN with hippynn's signatures, validated and dispatched.

With ``P`` pairs ``(pair_first[p], pair_second[p])`` of ``n_atoms`` atoms (any order, repeats and self-pairs
allowed, atoms without pairs allowed)::

    envsum:   env[pair_first[p], nu, f]  += sensitivities[p, nu] * features[pair_second[p], f]
    sensesum: sense[p, nu]                = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]
    featsum:  feat[pair_second[p], f]    += sum_nu env[pair_first[p], nu, f] * sense[p, nu]

Shapes, dtypes and devices are checked here, in Python, so ``torch.compile`` traces the checks away; index
values are checked by the kernels (:mod:`sparse_accumulation.kernels.pair_segments`): on the CPU before
anything is computed (``IndexError``), on CUDA with a device-side assertion that never forces a
synchronisation (the kernels never read or write through an out-of-range index).
"""
from __future__ import annotations

import torch

from .. import backends
from .. import eager as _eager
from ..kernels import hippynn_reference, pair_segments
from . import eager, ops

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


def _equal(what: str, a_name: str, a: int, b_name: str, b: int) -> None:
    if a != b:
        raise ValueError(f"{what}: {a_name} is {a} but {b_name} is {b}; they must match")


def _implementation(implementation, device) -> str:
    """``"index_add"`` for the reference formulas, else the name the op resolves."""
    if implementation is not None and implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)} or None, "
                         f"got {implementation!r}")
    requested = backends.get_default_implementation() if implementation is None else implementation
    resolved = backends.resolved(requested, device)
    return "index_add" if resolved in backends.REFERENCES else requested


def _reference(function, data, pair_first, pair_second, n_atoms):
    for name, key in (("pair_first", pair_first), ("pair_second", pair_second)):
        pair_segments.lookup(key, n_atoms).check(name)
    return function(*data, pair_first, pair_second)


def envsum(sensitivities, features, pair_first, pair_second, *, implementation=None):
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
            autograd; memory grows with ``n_pairs * n_nu * n_feat``).

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
    _check_data((("sensitivities", sensitivities), ("features", features)), (2, 2))
    _check_pairs(pair_first, pair_second, features.device, sensitivities.shape[0], "sensitivities")
    name = _implementation(implementation, features.device)
    if name == "index_add":
        return _reference(hippynn_reference.envsum, (sensitivities, features), pair_first, pair_second,
                          features.shape[0])
    if _eager.applies(sensitivities, features, pair_first, pair_second):
        return eager.run("envsum", sensitivities, features, pair_first, pair_second,
                         ops.kernels(name, features.device))
    return ops.envsum(sensitivities, features, pair_first, pair_second, name)


def sensesum(env, features, pair_first, pair_second, *, implementation=None):
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
    _check_data((("env", env), ("features", features)), (3, 2))
    _equal("n_atoms", "env.shape[0]", env.shape[0], "features.shape[0]", features.shape[0])
    _equal("n_feat", "env.shape[2]", env.shape[2], "features.shape[1]", features.shape[1])
    _check_pairs(pair_first, pair_second, env.device)
    name = _implementation(implementation, env.device)
    if name == "index_add":
        return _reference(hippynn_reference.sensesum, (env, features), pair_first, pair_second, env.shape[0])
    if _eager.applies(env, features, pair_first, pair_second):
        return eager.run("sensesum", env, features, pair_first, pair_second, ops.kernels(name, env.device))
    return ops.sensesum(env, features, pair_first, pair_second, name)


def featsum(env, sense, pair_first, pair_second, *, implementation=None):
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
    _check_data((("env", env), ("sense", sense)), (3, 2))
    _equal("n_nu", "env.shape[1]", env.shape[1], "sense.shape[1]", sense.shape[1])
    _check_pairs(pair_first, pair_second, env.device, sense.shape[0], "sense")
    name = _implementation(implementation, env.device)
    if name == "index_add":
        return _reference(hippynn_reference.featsum, (env, sense), pair_first, pair_second, env.shape[0])
    if _eager.applies(env, sense, pair_first, pair_second):
        return eager.run("featsum", env, sense, pair_first, pair_second, ops.kernels(name, env.device))
    return ops.featsum(env, sense, pair_first, pair_second, name)
