"""MACE's symmetric contraction (product basis) as sparse polynomials on this library's kernels.

:class:`SymmetricContraction` is a drop-in for ``mace.modules.symmetric_contraction.SymmetricContraction``
(mace-torch 0.3.16): the same constructor, call and parameters; :meth:`SymmetricContraction.from_mace` takes a
MACE module with its weights. mace-torch itself is never imported here.
"""
from .symmetric_contraction import SymmetricContraction

__all__ = ["SymmetricContraction"]
