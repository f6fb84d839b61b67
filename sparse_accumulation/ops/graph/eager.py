"""The eager path of the graph ops: the same kernels and gradients as the registered ops, without the
dispatcher (its argument handling costs hundreds of microseconds per call of these many-argument ops)."""
from __future__ import annotations

import torch

from ... import backends
from ..dispatch import saves_only
from . import derivatives, registered


class _EagerAccumulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges, implementation,
                reduction):
        ctx.set_materialize_grads(False)
        derivatives.save(ctx, (X1, X2, W, T), C, indices, offsets, orders)
        ctx.args = (crule, list(outputs), list(rows), edges, implementation, reduction)
        if saves_only():
            return tuple(t.fill_(float("nan")) for t in registered.fake_outputs([X1, X2, W, T], C, crule, outputs,
                                                                                    rows))
        kernels = backends.kernel_module("graph", implementation)
        return tuple(registered.run(kernels, [X1, X2, W, T], C, indices, offsets, orders, crule, outputs, rows,
                                    edges, reduction, False))

    @staticmethod
    def backward(ctx, *grads):
        return derivatives.accumulate_gradients(ctx, grads, _eager_accumulate, _EagerSums.apply) + (None,) * 9


def _run_kernels(kernels, tensors, C, indices, offsets, orders, crule, outputs, rows, edges, reduction):
    return registered.run(kernels, tensors, C, indices, offsets, orders, crule, outputs, rows, edges, reduction,
                          False)


def _eager_accumulate(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges, implementation,
                      reduction):
    """The differentiable eager call; where a graph will record it (gradients on), its gradients' kernels start
    compiling first (:func:`.derivatives.prefetch_gradients`)."""
    if torch.is_grad_enabled():
        derivatives.prefetch_gradients((X1, X2, W, T), C, indices, offsets, orders,
                                       (crule, outputs, rows, edges, implementation, reduction),
                                       backends.kernel_module("graph", implementation), _run_kernels)
    return _EagerAccumulate.apply(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges,
                                  implementation, reduction)


class _EagerSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X1, X2, W, T, indices, crule, edges, implementation):
        derivatives.save(ctx, (X1, X2, W, T), None, indices, [None] * 4, [None] * 4)
        ctx.args = (crule, edges, implementation)
        return registered.coefficient_sums(X1, X2, W, T, indices, crule, edges)

    @staticmethod
    def backward(ctx, grad):
        return (*derivatives.sum_gradients(ctx, grad, _eager_accumulate),) + (None,) * 4


def accumulate(X1, X2, W, T, C, indices, offsets, orders, crule: str, outputs, rows, edges: int,
               implementation: str, reduction: str) -> list:
    """The outputs of :func:`~.registered.graph_accumulate` through the eager path, for a resolved
    ``implementation``."""
    return list(_eager_accumulate(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges,
                                  implementation, reduction))
