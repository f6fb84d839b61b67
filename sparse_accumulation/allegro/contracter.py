"""Allegro's ``Contracter`` on sparse accumulation: imports Allegro."""
from __future__ import annotations

from allegro.nn._strided._contract import Contracter
from nequip.nn import replace_submodules
from nequip.utils.dtype import torch_default_dtype

from ..descriptors.rules import Rule
from ..ops.accumulate.api import accumulate_rule

__all__ = ["Contracter", "SparseAccumulationContracter", "replace"]


class SparseAccumulationContracter(Contracter):
    """Allegro's ``Contracter`` (same arguments, parameters and buffers) computed as one weighted sparse
    accumulation: the nonzeros ``(p, i, j, k)`` of Allegro's own coefficients ``w3j [paths, I, J, K]`` are the
    rule's ``(w, m1, m2, mu)``, their values its coefficients.

    ``forward(x1 [edges, u * I] or [edges, u, I], x2 [atoms, u * J] or [atoms, u, J], idxs [edges])`` returns
    ``[edges, u, K]``: ``x2`` is gathered by ``idxs`` inside the kernels, the weights ``[u, paths]`` (or
    ``[paths]`` without path-channel coupling) are one row shared by every edge.
    """

    #: what NequIP's AOTInductor packages import before loading (the ops are registered by importing it)
    _nequip_custom_ops_libs = ("sparse_accumulation",)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        if self.w3j_is_ij_diagonal:
            raise ValueError("the diagonal contraction (the last layer's) is left to Allegro's own Contracter")
        w3j = self.w3j if self.num_paths > 1 else self.w3j.unsqueeze(0)
        nonzeros = w3j.nonzero()
        p, i, j, k = nonzeros.unbind(1)
        self.rule = Rule(i.tolist(), j.tolist(), k.tolist(), self.base_dim_out,
                         input_sizes=(self.base_dim1, self.base_dim2), w=p.tolist(), weight_size=self.num_paths)
        self.register_buffer("coefficients", w3j[tuple(nonzeros.t())].contiguous(), persistent=False)

    def forward(self, x1, x2, idxs):
        # [rows, u, dim] made afresh from [rows, u * dim]: NequIP's symbolic tracing may hand a channel size it
        # cannot simplify (nor a reshape(-1, u, dim) or a reshape to the same sizes replace); rows may be none
        x1 = x1.flatten(1).unflatten(1, (self.mul, self.base_dim1))
        x2 = x2.flatten(1).unflatten(1, (self.mul, self.base_dim2))
        weights = self.weights.reshape(1, self.mul if self.path_channel_coupling else 1, self.num_paths)
        return accumulate_rule(x1, x2, self.rule, self.coefficients.to(x1.dtype), weights.to(x1.dtype),
                               indices_2=idxs)


def replace(model, cls):
    """Every non-diagonal module of class ``cls`` (Allegro's ``Contracter`` or a subclass) in ``model`` replaced by a
    :class:`SparseAccumulationContracter` with its arguments and state, on its device; returns ``model``."""
    def factory(old):
        if isinstance(old, SparseAccumulationContracter) or old.w3j_is_ij_diagonal:
            return old
        with torch_default_dtype(old.w3j.dtype):
            new = SparseAccumulationContracter(
                irreps_in1=old.irreps_in1, irreps_in2=old.irreps_in2, irreps_out=old.irreps_out, mul=old.mul,
                instructions=old.instructions, path_channel_coupling=old.path_channel_coupling,
                scatter_factor=old.scatter_factor, irrep_normalization=old.irrep_normalization)
        new.load_state_dict(old.state_dict())
        return new.to(old.w3j.device)

    return replace_submodules(model, cls, factory)
