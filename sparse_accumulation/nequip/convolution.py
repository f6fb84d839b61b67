"""NequIP's convolution (``TensorProductScatter``) on fused message passing: imports nequip."""
from __future__ import annotations

import torch
from nequip.nn import replace_submodules
from nequip.nn._tp_scatter_base import TensorProductScatter
from nequip.utils.dtype import torch_default_dtype

from ..e3nn.tensor_product import TensorProduct

__all__ = ["TensorProductScatter", "SparseAccumulationTensorProductScatter", "replace"]


class SparseAccumulationTensorProductScatter(TensorProductScatter):
    """``scatter(tp(x[edge_src], edge_attr, edge_weight), edge_dst)`` in one fused call.

    Made from a ``TensorProductScatter``'s arguments (``feature_irreps_in``, ``irreps_edge_attr``, ``irreps_mid``,
    ``instructions``: "uvu" paths with per-edge weights) in its ``model_dtype``. ``forward(x [nodes, in],
    edge_attr [edges, sh], edge_weight [edges, weight_numel], edge_dst, edge_src)`` returns ``[nodes, mid]``
    (``nodes = x.size(0)``) in the model's dtype, as NequIP's does. The fused product holds no persistent
    state: the state dict is the base class's.
    """

    #: what NequIP's AOTInductor packages import before loading (the ops are registered by importing it)
    _nequip_custom_ops_libs = ("sparse_accumulation",)

    def __init__(self, feature_irreps_in, irreps_edge_attr, irreps_mid, instructions) -> None:
        super().__init__(feature_irreps_in, irreps_edge_attr, irreps_mid, instructions)
        self.tp_conv = TensorProduct(feature_irreps_in, irreps_edge_attr, irreps_mid, instructions,
                                     shared_weights=False, internal_weights=False)
        for name, buffer in list(self.tp_conv.named_buffers(recurse=False)):
            self.tp_conv.register_buffer(name, buffer, persistent=False)

    def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
        dtype = self.model_dtype  # explicit casts, as NequIP's: autocast may hand other dtypes
        return self.tp_conv(x.to(dtype), edge_attr.to(dtype), edge_weight.to(dtype), indices_1=edge_src,
                            indices_out=edge_dst, size_out=x.size(0))


def replace(model, cls):
    """Every module of class ``cls`` (NequIP's ``TensorProductScatter`` or a subclass) in ``model`` replaced by a
    :class:`SparseAccumulationTensorProductScatter` of its arguments, on its device; returns ``model``."""
    def factory(old):
        with torch_default_dtype(old.model_dtype):
            new = SparseAccumulationTensorProductScatter(old.feature_irreps_in, old.irreps_edge_attr,
                                                         old.irreps_mid, old.instructions)
        new.tp = old.tp  # e3nn's product stays for its buffers: the state dict is the same with or without
        device = next(iter(old.tp.buffers()), torch.empty(0)).device
        return new.to(device)

    return replace_submodules(model, cls, factory)
