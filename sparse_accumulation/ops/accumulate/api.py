"""Public functions: validation, dispatch to an implementation, and the three layouts of the peer API.

``accumulate`` computes, for every ``k``::

    out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]

with the rule given as index tensors (the peer library's signature); ``accumulate_rule`` takes a prepared
:class:`~sparse_accumulation.Rule` instead, optionally with a third, weight operand ``W``. The leading
dimensions of the operands broadcast. Checks here use shapes, dtypes and devices only, so ``torch.compile``
traces them without graph breaks; index values are checked once per rule (when a :class:`Rule` is made, or
inside the indexed ops for index tensors).
"""
from __future__ import annotations

import math

import torch

from ... import backends
from ...descriptors.rules import Rule
from ...indices import check_index_tensor, prepare_rule
from ...kernels import reference
from ..dispatch import eager_applies
from . import eager, registered

_FLOAT_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def _check_data(named) -> None:
    """Raise for operands that are not floating tensors of one dtype and device, or have no dimension."""
    first = named[0][1]
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must have a floating dtype (float16, bfloat16, float32 or float64), "
                            f"got {t.dtype}")
        if t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but X1 has dtype {first.dtype}; they must match")
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but X1 is on {first.device}; all tensors must be on one device")


def _check_operand_dims(named, active: str) -> None:
    for name, t in named:
        if t.dim() < 1:
            raise ValueError(f"{name} needs at least one dimension (the {active} active dimension), "
                             f"got shape {tuple(t.shape)}")


def _check_coefficients(C, nnz: int) -> None:
    if C.dim() != 1 or C.shape[0] != nnz:
        raise ValueError(f"C must be 1-D with one coefficient per index (length {nnz}), got shape {tuple(C.shape)}")


def _reference(name, X1, X2, W, C, rule):
    device = X1.device
    indices = [rule.tensor(n, device) for n in ("m1", "m2", "mu")]
    weights = {} if W is None else {"W": W, "w": rule.tensor("w", device)}
    return reference.BY_NAME[name](X1, X2, indices[2], rule.output_size, indices[0], indices[1], C, **weights)


def accumulate_rule(X1, X2, rule, C, W=None, *, implementation=None, indices_1=None, indices_2=None,
                    indices_w=None, indices_out=None, size_out=None, reduction=None):
    """Sparse accumulation under a prepared :class:`~sparse_accumulation.Rule`:
    ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]``, or with a weighted rule
    ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * W[..., w[k]] * C[k]``.

    The fastest way to call the op: no index value is read, no host-device copy or synchronisation happens,
    and ``torch.compile`` sees the Triton kernels (the rule enters the graph as a constant).

    Args:
        X1: ``[..., M1]`` floating tensor (float16, bfloat16, float32 or float64); ``M1 = rule.input_sizes[0]``.
        X2: ``[..., M2]``; leading dimensions broadcast with X1's (and W's), as in torch: a shared operand
            (for example ``[E, 1, M2]`` against ``[E, F, M1]``) is read in place, never expanded in memory.
        rule: the rule (indices and sizes).
        C: coefficients, 1-D of length ``rule.nnz``, same dtype and device as X1.
        W: ``[..., rule.weight_size]``, for weighted rules only (and required by them).
        implementation: ``None`` (the process default), ``"auto"``, a kernel (``"numba"``, ``"triton"``,
            ``"torch"``) or a reference (``"loops"``, ``"index_add"``; ``"dense"`` and ``"sparse"`` without W).
        indices_1, indices_2, indices_w, indices_out, size_out, reduction: message passing (see
            :func:`sparse_accumulation.accumulate_graph`): the first dimension of X1 / X2 / W is gathered
            by its index (1-D integer tensors of one length, the number of edges, or
            :class:`~sparse_accumulation.Index` objects; an operand without index has one row per edge, or
            one), and the output's first dimension has ``size_out`` rows, each the sum of the edges that
            ``indices_out`` sends there (one row per edge without it). Nothing per edge is materialised. The
            other leading dimensions (channels) broadcast as above; the kernels implementations only.

    Returns:
        Contiguous ``[*broadcast leading shape, rule.output_size]`` tensor of X1's dtype and device (with
        indices: ``[size_out or edges, *channel shape, rule.output_size]``); differentiable with respect to X1,
        X2, W and C to any order (gradients of broadcast operands are summed over what they broadcast). 16-bit
        inputs are accumulated in float32.

    Raises:
        TypeError: ``rule`` is not a Rule, non-tensor or non-floating data, dtypes differ.
        ValueError: sizes do not fit the rule, leading dimensions do not broadcast, devices differ, W given for
            a rule without weights or missing for a weighted one, unknown implementation.
        RuntimeError: the requested implementation is not available for the device.
    """
    if not isinstance(rule, Rule):
        raise TypeError(f"rule must be a sparse_accumulation.Rule, got {type(rule).__name__}")
    named = (("X1", X1), ("X2", X2), ("C", C)) + (() if W is None else (("W", W),))
    _check_data(named)
    if rule.weighted != (W is not None):
        raise ValueError("W is required for a weighted rule (one made with w=...)" if rule.weighted
                         else "W was given but the rule has no weight indices (make it with w=...)")
    _check_operand_dims([(n, t) for n, t in named if n != "C"], "last")
    M1, M2 = rule.input_sizes
    for name, t, size in (("X1", X1, M1), ("X2", X2, M2), ("W", W, rule.weight_size)):
        if t is not None and t.shape[-1] != size:
            raise ValueError(f"{name} must end with a dimension of size {size} for this rule, "
                             f"got shape {tuple(t.shape)}")
    _check_coefficients(C, rule.nnz)
    if any(i is not None for i in (indices_1, indices_2, indices_w, indices_out, size_out, reduction)):
        return _accumulate_graph(X1, X2, W, C, rule, implementation, (indices_1, indices_2, indices_w, indices_out),
                                 size_out, reduction)
    return _run(X1, X2, W, C, rule, implementation)


def _accumulate_graph(X1, X2, W, C, rule, implementation, indices, size_out, reduction):
    """:func:`accumulate_rule` with row indices: operands ``[rows, *channels, M]`` as the 2-D operands of a
    channel rule whose channels are the broadcast channel shape (an operand of all-one channel dimensions is
    shared by every channel)."""
    from ..graph.api import accumulate_graph

    operands = (X1, X2) if W is None else (X1, X2, W)
    for name, t in zip(("X1", "X2", "W"), operands):
        if t.dim() < 2:
            raise ValueError(f"with indices, {name} needs a row dimension first: [rows, ..., M], got shape "
                             f"{tuple(t.shape)}")
    try:
        channel_shape = torch.broadcast_shapes(*(t.shape[1:-1] for t in operands))
    except RuntimeError:
        described = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(("X1", "X2", "W"), operands))
        raise ValueError(f"the channel dimensions (between the first and the last) of {described} do not "
                         "broadcast") from None
    channels = math.prod(channel_shape)
    if channels == 0:
        raise ValueError(f"with indices, the channel dimensions {tuple(channel_shape)} must not be empty")

    def rows(t):
        shared = math.prod(t.shape[1:-1]) == 1
        if not shared and tuple(t.shape[1:-1]) != tuple(channel_shape):
            t = t.expand(t.shape[0], *channel_shape, t.shape[-1])
        width = t.shape[-1] * (1 if shared else channels)
        return t.reshape(t.shape[0], width), 1 if shared else channels

    flat = [rows(t) for t in operands]
    crule = _regular_key(rule.key, channels, tuple(f[1] for f in flat) + (1,) * (3 - len(flat)) + (channels,))
    out = accumulate_graph(crule, flat[0][0], flat[1][0], C, flat[2][0] if W is not None else None,
                           indices_1=indices[0], indices_2=indices[1], indices_w=indices[2], indices_out=indices[3],
                           size_out=size_out, implementation=implementation, reduction=reduction)
    return out.view(out.shape[0], *channel_shape, rule.output_size)


@torch.compiler.assume_constant_result
def _regular_key(rule_key: str, channels: int, operand_channels: tuple) -> str:
    """The key of the channel rule of contiguous ``[rows, B_i, M]`` operands (a constant while compiling)."""
    from ...descriptors.channel_rules import ChannelRule

    return ChannelRule.regular(Rule.from_key(rule_key), channels, operand_channels).key


def _run(X1, X2, W, C, rule, implementation):
    name = backends.resolved(implementation, X1.device)
    if name in backends.REFERENCES:
        return _reference(name, X1, X2, W, C, rule).contiguous()
    if eager_applies(X1, X2, W, C):
        return eager.accumulate(X1, X2, W, C, rule, backends.kernel_module("accumulate", name))
    # the op resolves the requested name where it runs: an exported graph then holds "auto", not a kernel
    return registered.accumulate(X1, X2, W, C, rule.key, _requested(implementation))


def _requested(implementation) -> str:
    return backends.get_default_implementation() if implementation is None else implementation


def _validate_indexed(X1, X2, mu, output_size, m1, m2, C, active: str) -> None:
    """Raise ``TypeError``/``ValueError`` for inputs of the wrong kind, shape, dtype or device."""
    _check_data((("X1", X1), ("X2", X2), ("C", C)))
    for name, t in (("m1", m1), ("m2", m2), ("mu", mu)):
        check_index_tensor(name, t)
        if t.device != X1.device:
            raise ValueError(f"{name} is on {t.device} but X1 is on {X1.device}; all tensors must be on one device")
    if isinstance(output_size, bool) or not isinstance(output_size, (int, torch.SymInt)):
        raise TypeError(f"output_size must be an int, got {type(output_size).__name__}")
    if output_size < 0:
        raise ValueError(f"output_size must be non-negative, got {output_size}")
    _check_operand_dims((("X1", X1), ("X2", X2)), active)
    nnz = m1.shape[0]
    if m2.shape[0] != nnz or mu.shape[0] != nnz:
        raise ValueError(f"m1, m2 and mu must have the same length, got {nnz}, {m2.shape[0]} and {mu.shape[0]}")
    _check_coefficients(C, nnz)


@torch.compiler.assume_constant_result
def _traced_rule(m1, m2, mu, M1: int, M2: int, output_size: int):
    """``(key, [m1, m2, mu])`` of the rule of index tensors while ``torch.compile`` traces (run on the tensors'
    values, its result a constant of the graph), or None where the values are not known then."""
    if any(type(t) is not torch.Tensor for t in (m1, m2, mu)):
        return None
    rule = prepare_rule(m1, m2, mu, M1, M2, output_size)
    return rule.key, [list(rule.m1), list(rule.m2), list(rule.mu)]


def _accumulate_indexed(X1, X2, mu, output_size, m1, m2, C, implementation):
    """The tensor API on ``[..., M]`` operands (active dimension last)."""
    name = backends.resolved(implementation, X1.device)
    if name in backends.REFERENCES or eager_applies(X1, X2, C, m1, m2, mu):
        rule = prepare_rule(m1, m2, mu, X1.shape[-1], X2.shape[-1], output_size)
        return _run(X1, X2, None, C, rule, name)
    traced = _traced_rule(m1, m2, mu, X1.shape[-1], X2.shape[-1], output_size) if torch.compiler.is_compiling() \
        else None
    if traced is None:
        return registered.accumulate_indexed(X1, X2, C, m1, m2, mu, output_size, _requested(implementation))
    # the rule is a constant of the compiled graph, as with a Rule; the graph checks on the device (no
    # synchronisation) that the index tensors still hold the values it was traced with
    key, arrays = traced
    expected = torch.tensor(arrays, dtype=torch.int64, device=X1.device)
    held = torch.stack([m1.to(torch.int64), m2.to(torch.int64), mu.to(torch.int64)])
    torch._assert_async((held == expected).all(), "sparse_accumulation.accumulate: the index tensors m1, m2, mu "
                        "changed since the compiled graph was traced (it holds their rule): recompile, or pass a Rule")
    return registered.accumulate(X1, X2, None, C, key, _requested(implementation))


def accumulate(X1, X2, mu, output_size, m1, m2, C, *, implementation=None):
    """Sparse accumulation with the active dimension last: ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]``.

    Args:
        X1: ``[..., M1]`` floating tensor (float16, bfloat16, float32 or float64).
        X2: ``[..., M2]``, same dtype and device as X1; the leading dimensions broadcast with X1's, as in torch
            (equal shapes, any number of dimensions including none and zero rows; a shared operand is read in
            place).
        mu: output index of each nonzero, 1-D integer tensor (any integer dtype, any order, duplicates allowed).
        output_size: size of the output's last dimension.
        m1, m2: indices into X1 and X2, 1-D integer tensors of the same length as ``mu``.
        C: coefficients, 1-D, same length and dtype as the indices / X1.
        implementation: ``None`` (the process default, normally ``"auto"``), ``"auto"``, a kernel
            (``"numba"``, ``"triton"``, ``"torch"``) or a reference (``"loops"``, ``"index_add"``,
            ``"dense"``, ``"sparse"``); see :mod:`sparse_accumulation.backends`.

    Returns:
        Contiguous ``[*broadcast leading shape, output_size]`` tensor of X1's dtype and device. 16-bit inputs
        are accumulated in float32. Differentiable with respect to X1, X2 and C, to any order.

    The index values are read on the host the first time a set of index tensors is used (a synchronisation
    for CUDA tensors), then found again by the tensors' identity and version (never for inference tensors,
    read on every call); a :class:`~sparse_accumulation.Rule` with :func:`accumulate_rule` never reads
    them on a call. Under ``torch.compile`` they are read when the graph is traced, which then holds their
    rule as a constant and checks on the device that they still hold those values (an error if not).

    Raises:
        TypeError: non-tensor or non-floating data, non-integer indices, dtypes of X1, X2 and C differ.
        ValueError: shapes do not fit or broadcast, tensors on different devices, unknown implementation.
        IndexError: an index is negative or out of range (``mu >= output_size`` included).
        RuntimeError: the requested implementation is not available for the device; compiled, index tensors
            that no longer hold the values the graph was traced with.
    """
    _validate_indexed(X1, X2, mu, output_size, m1, m2, C, "last")
    return _accumulate_indexed(X1, X2, mu, output_size, m1, m2, C, implementation)


def accumulate_active_dim_first(X1, X2, mu, output_size, m1, m2, C, *, implementation=None):
    """:func:`accumulate` with the active dimension first: X1 ``[M1, ...]``, X2 ``[M2, ...]`` -> ``[output_size, ...]``.

    The inputs are read in place (a strided view); the output is returned contiguous. Same arguments,
    dtypes and errors as :func:`accumulate`.
    """
    _validate_indexed(X1, X2, mu, output_size, m1, m2, C, "first")
    out = _accumulate_indexed(X1.movedim(0, -1), X2.movedim(0, -1), mu, output_size, m1, m2, C, implementation)
    return out.movedim(-1, 0).contiguous()


def accumulate_active_dim_middle(X1, X2, mu, output_size, m1, m2, C, *, implementation=None):
    """:func:`accumulate` with the active dimension second: X1 ``[A, M1, ...]``, X2 ``[A, M2, ...]`` -> ``[A, output_size, ...]``.

    The inputs are read in place where that is a view; the output is contiguous. Same arguments, dtypes and
    errors as :func:`accumulate`.
    """
    _validate_indexed(X1, X2, mu, output_size, m1, m2, C, "middle")
    if X1.dim() < 2 or X2.dim() < 2:
        raise ValueError(f"X1 and X2 need at least two dimensions for the middle layout, "
                         f"got shapes {tuple(X1.shape)} and {tuple(X2.shape)}")
    out = _accumulate_indexed(X1.movedim(1, -1), X2.movedim(1, -1), mu, output_size, m1, m2, C, implementation)
    return out.movedim(-1, 1).contiguous()
