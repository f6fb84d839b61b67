"""The eager path of the interaction sums: the kernels and gradient formulas of the registered ops
(:mod:`sparse_accumulation.ops.pair_sums.registered`) without the dispatcher.

A call through ``torch.ops.sparse_accumulation`` pays the custom op's argument handling, its autograd wrapper
and a redispatch, several times a kernel launch at hippynn's small sizes. In plain eager mode
(:func:`sparse_accumulation.ops.dispatch.eager_applies`) the public functions call :func:`run` instead: the
kernels directly, inside one ``torch.autograd.Function`` whose backward computes :data:`.registered.GRADIENTS`
through this
path again, so every order of derivative runs on the kernels. Under ``torch.compile``, tensor subclasses,
dispatch modes or ``torch.func`` transforms the registered ops are used.
"""
from __future__ import annotations

import torch

from . import registered


def run(name: str, a, b, pair_first, pair_second, implementation: str):
    """Sum ``name`` ("envsum", "sensesum" or "featsum") of data ``a``, ``b`` on the kernels of a resolved
    ``implementation``, differentiable where an input requires its gradient."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _Sum.apply(name, a, b, pair_first, pair_second, implementation)
    return registered.run(name, a, b, pair_first, pair_second, implementation)


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, a, b, pair_first, pair_second, implementation):
        ctx.save_for_backward(a, b, pair_first, pair_second)
        ctx.name, ctx.implementation = name, implementation
        return registered.run(name, a, b, pair_first, pair_second, implementation)

    @staticmethod
    def backward(ctx, grad):
        def call(op, x, y, pair_first, pair_second):
            return run(op, x, y, pair_first, pair_second, ctx.implementation)

        grads = registered.gradients(ctx.name, ctx.saved_tensors, ctx.needs_input_grad[1:], grad, call)
        return (None,) + grads + (None, None, None)
