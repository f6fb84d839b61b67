"""MACE's skip connections as one linear map per element: :class:`ElementLinear`.

An interaction block's ``skip_tp`` is e3nn's ``FullyConnectedTensorProduct`` of the node features ``x`` with the
node attributes ``y`` (one scalar per element, one-hot rows)::

    out[n, w, k] = sum_{u, v} c * W[u, v, w] * x[n, u, k] * y[n, v]       (per instruction, k a component)

e3nn computes it for every element ``v`` of every node (at 89 elements, 89 times the work of the node's own
element). With one-hot rows only the node's element counts: ``out[n] = c * x[n] @ W[:, e(n), :]``. The nodes are
visited in tiles of one element (:meth:`sparse_accumulation.indices.Elements.tiles`), each tile's rows gathered
and multiplied by its element's matrix in one batched matrix product, and the products put back in node order:
static shapes, no synchronisation, differentiable to any order through torch's own operations. Rows with one
nonzero of another value scale the output; any other rows (or attributes that require grad) take e3nn's sum over
every element.
"""
from typing import List, Optional, Tuple

import torch

from .attributes import prepare

__all__ = ["ElementLinear"]

#: the fewest and most nodes per tile (:func:`tile_rows`)
TILE_ROWS = (8, 32)


def tile_rows(nodes: int, elements: int) -> int:
    """Nodes per tile: about the mean count of an element's nodes (a power of two within :data:`TILE_ROWS`). Each
    tile multiplies ``[rows * components, u]`` by its element's ``[u, w]``, and the tiles hold ``ceil(N / rows) +
    E`` tiles' rows, padding included: larger tiles pad more, smaller ones read more weights (on the 2-core
    development machine at 89 elements: 8 rows fastest at 10^3 nodes, 32 and 64 alike at 10^4)."""
    fewest, most = TILE_ROWS
    mean = max(1, nodes // max(1, elements))
    return max(fewest, min(most, 1 << (mean.bit_length() - 1)))


class ElementLinear(torch.nn.Module):
    """e3nn's ``FullyConnectedTensorProduct(irreps_in1, "Ex0e", irreps_out)`` with shared internal weights (MACE's
    skip connections), computed per element.

    Made from the e3nn module, whose ``weight`` parameter it holds (the same tensor) with its ``output_mask``:
    the state dict is the e3nn module's, key for key.

    Args:
        tensor_product: e3nn's ``o3.FullyConnectedTensorProduct`` whose second input is one irrep of scalars
            (``Ex0e`` or ``Ex0o``, ``E`` elements), with internal, shared weights.

    Raises:
        ImportError: e3nn is not installed.
        TypeError: ``tensor_product`` is not e3nn's ``FullyConnectedTensorProduct``.
        ValueError: a second input other than one irrep of scalars, or weights that are not internal and shared.
    """

    __e3nn_compile_mode__ = "script"  # e3nn.util.jit.compile (MACE's scripting) scripts it, as e3nn's own
    # what TorchScript reads (typed here: an empty list would not be)
    _paths: List[Tuple[int, int, int, int, int, int, float]]
    _outputs: List[Tuple[int, int]]

    def __init__(self, tensor_product: torch.nn.Module):
        super().__init__()
        from e3nn import o3

        problem = self.refusal(tensor_product)
        if problem is not None:
            raise (TypeError if problem.startswith("not") else ValueError)(problem)

        tp = tensor_product
        self.irreps_in1, self.irreps_in2, self.irreps_out = tp.irreps_in1, tp.irreps_in2, tp.irreps_out
        self.num_elements = tp.irreps_in2[0].mul
        self._dim_in = tp.irreps_in1.dim  # a plain int: forward reads no Irreps (torch.compile cannot guard them)
        self.weight = tp.weight
        self.register_buffer("output_mask", tp.output_mask.detach().clone())
        starts = [piece.start for piece in tp.irreps_in1.slices()]
        paths, offset = [], 0
        for ins in tp.instructions:
            mul_in, ir_in = tp.irreps_in1[ins.i_in1]
            mul_out, _ = tp.irreps_out[ins.i_out]
            size = mul_in * self.num_elements * mul_out
            if ir_in.dim and mul_in and mul_out:
                l = ir_in.l
                coupling = float(o3.wigner_3j(l, 0, l, dtype=torch.float64)[0, 0, 0])  # the identity, scaled
                paths.append((starts[ins.i_in1], mul_in, ir_in.dim, ins.i_out, mul_out, offset,
                              ins.path_weight * coupling))
            offset += size
        self._paths = paths
        self._outputs = [(mul, ir.dim) for mul, ir in tp.irreps_out]

    @staticmethod
    def refusal(tensor_product) -> Optional[str]:
        """Why ``tensor_product`` cannot be made into an :class:`ElementLinear` (None: it can)."""
        try:
            from e3nn import o3
        except ImportError:
            return "not convertible: e3nn is not installed"
        if type(tensor_product) is not o3.FullyConnectedTensorProduct:
            return (f"not e3nn's o3.FullyConnectedTensorProduct: {type(tensor_product).__module__}."
                    f"{type(tensor_product).__qualname__}")
        if len(tensor_product.irreps_in2) != 1 or tensor_product.irreps_in2[0].ir.l != 0:
            return f"the second input must be one irrep of scalars (node attributes), got {tensor_product.irreps_in2}"
        if not (tensor_product.internal_weights and tensor_product.shared_weights):
            return "the weights must be internal and shared (MACE's skip connections)"
        return None

    def extra_repr(self) -> str:
        return f"{self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out}"

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``tensor_product(x, y)``.

        Args:
            x: node features ``[N, irreps_in1.dim]``.
            y: node attributes ``[N, E]`` of a floating dtype (one-hot rows, or any values), or integer
                elements ``[N]``.

        Returns:
            ``[N, irreps_out.dim]`` of ``x``'s dtype.

        Raises:
            ValueError: ``x`` not ``[N, irreps_in1.dim]`` or ``y`` of another node count; errors of
                :func:`sparse_accumulation.mace.attributes.prepare` for ``y``.
        """
        if x.dim() != 2 or x.shape[1] != self._dim_in:
            raise ValueError(f"x must be [nodes, {self._dim_in}], got shape {list(x.shape)}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have x's {x.shape[0]} nodes, got shape {list(y.shape)}")
        if torch.jit.is_scripting():  # e3nn's sum over every element (what MACE's scripted model computes)
            per_node = torch.nn.functional.one_hot(y, self.num_elements) if y.dim() == 1 else y
            return self._assembled(x, self._every_element(x, per_node.to(x.dtype)))
        attributes = prepare(y, self.num_elements, "y")
        if attributes.per_node is not None:
            out = self._assembled(x, self._every_element(x, attributes.per_node.to(x.dtype)))
        else:
            out = self._assembled(x, self._per_element(x, attributes.elements))
        return out if attributes.scale is None else out * attributes.scale.to(x.dtype)

    def _assembled(self, x: torch.Tensor, parts: List[Tuple[int, torch.Tensor]]) -> torch.Tensor:
        """``[N, irreps_out.dim]``: the instructions' parts summed per output irrep, in order."""
        blocks: List[Optional[torch.Tensor]] = [None for _ in self._outputs]
        for i_out, part in parts:
            block = blocks[i_out]
            blocks[i_out] = part if block is None else block + part
        out: List[torch.Tensor] = []
        for block, (mul, dim) in zip(blocks, self._outputs):
            out.append(block if block is not None else x.new_zeros(x.shape[0], mul * dim))  # no instruction writes it
        return torch.cat(out, dim=1) if len(out) > 0 else x.new_zeros(x.shape[0], 0)

    def _weights(self, offset: int, mul_in: int, mul_out: int) -> torch.Tensor:
        return self.weight.narrow(0, offset, mul_in * self.num_elements * mul_out).view(
            mul_in, self.num_elements, mul_out)

    def _every_element(self, x: torch.Tensor, y: torch.Tensor) -> List[Tuple[int, torch.Tensor]]:
        """``(output index, [N, mul_out * dim])`` per instruction: e3nn's sum over every element (rows that are
        not one-hot)."""
        N = x.shape[0]
        parts: List[Tuple[int, torch.Tensor]] = []
        for start, mul_in, dim, i_out, mul_out, offset, factor in self._paths:
            features = x[:, start:start + mul_in * dim].view(N, mul_in, dim)
            part = torch.einsum("nuk,nv,uvw->nwk", features, y, self._weights(offset, mul_in, mul_out))
            parts.append((i_out, (factor * part).reshape(N, mul_out * dim)))
        return parts

    @torch.jit.unused
    def _per_element(self, x, elements) -> list:
        """``(output index, [N, mul_out * dim])`` per instruction: each node's own element only, tile by tile (see
        the module docstring)."""
        N = x.shape[0]
        if N == 0:
            return []
        rows = tile_rows(N, self.num_elements)
        table, _ = elements.tiles(rows)
        tiles = table.shape[1]
        node, slot = elements.tile_slots(rows)  # (made once per elements, shared by every layer that uses them)
        parts = []
        # index_select, not advanced indexing: its gradient is an index_add, where indexing's is an index_put with
        # accumulation, which sorts the indices first (on CUDA two sorts and a slow scatter per call)
        for start, mul_in, dim, i_out, mul_out, offset, factor in self._paths:
            features = x[:, start:start + mul_in * dim].view(N, mul_in, dim).transpose(1, 2).index_select(0, node)
            weights = self._weights(offset, mul_in, mul_out).index_select(1, table[0]).transpose(0, 1)
            product = torch.bmm(features.reshape(tiles, rows * dim, mul_in), weights)  # [tiles, rows * dim, w]
            parts.append((i_out, (factor * product).view(tiles * rows, dim, mul_out).index_select(0, slot)
                          .transpose(1, 2).reshape(N, mul_out * dim)))
        return parts
