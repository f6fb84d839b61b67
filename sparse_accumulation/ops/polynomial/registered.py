"""The registered op ``torch.ops.sparse_accumulation.polynomial``: outputs of a
:class:`~sparse_accumulation.descriptors.programs.Program`, differentiable to any order.

``polynomial(tensors, elements, order, starts, program, outputs, implementation) -> [outputs]`` computes the
outputs ``outputs`` of the program of key ``program`` from its operands ``tensors`` (2-D, lane or element
rows) for nodes whose elements are ``elements`` (``order`` and ``starts`` as made by
:class:`~sparse_accumulation.indices.Elements`). Its gradient with respect to any operands is the program's
:meth:`~sparse_accumulation.descriptors.programs.Program.derivative` evaluated by the same op, so every order
runs on the kernels.
"""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from ... import backends
from ...descriptors.programs import Program
from ...indices import Elements

_NAMESPACE = "sparse_accumulation"


def run(program: str, tensors, elements: Elements, outputs, implementation: str) -> list:
    """Outputs ``outputs`` of the program of key ``program`` on the kernels of ``implementation`` (resolved here:
    a resolved name stays itself)."""
    device = tensors[0].device if tensors else elements.device
    kernels = backends.kernel_module("polynomial", backends.resolved(implementation, device))
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
    return run(program, tensors, Elements.from_tensors(elements, order, starts), outputs, implementation)


@polynomial.register_fake
def _(tensors, elements, order, starts, program, outputs, implementation):
    return _fake(program, tensors, elements, outputs)


def derivative(program: str, outputs, wanted, grads):
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
    found = derivative(program, outputs, ctx.wanted, grads)
    if found is not None:
        key, cotangents, wrt = found
        parts = polynomial(tensors + cotangents, elements, order, starts, key, list(range(len(wrt))),
                           implementation)
        for s, part in zip(wrt, parts):
            result[s] = part
    return result, None, None, None, None, None, None


polynomial.register_autograd(_backward, setup_context=_setup)
