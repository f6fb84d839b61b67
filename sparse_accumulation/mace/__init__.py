"""MACE on this library's kernels: its symmetric contraction (product basis) as sparse polynomials, and whole models.

:class:`SymmetricContraction` is a drop-in for ``mace.modules.symmetric_contraction.SymmetricContraction``
(mace-torch 0.3.16): the same constructor, call and parameters; :meth:`SymmetricContraction.from_mace` takes a
MACE module with its weights. :func:`accelerate` converts a MACE model in place (its convolutions to fused
message passing, :class:`Convolution`, its symmetric contractions, its skip connections to one matrix product per
element, :class:`ElementLinear`, its radial embedding to :class:`RadialEmbedding` and its messages' reshape to
:class:`ReshapeIrreps`). :class:`CapturedModel` replays a model's molecular-dynamics calls from CUDA
graphs; :class:`Calculator` (``sparse_accumulation.mace.calculator``, imported on first use: it needs ASE) is an
ASE calculator that builds MACE's batch once and then moves it. mace-torch is never imported here.
"""
from .accelerate import INTERACTION_BLOCKS, Convolution, accelerate
from .captured import CapturedModel
from .element_linear import ElementLinear
from .radial import RadialEmbedding
from .reshape import ReshapeIrreps
from .symmetric_contraction import SymmetricContraction

__all__ = ["SymmetricContraction", "accelerate", "Convolution", "ElementLinear", "RadialEmbedding", "ReshapeIrreps",
           "INTERACTION_BLOCKS", "CapturedModel", "Calculator"]


def __getattr__(name: str):
    if name == "Calculator":  # ASE is imported with it
        from .calculator import Calculator

        return Calculator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
