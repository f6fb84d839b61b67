"""The registered ops of the sparse accumulation (``torch.ops.sparse_accumulation``): fake implementations,
autograd, compile and export.

Ops take the caller's operands ``[..., M]``, whose leading dimensions broadcast (see
:mod:`sparse_accumulation.kernels.layout`).

Rule ops, used with a :class:`~sparse_accumulation.descriptors.rules.Rule` (``rule`` is its :attr:`~.Rule.key`, a constant
string, so tracing never reads an index):

* ``accumulate(X1, X2, W, C, rule, implementation) -> out`` (``W`` optional);
* ``accumulate_backward(G, X1, X2, W, C, rule, implementation, want_x1, want_x2, want_w, want_c)
  -> (dX1, dX2, dW, dC)``, an output that is not wanted is an empty tensor.

Both are ``torch.library.triton_op`` s: with the Triton implementation on CUDA, ``torch.compile`` traces into
them and sees the kernel launches (which it can then CUDA-graph and AOTInductor can package); with any other
implementation they call the opaque kernel ops ``kernel_accumulate`` / ``kernel_accumulate_backward``.
``torch.export`` keeps them as single nodes that carry the rule's key. ``implementation`` may be ``"auto"``,
resolved where the op runs.

Indexed ops, used by the tensor API (``accumulate(X1, X2, mu, output_size, m1, m2, C)``) where the index
tensors are data: ``accumulate_indexed`` and ``accumulate_indexed_backward``, opaque, which find the rule from
the index tensors when they run (:func:`~sparse_accumulation.indices.prepare_rule`: one read of the index values
per set of index tensors).

The op family is closed under differentiation (gradients are accumulations with the roles of the indices
swapped), so every backward is written with these ops and is itself differentiable (:mod:`.derivatives`).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import backends
from ...descriptors.rules import Rule
from ...indices import prepare_rule
from ...kernels import layout
from . import derivatives

_NAMESPACE = "sparse_accumulation"
_ROLES = ("X1", "X2", "W")


def _operands(X1, X2, W) -> tuple:
    return (X1, X2) if W is None else (X1, X2, W)


def _lead(X1, X2, W) -> tuple:
    return layout.broadcast_shape(_ROLES, _operands(X1, X2, W))


def _empty_unless(wanted: bool, like: Optional[Tensor], reference: Tensor) -> Tensor:
    return reference.new_empty(like.shape if wanted else (0,))


def _kernels(implementation: str, device):
    """The kernel module of an implementation name (one the rule op resolved stays itself: a dictionary
    lookup; graphs compiled or exported earlier may name ``"auto"``)."""
    return backends.kernel_module("accumulate", backends.resolved(implementation, device))


def _forward(kernels, X1, X2, W, C, rule):
    """``kernels.accumulate`` on planned operands."""
    operands, rows = layout.plan(_operands(X1, X2, W), _ROLES)
    return kernels.accumulate(operands[0], operands[1], operands[2] if W is not None else None, C, rule, rows)


def _backward(kernels, G, X1, X2, W, C, rule, *wanted):
    """``kernels.accumulate_backward`` on planned operands; gradients of the caller's shapes (summed back where
    the plan expanded an operand), empty tensors where not wanted."""
    originals = _operands(X1, X2, W)
    operands, rows = layout.plan(originals, _ROLES)
    results = kernels.accumulate_backward(G, operands[0], operands[1], operands[2] if W is not None else None, C,
                                          rule, rows, *wanted)
    shapes = [t.shape for t in originals] + [None] * (3 - len(originals)) + [C.shape]
    return tuple(X1.new_empty(0) if t is None else t if t.shape == shape else t.sum_to_size(shape)
                 for t, shape in zip(results, shapes))


# ----------------------------------------------------------------------------------------------------------
# opaque kernel ops (any implementation but Triton-on-CUDA inside the rule ops)


# Defined with the low-level registration API: a call costs a few microseconds of dispatch instead of the
# twenty-odd of ``torch.library.custom_op``'s Python layers, and these ops need no autograd of their own (the rule
# ops that call them have it).
_library = torch.library.Library(_NAMESPACE, "FRAGMENT")
_library.define("kernel_accumulate(Tensor X1, Tensor X2, Tensor? W, Tensor C, str rule, str implementation) -> Tensor")
_library.define("kernel_accumulate_backward(Tensor G, Tensor X1, Tensor X2, Tensor? W, Tensor C, str rule, "
                "str implementation, bool want_x1, bool want_x2, bool want_w, bool want_c) "
                "-> (Tensor, Tensor, Tensor, Tensor)")


def _kernel_accumulate(X1, X2, W, C, rule, implementation):
    """``out[..., mu[k]] += X1[m1[k]] * X2[m2[k]] * W[w[k]] * C[k]`` with the kernels of ``implementation``."""
    return _forward(_kernels(implementation, X1.device), X1, X2, W, C, Rule.from_key(rule))


def _kernel_accumulate_backward(G, X1, X2, W, C, rule, implementation, want_x1, want_x2, want_w, want_c):
    """Gradients of ``kernel_accumulate``; unwanted ones are empty tensors."""
    return _backward(_kernels(implementation, X1.device), G, X1, X2, W, C, Rule.from_key(rule), want_x1, want_x2,
                     want_w and W is not None, want_c)


_library.impl("kernel_accumulate", _kernel_accumulate, "CompositeExplicitAutograd")
_library.impl("kernel_accumulate_backward", _kernel_accumulate_backward, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{_NAMESPACE}::kernel_accumulate", lib=_library)
def _(X1, X2, W, C, rule, implementation):
    return X1.new_empty((*_lead(X1, X2, W), Rule.from_key(rule).output_size))


@torch.library.register_fake(f"{_NAMESPACE}::kernel_accumulate_backward", lib=_library)
def _(G, X1, X2, W, C, rule, implementation, want_x1, want_x2, want_w, want_c):
    return (_empty_unless(want_x1, X1, X1), _empty_unless(want_x2, X2, X1),
            _empty_unless(want_w and W is not None, W, X1), _empty_unless(want_c, C, X1))


kernel_accumulate = torch.ops.sparse_accumulation.kernel_accumulate.default
kernel_accumulate_backward = torch.ops.sparse_accumulation.kernel_accumulate_backward.default


# ----------------------------------------------------------------------------------------------------------
# rule ops


class _TritonTraced:
    """The Triton kernels launched through ``torch.library.wrap_triton``, so a tracing compiler sees them."""

    @staticmethod
    def accumulate(*args):
        return backends.kernel_module("accumulate", "triton").accumulate(*args, traceable=True)

    @staticmethod
    def accumulate_backward(*args):
        return backends.kernel_module("accumulate", "triton").accumulate_backward(*args, traceable=True)


@torch.library.triton_op(f"{_NAMESPACE}::accumulate", mutates_args=())
def accumulate(X1: Tensor, X2: Tensor, W: Optional[Tensor], C: Tensor, rule: str, implementation: str) -> Tensor:
    """Sparse accumulation of broadcasting operands under the rule of key ``rule``; ``implementation`` as the
    caller asked (``"auto"`` stays so in an exported graph), resolved here, once."""
    name = backends.resolved(implementation, X1.device)
    if name == "triton" and X1.device.type == "cuda":
        return _forward(_TritonTraced, X1, X2, W, C, Rule.from_key(rule))
    return kernel_accumulate(X1, X2, W, C, rule, name)


@torch.library.triton_op(f"{_NAMESPACE}::accumulate_backward", mutates_args=())
def accumulate_backward(G: Tensor, X1: Tensor, X2: Tensor, W: Optional[Tensor], C: Tensor, rule: str,
                        implementation: str, want_x1: bool, want_x2: bool, want_w: bool, want_c: bool
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`accumulate` for the output gradient ``G``; unwanted ones are empty tensors."""
    want_w = want_w and W is not None
    name = backends.resolved(implementation, X1.device)
    if name == "triton" and X1.device.type == "cuda":
        return _backward(_TritonTraced, G, X1, X2, W, C, Rule.from_key(rule), want_x1, want_x2, want_w, want_c)
    return kernel_accumulate_backward(G, X1, X2, W, C, rule, name, want_x1, want_x2, want_w, want_c)


def _setup_accumulate(ctx, inputs, output):
    X1, X2, W, C, rule, implementation = inputs
    ctx.save_for_backward(X1, X2, W, C)
    ctx.rule, ctx.implementation = rule, implementation


def _accumulate_grad(ctx, grad):
    X1, X2, W, C = ctx.saved_tensors
    wanted = ctx.needs_input_grad[:4]
    grads = accumulate_backward(grad, X1, X2, W, C, ctx.rule, ctx.implementation, *wanted)
    return tuple(g if w else None for g, w in zip(grads, wanted)) + (None, None)


accumulate.register_autograd(_accumulate_grad, setup_context=_setup_accumulate)


def _setup_backward(ctx, inputs, output):
    G, X1, X2, W, C, rule, implementation, *wanted = inputs
    ctx.save_for_backward(G, X1, X2, W, C)
    ctx.rule, ctx.implementation, ctx.wanted = rule, implementation, tuple(wanted)


def _accumulate_backward_grad(ctx, gg1, gg2, ggW, ggC):
    """Differentiate ``(dX1, dX2, dW, dC)`` again with the same ops (see :mod:`.derivatives`)."""
    G, X1, X2, W, C = ctx.saved_tensors
    rule, impl = Rule.from_key(ctx.rule), ctx.implementation
    xs = (X1, X2) if W is None else (X1, X2, W)
    upstream = tuple(g if wanted else None for g, wanted in zip((gg1, gg2, ggW, ggC), ctx.wanted))
    upstream = upstream[:len(xs)] + upstream[3:]
    needed = ctx.needs_input_grad[:len(xs) + 1] + ctx.needs_input_grad[4:5]

    def acc(operands, c, role):
        key = rule.key if role is None else rule.swapped(_ROLES[role]).key
        return accumulate(operands[0], operands[1], operands[2] if len(operands) == 3 else None, c, key, impl)

    def coefficient_gradient(operands):
        weights = operands[2] if len(operands) == 3 else None
        return accumulate_backward(G, operands[0], operands[1], weights, C, rule.key, impl,
                                   False, False, False, True)[3]

    dG, *dxs, dC = derivatives.backward_of_backward(G, xs, C, upstream, needed, acc, coefficient_gradient)
    return (dG, dxs[0], dxs[1], dxs[2] if len(dxs) == 3 else None, dC) + (None,) * 6


accumulate_backward.register_autograd(_accumulate_backward_grad, setup_context=_setup_backward)


# ----------------------------------------------------------------------------------------------------------
# indexed ops (the tensor API under torch.compile, dispatch modes and subclasses)


def _indexed_rule(m1, m2, mu, X1, X2, output_size) -> Rule:
    return prepare_rule(m1, m2, mu, X1.shape[-1], X2.shape[-1], output_size)


@torch.library.custom_op(f"{_NAMESPACE}::accumulate_indexed", mutates_args=())
def accumulate_indexed(X1: Tensor, X2: Tensor, C: Tensor, m1: Tensor, m2: Tensor, mu: Tensor, output_size: int,
                       implementation: str) -> Tensor:
    """:func:`accumulate` with the rule given by index tensors, checked and converted when the op runs."""
    rule = _indexed_rule(m1, m2, mu, X1, X2, output_size)
    return _forward(_kernels(implementation, X1.device), X1, X2, None, C, rule)


@accumulate_indexed.register_fake
def _(X1, X2, C, m1, m2, mu, output_size, implementation):
    return X1.new_empty((*_lead(X1, X2, None), output_size))


@torch.library.custom_op(f"{_NAMESPACE}::accumulate_indexed_backward", mutates_args=())
def accumulate_indexed_backward(G: Tensor, X1: Tensor, X2: Tensor, C: Tensor, m1: Tensor, m2: Tensor, mu: Tensor,
                                implementation: str, want_x1: bool, want_x2: bool, want_c: bool
                                ) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`accumulate_indexed`; unwanted ones are empty tensors."""
    rule = _indexed_rule(m1, m2, mu, X1, X2, G.shape[-1])
    d1, d2, _, dC = _backward(_kernels(implementation, X1.device), G, X1, X2, None, C, rule, want_x1, want_x2,
                              False, want_c)
    return d1, d2, dC


@accumulate_indexed_backward.register_fake
def _(G, X1, X2, C, m1, m2, mu, implementation, want_x1, want_x2, want_c):
    return _empty_unless(want_x1, X1, X1), _empty_unless(want_x2, X2, X1), _empty_unless(want_c, C, X1)


def _setup_indexed(ctx, inputs, output):
    X1, X2, C, m1, m2, mu, _, implementation = inputs
    ctx.save_for_backward(X1, X2, C, m1, m2, mu)
    ctx.implementation = implementation


def _indexed_grad(ctx, grad):
    X1, X2, C, m1, m2, mu = ctx.saved_tensors
    wanted = ctx.needs_input_grad[:3]
    grads = accumulate_indexed_backward(grad, X1, X2, C, m1, m2, mu, ctx.implementation, *wanted)
    return tuple(g if w else None for g, w in zip(grads, wanted)) + (None,) * 5


accumulate_indexed.register_autograd(_indexed_grad, setup_context=_setup_indexed)


def _setup_indexed_backward(ctx, inputs, output):
    G, X1, X2, C, m1, m2, mu, implementation, *wanted = inputs
    ctx.save_for_backward(G, X1, X2, C, m1, m2, mu)
    ctx.implementation, ctx.wanted = implementation, tuple(wanted)


def _indexed_backward_grad(ctx, gg1, gg2, ggC):
    G, X1, X2, C, m1, m2, mu = ctx.saved_tensors
    impl = ctx.implementation
    upstream = tuple(g if wanted else None for g, wanted in zip((gg1, gg2, ggC), ctx.wanted))
    # the rule with slot `role` and the output swapped, and the size of what it writes
    swapped = {None: (m1, m2, mu, G.shape[-1]), 0: (mu, m2, m1, X1.shape[-1]), 1: (m1, mu, m2, X2.shape[-1])}

    def acc(operands, c, role):
        i1, i2, out, size = swapped[role]
        return accumulate_indexed(operands[0], operands[1], c, i1, i2, out, size, impl)

    def coefficient_gradient(operands):
        return accumulate_indexed_backward(G, operands[0], operands[1], C, m1, m2, mu, impl, False, False, True)[2]

    grads = derivatives.backward_of_backward(G, (X1, X2), C, upstream, ctx.needs_input_grad[:4], acc,
                                             coefficient_gradient)
    return grads + (None,) * 7


accumulate_indexed_backward.register_autograd(_indexed_backward_grad, setup_context=_setup_indexed_backward)
