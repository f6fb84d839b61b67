"""The eager path of the interaction sums: the kernels and gradient formulas of the registered ops
(:mod:`.ops`) without the dispatcher.

A call through ``torch.ops.sparse_accumulation`` pays the custom op's argument handling, its autograd wrapper
and a redispatch, several times a kernel launch at hippynn's small sizes. In plain eager mode
(:func:`sparse_accumulation.eager.applies`) the public functions call :func:`run` instead: the kernel module
directly, inside one ``torch.autograd.Function`` whose backward computes :data:`.ops.GRADIENTS` through this
path again, so every order of derivative runs on the kernels. Under ``torch.compile``, tensor subclasses,
dispatch modes or ``torch.func`` transforms the registered ops are used.
"""
from __future__ import annotations

import torch

from . import ops


def run(name: str, a, b, pair_first, pair_second, kernels):
    """Sum ``name`` ("envsum", "sensesum" or "featsum") of data ``a``, ``b`` on ``kernels`` (a kernel module),
    differentiable where an input requires its gradient."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _Sum.apply(name, a, b, pair_first, pair_second, kernels)
    return getattr(kernels, name)(a, b, pair_first, pair_second)


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, a, b, pair_first, pair_second, kernels):
        ctx.save_for_backward(a, b, pair_first, pair_second)
        ctx.name, ctx.kernels = name, kernels
        return getattr(kernels, name)(a, b, pair_first, pair_second)

    @staticmethod
    def backward(ctx, grad):
        def call(op, x, y, pair_first, pair_second):
            return run(op, x, y, pair_first, pair_second, ctx.kernels)

        grads = ops.gradients(ctx.name, ctx.saved_tensors, ctx.needs_input_grad[1:], grad, call)
        return (None,) + grads + (None, None, None)
