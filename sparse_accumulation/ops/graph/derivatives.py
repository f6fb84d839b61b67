"""The gradients of the graph ops, written once for the registered ops and the eager path.

The ops are closed under differentiation: the gradient of output ``j`` with respect to the tensor of slot ``s``
is the accumulation with the output gradient in slot ``j`` and output slot ``s``; with respect to C, the
coefficient sums with the gradient in slot ``j``; the gradient of the coefficient sums is the accumulation
with its output gradient as coefficients. Each function takes the differentiable ops to call, so every order
of derivative runs on the kernels, through whichever path called it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...descriptors.channel_rules import ChannelRule
from ...kernels import SEGMENT


def save(ctx, tensors, C, indices, offsets, orders):
    """Save the tensor arguments (lists with holes) for the backward, and which of them want gradients."""
    groups = (list(tensors), [C], list(indices), list(offsets), list(orders))
    flat = [t for group in groups for t in group]
    ctx.present = [t is not None for t in flat]
    ctx.lengths = [len(g) for g in groups]
    ctx.save_for_backward(*[t for t in flat if t is not None])
    ctx.wanted = [t is not None and t.requires_grad for t in tensors]
    ctx.c_wanted = C is not None and C.requires_grad


def restore(ctx):
    """``(tensors, C, indices, offsets, orders)`` as :func:`save` saved them."""
    saved = iter(ctx.saved_tensors)
    flat = [next(saved) if present else None for present in ctx.present]
    groups, start = [], 0
    for n in ctx.lengths:
        groups.append(flat[start:start + n])
        start += n
    tensors, (C,), indices, offsets, orders = groups
    return tensors, C, indices, offsets, orders


def list_gradients(ctx) -> tuple:
    """The gradients of the list arguments :func:`save` kept (indices, offsets, orders): per list, a list of None
    where autograd sees its tensors (a list of tensors only), else None (a list holding None is one opaque
    argument). Read from what :func:`save` recorded, not from the saved tensors: inside a checkpoint a backward
    may unpack those only once."""
    result, start = [], ctx.lengths[0] + ctx.lengths[1]
    for n in ctx.lengths[2:]:
        result.append([None] * n if all(ctx.present[start:start + n]) else None)
        start += n
    return tuple(result)


def _replaced(tensors, slot, value):
    result = list(tensors)
    result[slot] = value
    return result


def _added(total: Tensor, part: Tensor) -> Tensor:
    """``total + part``, summed into ``total`` (a new output of the kernels) where no graph records the sum: a
    per-edge gradient of the weights is as large as the radial network's output ([edges, 1280] in MACE's
    first interaction), and the sum would be a third such tensor alive at once."""
    return total + part if torch.is_grad_enabled() else total.add_(part)


def accumulate_gradients(ctx, grads, accumulate, sums):
    """``(dX1, dX2, dW, dT, dC)`` of an accumulation: the gradient of output ``j`` reaches the tensor of slot
    ``s`` as the accumulation with that gradient in slot ``j`` and output slot ``s``, and C as the coefficient
    sums with it in slot ``j``; ``accumulate`` and ``sums`` are the (differentiable) ops to call."""
    tensors, C, indices, offsets, orders = restore(ctx)
    crule, outputs, rows, edges, implementation, reduction = ctx.args
    result = [None] * 4
    dC = None
    for j, g in zip(outputs, grads):
        if g is None:
            continue
        inputs, rule_j = _replaced(tensors, j, g), crule
        if j == 2 and ChannelRule.from_key(crule).has_constant_weights:
            # g holds the gradient of W, in which the constant columns of W read as zeros, not ones
            inputs[2] = torch.nn.functional.pad(g, (0, 1))
            rule_j = ChannelRule.from_key(crule).with_zero_constants().key
        targets = [s for s in range(4) if ctx.wanted[s] and s != j]
        if targets:
            parts = accumulate(*inputs, C, indices, offsets, orders, rule_j, targets, rows, edges, implementation,
                               reduction)
            for s, part in zip(targets, parts):
                result[s] = part if result[s] is None else _added(result[s], part)
        if ctx.c_wanted:
            part = sums(*inputs, indices, rule_j, edges, implementation)
            dC = part if dC is None else dC + part
    return (*result, dC)


def sum_gradients(ctx, grad, accumulate):
    """The gradients of the four tensors of the coefficient sums: the accumulation with ``grad`` as the
    coefficients, into every slot that wants one."""
    tensors, _, indices, offsets, orders = restore(ctx)
    crule, edges, implementation = ctx.args
    targets = [s for s in range(4) if ctx.wanted[s]]
    result = [None] * 4
    if targets:
        rows = [t.shape[0] if t is not None else 0 for t in tensors]
        data_rule = ChannelRule.from_key(crule).with_data_coefficients().key  # the coefficients are `grad` here
        parts = accumulate(*tensors, grad, indices, offsets, orders, data_rule, targets, rows, edges,
                           implementation, SEGMENT)
        for s, part in zip(targets, parts):
            result[s] = part
    return result


#: the kinds of call whose gradient kernels :func:`prefetch_gradients` started compiling
_prefetched = set()


class _Saved:
    """What :func:`save` keeps, readable at once (a function's own context gives its saved tensors back only
    in its backward)."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def prefetch_gradients(tensors, C, indices, offsets, orders, args, kernels, run) -> None:
    """Before the first forward of its kind, start compiling the kernels of the call's gradients and of their
    gradients (a force-training step differentiates twice), so that they compile in worker processes while the
    model's forward goes on, rather than one after another as its backward meets them.

    The gradients are taken as :func:`accumulate_gradients` takes them, with stand-ins for the output gradients,
    inside the kernels' ``compile_only`` context, where ``run(kernels, tensors, C, indices, offsets, orders,
    crule, outputs, rows, edges, reduction)`` launches nothing. The second derivatives are taken as if the
    first derivative's inputs that are output gradients wanted gradients (as in a step that trains on forces).
    A kind is what decides the kernels: the rule, outputs, implementation, reduction, which tensors want
    gradients, which index arrays are given, the dtype and device. Nothing happens where the kernels cannot
    prefetch (``kernels.prefetching`` absent or false: the CPU, compiles in threads)."""
    prefetching = getattr(kernels, "prefetching", None)
    if prefetching is None:
        return
    wanted = [t is not None and t.requires_grad for t in tensors]
    if not (C.requires_grad or any(wanted)):
        return
    kind = _kind(C, indices, offsets, orders, args, wanted, C.requires_grad)
    if kind in _prefetched:
        return
    if not prefetching():
        _prefetched.add(kind)  # asked once per kind and process
        return
    with kernels.compile_only():
        _prefetch(list(tensors), C, indices, offsets, orders, args, wanted, C.requires_grad,
                  lambda *call: run(kernels, *call), depth=2)


def _kind(C, indices, offsets, orders, args, wanted, c_wanted) -> tuple:
    crule, outputs, rows, edges, implementation, reduction = args
    return (crule, tuple(outputs), implementation, reduction, c_wanted, C.dtype, C.device, tuple(wanted),
            tuple(v is not None for group in (indices, offsets, orders) for v in group))


def _stand_in(like: Tensor, rows: int, width: int) -> Tensor:
    """A ``[rows, width]`` tensor that holds nothing: one uninitialised row, repeated (a launch that only
    compiles reads no value)."""
    return like.new_empty((1, width)).expand(rows, width)


def _prefetch(tensors, C, indices, offsets, orders, args, wanted, c_wanted, run, depth: int) -> None:
    crule, outputs, rows, edges, implementation, reduction = args
    kind = _kind(C, indices, offsets, orders, args, wanted, c_wanted)
    if kind in _prefetched:
        return
    _prefetched.add(kind)
    saved = _Saved()
    save(saved, tensors, C, indices, offsets, orders)
    saved.wanted, saved.c_wanted, saved.args = list(wanted), c_wanted, args
    like = next(t for t in tensors if t is not None)
    maps = ChannelRule.from_key(crule).maps
    grads = [_stand_in(like, rows[s], maps[s].width) for s in outputs]

    def accumulate(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges, implementation,
                   reduction):
        inputs = [X1, X2, W, T]
        run(inputs, C, indices, offsets, orders, crule, outputs, rows, edges, reduction)
        if depth > 1:
            given = [t is not None and (wanted[s] or any(t is g for g in grads)) for s, t in enumerate(inputs)]
            _prefetch(inputs, C, indices, offsets, orders, (crule, outputs, rows, edges, implementation, reduction),
                      given, c_wanted, run, depth - 1)
        return [C.new_zeros(()) for _ in outputs]  # nothing was computed; scalars that add up

    accumulate_gradients(saved, grads, accumulate, lambda *call: None)
