"""MACE's radial embedding (Bessel basis times polynomial cutoff) in a few operations: :class:`RadialEmbedding`.

MACE's ``RadialEmbeddingBlock`` with its default parts (``BesselBasis``, ``PolynomialCutoff``, no distance
transform) computes ``sqrt(2 / r_max) sin(w_n r) / r`` times the envelope ``1 - A u^p + B u^(p+1) - C u^(p+2)``
(``u = r / r_max``, zero from ``r_max`` on) term by term: about 30 elementwise operations forward and 50 backward,
each a pass over the edges and, on a GPU, a kernel launch, which in a small system's step costs more than its
arithmetic. Here the envelope's three powers are one ``pow`` and their sum one matrix product: about 10 operations
forward and 20 backward, every derivative order by torch's autograd (TorchScript and ``torch.compile`` as MACE's).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..exact import ExactBuffers

__all__ = ["RadialEmbedding"]


class RadialEmbedding(ExactBuffers, torch.nn.Module):
    """MACE's ``RadialEmbeddingBlock`` (Bessel basis, polynomial cutoff, no distance transform) with its call
    and outputs: ``(radial * cutoff, None)``, or ``(radial, cutoff)`` where the block does not apply its cutoff.

    It holds MACE's ``bessel_fn`` and ``cutoff_fn`` modules (so their buffers and, where the Bessel weights are
    trained, parameters, and the state dict are MACE's) and reads their tensors at each call; the envelope's
    exponents and coefficients are taken from the cutoff's ``p`` when made.
    """

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        refusal = self.refusal(block)
        if refusal is not None:
            raise TypeError(f"RadialEmbedding: {refusal}")
        self.bessel_fn, self.cutoff_fn = block.bessel_fn, block.cutoff_fn
        self.out_dim = block.out_dim
        self.apply_cutoff: bool = bool(getattr(block, "apply_cutoff", True))
        p = int(block.cutoff_fn.p.item())
        like = block.cutoff_fn.r_max
        self.register_exact("exponents", [p, p + 1, p + 2], like.dtype, like.device)
        self.register_exact("one", [1.0], like.dtype, like.device)  # the envelope's constant term
        self.register_exact("coefficients", [[-(p + 1.0) * (p + 2.0) / 2.0], [p * (p + 2.0)], [-p * (p + 1.0) / 2.0]],
                            like.dtype, like.device)

    @staticmethod
    def refusal(block) -> Optional[str]:
        """Why ``block`` cannot be converted (None where it can): it must be MACE's ``RadialEmbeddingBlock``
        itself with a ``BesselBasis``, a ``PolynomialCutoff`` and no distance transform."""
        from mace.modules import blocks, radial

        if type(block) is not blocks.RadialEmbeddingBlock:
            return f"a MACE RadialEmbeddingBlock expected, got {type(block).__module__}.{type(block).__qualname__}"
        if type(getattr(block, "bessel_fn", None)) is not radial.BesselBasis:
            return f"radial basis {type(getattr(block, 'bessel_fn', None)).__name__} (BesselBasis expected)"
        if type(getattr(block, "cutoff_fn", None)) is not radial.PolynomialCutoff:
            return f"cutoff {type(getattr(block, 'cutoff_fn', None)).__name__} (PolynomialCutoff expected)"
        if hasattr(block, "distance_transform"):
            return f"distance transform {type(block.distance_transform).__name__}"
        return None

    def forward(self, edge_lengths: torch.Tensor, node_attrs: torch.Tensor, edge_index: torch.Tensor,
                atomic_numbers: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``edge_lengths [edges, 1]`` -> ``([edges, num_basis], None)`` (the cutoff applied) or ``(radial,
        cutoff [edges, 1])``, as MACE's block (``node_attrs``, ``edge_index`` and ``atomic_numbers`` are unused,
        as there without a distance transform)."""
        r_max = self.cutoff_fn.r_max
        u = edge_lengths / r_max
        envelope = torch.addmm(self.one.to(u.dtype), u.pow(self.exponents.to(u.dtype)), self.coefficients.to(u.dtype))
        cutoff = envelope * (edge_lengths < r_max)
        radial = torch.sin(self.bessel_fn.bessel_weights * edge_lengths) * (self.bessel_fn.prefactor / edge_lengths)
        if not self.apply_cutoff:
            return radial, cutoff
        return radial * cutoff, None
