"""MACE's ``reshape_irreps`` (e3nn's ``[N, sum of mul * d]`` to ``[N, mul, sum of d]``) as one column permutation.

MACE's module slices each irrep's columns, reshapes them and concatenates the pieces: one copy forward, but a
backward of three operations per irrep (the gradient's piece copied to be reshaped, a zero tensor the size of
the whole input, the piece copied into it), each a kernel on a GPU. The same map is a fixed permutation of the
columns: :class:`ReshapeIrreps` gathers them in one ``index_select``, and its gradient is the inverse
permutation, one gather too, at every derivative order.
"""
from __future__ import annotations

import torch

__all__ = ["ReshapeIrreps"]


class _Permuted(torch.autograd.Function):
    """``x.index_select(1, order)``; its gradient is the gather by ``inverse`` (a permutation, so no sum)."""

    @staticmethod
    def forward(ctx, x, order, inverse):
        ctx.save_for_backward(order, inverse)
        return x.index_select(1, order)

    @staticmethod
    def backward(ctx, grad):
        order, inverse = ctx.saved_tensors
        return _Permuted.apply(grad, inverse, order), None, None


class ReshapeIrreps(torch.nn.Module):
    """MACE's ``reshape_irreps(irreps)`` (mace-torch 0.3.16, e3nn's layout): ``[N, irreps.dim]`` ->
    ``[N, mul, sum of the irreps' dimensions]``, every irrep of one multiplicity ``mul``.

    Args:
        irreps: e3nn ``Irreps`` (or what ``e3nn.o3.Irreps`` accepts), every multiplicity the same.

    Raises:
        ValueError: the irreps are empty or of different multiplicities (MACE's module cannot concatenate those
            either).
    """

    def __init__(self, irreps) -> None:
        super().__init__()
        from e3nn import o3

        self.irreps = o3.Irreps(irreps)
        muls = sorted({mul for mul, _ in self.irreps})
        if len(muls) != 1:
            raise ValueError(f"irreps must all have one multiplicity, got {self.irreps}")
        self.mul, self.dim, self.dim_in = muls[0], sum(ir.dim for _, ir in self.irreps), self.irreps.dim
        order = []  # output column (u, i) of irrep block j reads input column start_j + u * d_j + i
        blocks = [(block.start, ir.dim) for block, (_, ir) in zip(self.irreps.slices(), self.irreps)]
        for u in range(self.mul):
            for start, d in blocks:
                order.extend(start + u * d + i for i in range(d))
        order_tensor = torch.tensor(order, dtype=torch.int64)
        self.register_buffer("order", order_tensor, persistent=False)
        self.register_buffer("inverse", torch.argsort(order_tensor), persistent=False)

    @classmethod
    def from_mace(cls, module: torch.nn.Module) -> "ReshapeIrreps":
        """The same map as MACE's ``module`` (a ``mace.modules.irreps_tools.reshape_irreps`` of e3nn's layout).

        Raises:
            TypeError: ``module`` is not MACE's ``reshape_irreps``, or has cuEquivariance's layout.
        """
        from mace.modules.irreps_tools import reshape_irreps

        if type(module) is not reshape_irreps:
            raise TypeError(f"module must be MACE's reshape_irreps, got {type(module).__module__}."
                            f"{type(module).__qualname__}")
        if getattr(module, "cueq_config", None) is not None:
            raise TypeError("module reshapes in cuEquivariance's layout (cueq_config set)")
        return cls(module.irreps)

    def extra_repr(self) -> str:
        return str(self.irreps)

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[N, irreps.dim]`` -> ``[N, mul, dim]`` (a new tensor).

        Raises:
            ValueError: ``tensor`` is not ``[N, irreps.dim]``.
        """
        if tensor.dim() != 2 or tensor.shape[1] != self.dim_in:
            raise ValueError(f"tensor must be [N, {self.dim_in}], got shape {list(tensor.shape)}")
        if torch.jit.is_scripting() or self._traced():
            # (index_select's own gradient, an index_add; compiled graphs differentiate it to any order themselves)
            out = tensor.index_select(1, self.order)
        else:
            out = self._permuted(tensor)
        return out.view(tensor.shape[0], self.mul, self.dim)

    @torch.jit.unused
    def _traced(self):
        return torch.compiler.is_compiling()

    @torch.jit.unused
    def _permuted(self, tensor: torch.Tensor) -> torch.Tensor:
        return _Permuted.apply(tensor, self.order, self.inverse)

