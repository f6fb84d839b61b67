"""Element-weighted polynomials, the public function: :func:`evaluate` a
:class:`~sparse_accumulation.descriptors.programs.Program` on operands and prepared elements."""
from __future__ import annotations

from ...descriptors.programs import Program
from ...indices import Elements
from ..dispatch import eager_applies
from . import eager, registered


def evaluate(program: Program, tensors, elements: Elements, implementation: str, outputs=None) -> list:
    """Outputs of ``program`` (all, or the indices ``outputs``) for the operands ``tensors`` (2-D tensors of
    one floating dtype and device, unit column stride) and prepared ``elements``: through the eager path
    where it applies (plain tensors, no compile, mode or transform), else through the registered op.
    Differentiable with respect to every operand, to any order."""
    outputs = tuple(range(len(program.outputs))) if outputs is None else tuple(outputs)
    if eager_applies(*tensors):
        return list(eager.Evaluate.apply(program.key, outputs, implementation, elements, *tensors))
    return registered.polynomial(list(tensors), elements.tensor, elements.order, elements.starts, program.key,
                                 list(outputs), implementation)
