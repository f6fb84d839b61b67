"""The registered op family ``torch.ops.sparse_accumulation`` with fake implementations and autograd.

Ops work on 2-D ``[rows, components]`` tensors of any strides; the public API reshapes to and from them.

* ``accumulate(X1, X2, C, m1, m2, mu, output_size, implementation) -> out``
* ``accumulate_backward(G, X1, X2, C, m1, m2, mu, implementation, want_x1, want_x2, want_c)
  -> (dX1, dX2, dC)``; an output that is not wanted is an empty tensor.

The op is closed under differentiation (gradients are sparse accumulations with roles of the indices
swapped), so each backward is written with these two ops only and is itself differentiable: double
backward, and any higher order, comes from the same kernels (:mod:`.derivatives`). In eager mode the public
API skips the dispatcher and calls the same kernels through :mod:`.eager`. Index values are checked inside
the ops (through the cached :func:`~sparse_accumulation.rules.prepare_rule`), where ``torch.compile`` does
not trace.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import backends, derivatives
from .rules import prepare_rule

_NAMESPACE = "sparse_accumulation"


@torch.library.custom_op(f"{_NAMESPACE}::accumulate", mutates_args=())
def accumulate(X1: Tensor, X2: Tensor, C: Tensor, m1: Tensor, m2: Tensor, mu: Tensor, output_size: int,
               implementation: str) -> Tensor:
    """``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] * C[k]`` on 2-D inputs; ``out`` is ``[rows, output_size]``."""
    rule = prepare_rule(m1, m2, mu, X1.shape[1], X2.shape[1], output_size)
    return backends.kernels(implementation).accumulate(X1, X2, C, rule, output_size)


@accumulate.register_fake
def _(X1, X2, C, m1, m2, mu, output_size, implementation):
    return X1.new_empty((X1.shape[0], output_size))


@torch.library.custom_op(f"{_NAMESPACE}::accumulate_backward", mutates_args=())
def accumulate_backward(G: Tensor, X1: Tensor, X2: Tensor, C: Tensor, m1: Tensor, m2: Tensor, mu: Tensor,
                        implementation: str, want_x1: bool, want_x2: bool, want_c: bool
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`accumulate` for the output gradient ``G``; unwanted ones are empty tensors."""
    rule = prepare_rule(m1, m2, mu, X1.shape[1], X2.shape[1], G.shape[1])
    results = backends.kernels(implementation).accumulate_backward(G, X1, X2, C, rule, want_x1, want_x2, want_c)
    return tuple(X1.new_empty(0) if t is None else t for t in results)


@accumulate_backward.register_fake
def _(G, X1, X2, C, m1, m2, mu, implementation, want_x1, want_x2, want_c):
    return (X1.new_empty(X1.shape if want_x1 else (0,)), X1.new_empty(X2.shape if want_x2 else (0,)),
            X1.new_empty(C.shape if want_c else (0,)))


def _setup_accumulate(ctx, inputs, output):
    X1, X2, C, m1, m2, mu, _, implementation = inputs
    ctx.save_for_backward(X1, X2, C, m1, m2, mu)
    ctx.implementation = implementation


def _accumulate_grad(ctx, grad):
    X1, X2, C, m1, m2, mu = ctx.saved_tensors
    want_x1, want_x2, want_c = ctx.needs_input_grad[:3]
    d1, d2, dC = accumulate_backward(grad, X1, X2, C, m1, m2, mu, ctx.implementation, want_x1, want_x2, want_c)
    return (d1 if want_x1 else None, d2 if want_x2 else None, dC if want_c else None,
            None, None, None, None, None)


accumulate.register_autograd(_accumulate_grad, setup_context=_setup_accumulate)


def _setup_backward(ctx, inputs, output):
    G, X1, X2, C, m1, m2, mu, implementation, want_x1, want_x2, want_c = inputs
    ctx.save_for_backward(G, X1, X2, C, m1, m2, mu)
    ctx.implementation = implementation
    ctx.wanted = (want_x1, want_x2, want_c)


def _accumulate_backward_grad(ctx, gg1, gg2, ggC):
    """Differentiate ``(dX1, dX2, dC)`` again with the same two ops (see :mod:`.derivatives`)."""
    G, X1, X2, C, m1, m2, mu = ctx.saved_tensors
    impl = ctx.implementation
    upstream = tuple(g if wanted else None for g, wanted in zip((gg1, gg2, ggC), ctx.wanted))
    rules = {None: (m1, m2, mu, G.shape[1]), "X1": (mu, m2, m1, X1.shape[1]), "X2": (m1, mu, m2, X2.shape[1])}

    def acc(a, b, c, role):
        i1, i2, out_index, size = rules[role]
        return accumulate(a, b, c, i1, i2, out_index, size, impl)

    def coefficient_gradient(a, b):
        return accumulate_backward(G, a, b, C, m1, m2, mu, impl, False, False, True)[2]

    grads = derivatives.backward_of_backward(G, X1, X2, C, upstream, ctx.needs_input_grad[:4], acc,
                                             coefficient_gradient)
    return grads + (None,) * 7


accumulate_backward.register_autograd(_accumulate_backward_grad, setup_context=_setup_backward)
