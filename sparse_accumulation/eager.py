"""The eager fast path: the same kernels and derivatives as the registered ops, without the dispatcher.

Going through ``torch.ops.sparse_accumulation`` costs several Python layers per call (argument filling, the
custom-op autograd wrapper, redispatch, the compile-disable guard), which dominates small calls and, on the
GPU, a forward+backward step (see docs/implementations). In plain eager mode the public API calls these
``torch.autograd.Function`` s instead; they run the kernel modules directly and differentiate through
:mod:`.derivatives`, so every order of derivative still runs on the kernels. Under ``torch.compile``, tensor
subclasses, dispatch modes or ``torch.func`` transforms (:func:`applies` is False), the registered ops are used,
since only they have fake implementations and dispatcher registrations.
"""
from __future__ import annotations

import torch

from . import derivatives


def applies(*tensors) -> bool:
    """Whether the call may skip the dispatcher: plain tensors, no compile, mode or functorch transform."""
    if torch.compiler.is_compiling():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active():
        return False
    return all(type(t) is torch.Tensor for t in tensors)


def accumulate(X1, X2, C, rule, kernels):
    """Differentiable ``kernels.accumulate(X1, X2, C, rule, rule.output_size)`` on 2-D inputs."""
    return _Accumulate.apply(X1, X2, C, rule, kernels)


class _Accumulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X1, X2, C, rule, kernels):
        ctx.save_for_backward(X1, X2, C)
        ctx.rule, ctx.kernels = rule, kernels
        return kernels.accumulate(X1, X2, C, rule, rule.output_size)

    @staticmethod
    def backward(ctx, G):
        X1, X2, C = ctx.saved_tensors
        grads = _AccumulateBackward.apply(G, X1, X2, C, ctx.rule, ctx.kernels, *ctx.needs_input_grad[:3])
        return (*grads, None, None)


class _AccumulateBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, G, X1, X2, C, rule, kernels, want_x1, want_x2, want_c):
        ctx.save_for_backward(G, X1, X2, C)
        ctx.rule, ctx.kernels, ctx.wanted = rule, kernels, (want_x1, want_x2, want_c)
        return kernels.accumulate_backward(G, X1, X2, C, rule, want_x1, want_x2, want_c)

    @staticmethod
    def backward(ctx, gg1, gg2, ggC):
        G, X1, X2, C = ctx.saved_tensors
        rule, kernels = ctx.rule, ctx.kernels
        upstream = tuple(g if wanted else None for g, wanted in zip((gg1, gg2, ggC), ctx.wanted))
        rules = {None: rule, "X1": rule.swapped("X1"), "X2": rule.swapped("X2")}

        def acc(a, b, c, role):
            return _Accumulate.apply(a, b, c, rules[role], kernels)

        def coefficient_gradient(a, b):
            return _AccumulateBackward.apply(G, a, b, C, rule, kernels, False, False, True)[2]

        grads = derivatives.backward_of_backward(G, X1, X2, C, upstream, ctx.needs_input_grad[:4], acc,
                                                 coefficient_gradient)
        return grads + (None,) * 5
