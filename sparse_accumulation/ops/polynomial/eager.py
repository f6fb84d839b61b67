"""The eager path of the polynomial op: the same kernels and derivatives through a ``torch.autograd.Function``,
without the dispatcher's per-call argument handling (plain tensors, no compile or transform)."""
from __future__ import annotations

import torch

from . import registered


class Evaluate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, program, outputs, implementation, elements, *tensors):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors)
        ctx.args = (program, tuple(outputs), implementation, elements)
        return tuple(registered.run(program, tensors, elements, outputs, implementation))

    @staticmethod
    def backward(ctx, *grads):
        tensors = list(ctx.saved_tensors)
        program, outputs, implementation, elements = ctx.args
        result = [None] * len(tensors)
        found = registered.derivative(program, outputs, ctx.needs_input_grad[4:], grads)
        if found is not None:
            key, cotangents, wrt = found
            parts = Evaluate.apply(key, tuple(range(len(wrt))), implementation, elements, *tensors, *cotangents)
            for s, part in zip(wrt, parts):
                result[s] = part
        return (None, None, None, None, *result)
