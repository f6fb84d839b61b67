"""The registered op ``torch.ops.sparse_accumulation.polynomial`` and its eager twin: outputs of a
:class:`~sparse_accumulation.polynomials.Program`, differentiable to any order.

``polynomial(tensors, elements, order, starts, program, outputs, implementation) -> [outputs]`` computes the
outputs ``outputs`` of the program of key ``program`` from its operands ``tensors`` (2-D, lane or element
rows) for nodes whose elements are ``elements`` (``order`` and ``starts`` as made by
:class:`~sparse_accumulation.elements.Elements`). Its gradient with respect to any operands is the program's
:meth:`~sparse_accumulation.polynomials.Program.derivative` evaluated by the same op, so every order runs on
the kernels. The eager path (plain tensors, no compile or transform) runs the same kernels and derivatives
through a ``torch.autograd.Function``, without the dispatcher's per-call argument handling.
"""
from __future__ import annotations

import importlib
from typing import List

import torch
from torch import Tensor

from . import backends, eager
from .elements import Elements
from .polynomials import Program

_NAMESPACE = "sparse_accumulation"
_KERNELS = {
    "numba": "sparse_accumulation.kernels.numba_polynomial",
    "triton": "sparse_accumulation.kernels.triton_polynomial",
    "torch": "sparse_accumulation.kernels.polynomial",
}


def polynomial_kernels(implementation: str, device=None):
    """The polynomial kernel module of a kernel implementation name ("numba", "triton" or "torch"), or, with
    ``device``, of the implementation a name resolves to there (the plain torch kernels for any other)."""
    if device is not None:
        implementation = backends.resolved(implementation, device)
    return importlib.import_module(_KERNELS.get(implementation, _KERNELS["torch"]))


def _run(program: str, tensors, elements: Elements, outputs, implementation: str) -> list:
    kernels = polynomial_kernels(implementation, tensors[0].device if tensors else elements.device)
    return list(kernels.run(Program.from_key(program), list(tensors), elements, tuple(outputs)))


def _fake(program: str, tensors, elements: Tensor, outputs) -> list:
    found = Program.from_key(program)
    like = tensors[0]
    rows = {"lane": elements.shape[0]}
    for slot, t in zip(found.operands, tensors):
        if slot.kind == "element":
            rows["element"] = t.shape[0]
    return [like.new_empty((rows[found.outputs[j].kind], found.outputs[j].width)) for j in outputs]


@torch.library.custom_op(f"{_NAMESPACE}::polynomial", mutates_args=())
def polynomial(tensors: List[Tensor], elements: Tensor, order: Tensor, starts: Tensor, program: str,
               outputs: List[int], implementation: str) -> List[Tensor]:
    """Outputs ``outputs`` of the program of key ``program``; see the module docstring."""
    return _run(program, tensors, Elements.from_tensors(elements, order, starts), outputs, implementation)


@polynomial.register_fake
def _(tensors, elements, order, starts, program, outputs, implementation):
    return _fake(program, tensors, elements, outputs)


def _derivative(program: str, outputs, wanted, grads):
    """``(derivative program key, its cotangent tensors, the operands it differentiates)``, or None when no
    gradient flows."""
    found = Program.from_key(program)
    wrt = tuple(s for s, w in enumerate(wanted) if w)
    present = [False] * len(found.outputs)
    cotangents = []
    for j, g in zip(outputs, grads):
        if g is not None:
            present[j] = True
            cotangents.append(g if g.stride(-1) == 1 else g.contiguous())
    if not wrt or not cotangents:
        return None
    selected = found.derivative(wrt, present)
    return selected.key, cotangents, wrt


def _setup(ctx, inputs, output):
    tensors, elements, order, starts, program, outputs, implementation = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(*tensors, elements, order, starts)
    ctx.count = len(tensors)
    ctx.args = (program, list(outputs), implementation)
    ctx.wanted = [t.requires_grad for t in tensors]


def _backward(ctx, grads):
    saved = ctx.saved_tensors
    tensors, (elements, order, starts) = list(saved[:ctx.count]), saved[ctx.count:]
    program, outputs, implementation = ctx.args
    result = [None] * ctx.count
    found = _derivative(program, outputs, ctx.wanted, grads)
    if found is not None:
        key, cotangents, wrt = found
        parts = polynomial(tensors + cotangents, elements, order, starts, key, list(range(len(wrt))),
                           implementation)
        for s, part in zip(wrt, parts):
            result[s] = part
    return result, None, None, None, None, None, None


polynomial.register_autograd(_backward, setup_context=_setup)


class _Eager(torch.autograd.Function):
    @staticmethod
    def forward(ctx, program, outputs, implementation, elements, *tensors):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*tensors)
        ctx.args = (program, tuple(outputs), implementation, elements)
        return tuple(_run(program, tensors, elements, outputs, implementation))

    @staticmethod
    def backward(ctx, *grads):
        tensors = list(ctx.saved_tensors)
        program, outputs, implementation, elements = ctx.args
        result = [None] * len(tensors)
        found = _derivative(program, outputs, ctx.needs_input_grad[4:], grads)
        if found is not None:
            key, cotangents, wrt = found
            parts = _Eager.apply(key, tuple(range(len(wrt))), implementation, elements, *tensors, *cotangents)
            for s, part in zip(wrt, parts):
                result[s] = part
        return (None, None, None, None, *result)


def evaluate(program: Program, tensors, elements: Elements, implementation: str, outputs=None) -> list:
    """Outputs of ``program`` (all, or the indices ``outputs``) for the operands ``tensors`` (2-D tensors of
    one floating dtype and device, unit column stride) and prepared ``elements``: through the eager path
    where it applies (plain tensors, no compile, mode or transform), else through the registered op.
    Differentiable with respect to every operand, to any order."""
    outputs = tuple(range(len(program.outputs))) if outputs is None else tuple(outputs)
    if eager.applies(*tensors):
        return list(_Eager.apply(program.key, outputs, implementation, elements, *tensors))
    return polynomial(list(tensors), elements.tensor, elements.order, elements.starts, program.key, list(outputs),
                      implementation)
