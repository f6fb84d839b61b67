"""The eager fast path: the same kernels and derivatives as the registered ops, without the dispatcher.

Going through ``torch.ops.sparse_accumulation`` costs several Python layers per call (argument filling, the
custom-op autograd wrapper, redispatch, the compile-disable guard), which dominates small calls and, on the
GPU, a forward+backward step (see docs/implementations). In plain eager mode the public API calls these
``torch.autograd.Function`` s instead; they run the kernel modules directly and differentiate through
:mod:`.derivatives`, so every order of derivative still runs on the kernels. Under ``torch.compile``, tensor
subclasses, dispatch modes or ``torch.func`` transforms (:func:`applies` is False), the registered ops are used,
since only they have fake implementations and dispatcher registrations (``torch.func`` transforms are
not supported by either path: torch's custom-op autograd raises under them).
"""
from __future__ import annotations

import math

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
    """Differentiable sparse accumulation of ``[..., M1]`` and ``[..., M2]`` inputs with equal leading
    dimensions; returns ``[..., rule.output_size]``. Reshaping happens inside, so autograd records one node;
    without anything to differentiate the kernel is called directly."""
    if torch.is_grad_enabled() and (X1.requires_grad or X2.requires_grad or C.requires_grad):
        return _Accumulate.apply(X1, X2, C, rule, kernels)
    return _forward(X1, X2, C, rule, kernels)


def _forward(X1, X2, C, rule, kernels):
    out = kernels.accumulate(_flat(X1), _flat(X2), C, rule, rule.output_size)
    return out if X1.dim() == 2 else out.reshape(*X1.shape[:-1], rule.output_size)


def _flat(t):
    """``[..., M]`` -> ``[rows, M]`` (a view where possible)."""
    return t if t.dim() == 2 else t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


class _Accumulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X1, X2, C, rule, kernels):
        ctx.save_for_backward(X1, X2, C)
        ctx.rule, ctx.kernels = rule, kernels
        return _forward(X1, X2, C, rule, kernels)

    @staticmethod
    def backward(ctx, G):
        X1, X2, C = ctx.saved_tensors
        wanted = ctx.needs_input_grad[:3]
        args = (_flat(G), _flat(X1), _flat(X2), C, ctx.rule, ctx.kernels)
        if torch.is_grad_enabled():  # create_graph: the gradients must be differentiable themselves
            d1, d2, dC = _AccumulateBackward.apply(*args, *wanted)
        else:
            d1, d2, dC = ctx.kernels.accumulate_backward(*args[:5], *wanted)
        return (None if d1 is None else d1.reshape(X1.shape), None if d2 is None else d2.reshape(X2.shape), dC,
                None, None)


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
