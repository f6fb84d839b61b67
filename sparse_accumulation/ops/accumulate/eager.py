"""The eager path: the same kernels and derivatives as the registered ops, without the dispatcher.

Going through ``torch.ops.sparse_accumulation`` costs several Python layers per call (argument filling, the
custom-op autograd wrapper, redispatch), which dominates small calls and, on the GPU, a forward+backward step.
In plain eager mode the public API calls these ``torch.autograd.Function`` s instead; they run the kernel
modules directly and differentiate through :mod:`.derivatives`, so every order of derivative still runs on the
kernels. Under ``torch.compile``, tensor subclasses, dispatch modes or ``torch.func`` transforms
(:func:`sparse_accumulation.ops.eager_applies` is False) the registered ops are used, since only they have fake implementations and
dispatcher registrations.

Operands are the caller's ``[..., M]`` tensors, whose leading dimensions broadcast (:mod:`sparse_accumulation.kernels.layout`); the call
records one autograd node.
"""
from __future__ import annotations

import torch

from ...kernels import layout
from ..dispatch import saves_only
from . import derivatives

_NAMES = ("X1", "X2", "W")


def accumulate(X1, X2, W, C, rule, kernels):
    """Differentiable accumulation of ``[..., M]`` operands (``W`` None without weights); returns
    ``[*broadcast leading shape, rule.output_size]``. Without anything to differentiate the kernel is called
    directly."""
    if torch.is_grad_enabled() and (X1.requires_grad or X2.requires_grad or C.requires_grad
                                    or (W is not None and W.requires_grad)):
        _prefetch_backward(X1, X2, W, C, rule, kernels)
        return _Accumulate.apply(X1, X2, W, C, rule, kernels)
    operands, rows = layout.plan((X1, X2) if W is None else (X1, X2, W), _NAMES)
    return kernels.accumulate(operands[0], operands[1], operands[2] if W is not None else None, C, rule, rows)


#: the kinds of call whose backward kernels :func:`_prefetch_backward` started compiling
_prefetched = set()


def _prefetch_backward(X1, X2, W, C, rule, kernels) -> None:
    """On the first call of its kind, start compiling the kernels of the call's backward (where the kernels
    can: ``kernels.prefetching()``), so that they compile in worker processes while the forward goes on. The
    backward is taken inside the kernels' ``compile_only`` context, which launches nothing, with an
    uninitialised stand-in for the output gradient. A kind: the rule, which tensors want gradients, the
    operands' dtype, device and dimensions (kernels that another shape needs compile when it comes)."""
    prefetching = getattr(kernels, "prefetching", None)
    if prefetching is None:
        return
    wanted = (X1.requires_grad, X2.requires_grad, W is not None and W.requires_grad, C.requires_grad)
    kind = (rule.key, wanted, X1.dtype, X1.device, tuple(t.dim() for t in (X1, X2, W) if t is not None))
    if kind in _prefetched:
        return
    _prefetched.add(kind)
    if not prefetching():
        return
    operands, rows = layout.plan((X1, X2) if W is None else (X1, X2, W), _NAMES)
    G = X1.new_empty((*rows.lead, rule.output_size))
    with kernels.compile_only():
        kernels.accumulate_backward(G, operands[0], operands[1], operands[2] if W is not None else None, C, rule,
                                    rows, *wanted)


def _summed_to(grad, shape):
    """``grad`` of an operand that the plan replaced by an expanded copy, summed back to ``shape``."""
    return grad if grad is None or grad.shape == shape else grad.sum_to_size(shape)


class _Accumulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X1, X2, W, C, rule, kernels):
        originals = (X1, X2) if W is None else (X1, X2, W)
        operands, rows = layout.plan(originals, _NAMES)
        ctx.save_for_backward(X1, X2, W, C)
        ctx.rule, ctx.kernels, ctx.rows = rule, kernels, rows
        ctx.copied = any(a is not b for a, b in zip(operands, originals))
        if saves_only():
            return X1.new_full((*rows.lead, rule.output_size), float("nan"))
        return kernels.accumulate(operands[0], operands[1], operands[2] if W is not None else None, C, rule, rows)

    @staticmethod
    def backward(ctx, G):
        X1, X2, W, C = ctx.saved_tensors
        originals = (X1, X2) if W is None else (X1, X2, W)
        operands, rows = (layout.plan(originals, _NAMES) if ctx.copied else (originals, ctx.rows))
        args = (G, operands[0], operands[1], operands[2] if W is not None else None, C, ctx.rule)
        wanted = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():  # create_graph: the gradients must be differentiable themselves
            grads = _AccumulateBackward.apply(*args, ctx.kernels, rows, *wanted)
        else:
            grads = ctx.kernels.accumulate_backward(*args, rows, *wanted)
        d1, d2, dW, dC = grads
        return (_summed_to(d1, X1.shape), _summed_to(d2, X2.shape), _summed_to(dW, None if W is None else W.shape),
                dC, None, None)


class _AccumulateBackward(torch.autograd.Function):
    """``(G, X1, X2, W, C) -> (dX1, dX2, dW, dC)`` for operands already planned into ``rows``."""

    @staticmethod
    def forward(ctx, G, X1, X2, W, C, rule, kernels, rows, want_x1, want_x2, want_w, want_c):
        ctx.save_for_backward(G, X1, X2, W, C)
        ctx.rule, ctx.kernels, ctx.wanted = rule, kernels, (want_x1, want_x2, want_w, want_c)
        return kernels.accumulate_backward(G, X1, X2, W, C, rule, rows, want_x1, want_x2, want_w, want_c)

    @staticmethod
    def backward(ctx, gg1, gg2, ggW, ggC):
        G, X1, X2, W, C = ctx.saved_tensors
        rule, kernels = ctx.rule, ctx.kernels
        xs = (X1, X2) if W is None else (X1, X2, W)
        upstream = tuple(g if wanted else None for g, wanted in zip((gg1, gg2, ggW, ggC), ctx.wanted))
        upstream = upstream[:len(xs)] + upstream[3:]
        needed = ctx.needs_input_grad[:len(xs) + 1] + ctx.needs_input_grad[4:5]

        def acc(operands, c, role):
            target = rule if role is None else rule.swapped(_NAMES[role])
            return _Accumulate.apply(*operands[:2], operands[2] if len(operands) == 3 else None, c, target, kernels)

        def coefficient_gradient(operands):
            weights = operands[2] if len(operands) == 3 else None
            return _AccumulateBackward.apply(G, operands[0], operands[1], weights, C, rule, kernels,
                                             layout.plan(operands, _NAMES)[1], False, False, False, True)[3]

        dG, *dxs, dC = derivatives.backward_of_backward(G, xs, C, upstream, needed, acc, coefficient_gradient)
        dW = dxs[2] if len(dxs) == 3 else None
        return (dG, dxs[0], dxs[1], dW, dC) + (None,) * 7
