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


def _replaced(tensors, slot, value):
    result = list(tensors)
    result[slot] = value
    return result


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
                result[s] = part if result[s] is None else result[s] + part
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


def no_gradient(values: list):
    """The gradient of a list argument: a list of None where autograd sees its tensors (a list of tensors
    only), else None (a list holding None is one opaque argument)."""
    return [None] * len(values) if all(isinstance(v, Tensor) for v in values) else None
