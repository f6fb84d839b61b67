"""Nodes' elements, prepared once per element tensor: sorted, and cut into tiles of one element each.

Kernels of :mod:`sparse_accumulation.polynomials` visit the nodes in the order of their elements, in tiles that
each hold nodes of one element only: a tile reads its element's weights once, and sums an element output over
its rows without atomics. :class:`Elements` holds the element of every node, the permutation that sorts them
and where each element's nodes start; :meth:`Elements.tiles` cuts them into tiles of a given number of rows.
Everything is made with device operations of static shapes (no synchronisation, no graph break under
``torch.compile``); only the optional check reads values. :func:`prepare` also reads node attributes (MACE's
``y``) once in eager mode, to choose how a module gathers their weights (:class:`Attributes`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import remembered
from .rules import check_index_tensor


class Elements:
    """The elements of ``N`` nodes, sorted once.

    Args:
        elements: 1-D integer tensor ``[N]``: the element of every node (any integer dtype, any device).
        num_elements: number of elements ``E`` (``0 <= elements < E``).
        check: read the values (one synchronisation on CUDA) to check their range (default True).

    Attributes:
        tensor: the elements as a contiguous int64 tensor; ``order``: the nodes sorted by element (stable);
        ``starts``: ``[E + 1]`` offsets in ``order`` of each element's nodes; ``num_elements``.

    Raises:
        TypeError: ``elements`` is not an integer tensor.
        ValueError: ``elements`` is not 1-D, ``num_elements`` is not a positive int.
        IndexError: an element out of ``[0, num_elements)`` (with ``check``).
    """

    def __init__(self, elements: torch.Tensor, num_elements: int, *, check: bool = True):
        check_index_tensor("elements", elements)
        if isinstance(num_elements, bool) or not isinstance(num_elements, int) or num_elements < 1:
            raise ValueError(f"num_elements must be a positive int, got {num_elements!r}")
        self.num_elements = num_elements
        self.tensor = elements.to(torch.int64).contiguous()
        if check and self.tensor.numel():
            low, high = torch.stack([self.tensor.min(), self.tensor.max()]).tolist()
            if low < 0 or high >= num_elements:
                raise IndexError(f"elements contains {low if low < 0 else high}, out of range for "
                                 f"num_elements={num_elements}")
        ordered, self.order = torch.sort(self.tensor, stable=True)
        # static shapes (no bincount, whose output size depends on the values): compiled graphs stay whole
        bounds = torch.arange(num_elements + 1, device=self.tensor.device, dtype=torch.int64)
        self.starts = torch.searchsorted(ordered, bounds)
        self._tiles = {}

    @classmethod
    def from_tensors(cls, elements: torch.Tensor, order: torch.Tensor, starts: torch.Tensor) -> "Elements":
        """Elements from tensors made by another :class:`Elements` (no check, nothing recomputed)."""
        self = object.__new__(cls)
        self.tensor, self.order, self.starts = elements, order, starts
        self.num_elements = starts.shape[0] - 1
        self._tiles = {}
        return self

    def __len__(self) -> int:
        return self.tensor.shape[0]

    def __repr__(self) -> str:
        return f"Elements(nodes={len(self)}, num_elements={self.num_elements})"

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def tiles(self, rows: int) -> tuple:
        """``(table, offsets)`` of tiles of at most ``rows`` nodes of one element: ``table [3, T]`` int64 holds
        each tile's element and its ``[start, end)`` positions in :attr:`order`; the tiles of element ``e`` are
        ``offsets[e] .. offsets[e + 1]`` (``[E + 1]``). ``T = ceil(N / rows) + E`` bounds the tile count
        without reading it; tiles past ``offsets[E]`` are empty (element 0, ``start == end == 0``). Made once
        per ``rows``."""
        found = self._tiles.get(rows)
        if found is None:
            found = self._tiles[rows] = _tiles(self.starts, len(self), rows)
        return found


def _tiles(starts: torch.Tensor, nodes: int, rows: int) -> tuple:
    E = starts.shape[0] - 1
    counts = starts[1:] - starts[:-1]
    per = torch.div(counts + (rows - 1), rows, rounding_mode="floor")
    offsets = torch.cat([per.new_zeros(1), torch.cumsum(per, 0)])
    total = -(-nodes // rows) + E
    t = torch.arange(total, device=starts.device, dtype=torch.int64)
    element = torch.searchsorted(offsets[1:], t, right=True)
    valid = element < E
    element = element.clamp(max=E - 1)
    start = starts[element] + (t - offsets[element]) * rows
    end = torch.minimum(start + rows, starts[element + 1])
    zero = torch.zeros_like(t)
    table = torch.stack([torch.where(valid, element, zero), torch.where(valid, start, zero),
                         torch.where(valid, end, zero)])
    return table, offsets


_prepared = remembered.Memory(64)


class Attributes(NamedTuple):
    """How a module reads node attributes ``y`` (made by :func:`prepare`).

    Attributes:
        elements: the :class:`Elements` the kernels walk the nodes by.
        scale: None, or ``[N, 1]`` factors of the output rows, ``y[n, elements[n]]`` (rows with at most one
            nonzero that are not all one-hot; a zero row gives 0), in ``y``'s dtype.
        per_node: None, or ``y`` itself where the weights are per node, ``y @ P`` (rows with several nonzeros,
            or a ``y`` that requires grad); ``elements`` is then one element for every node.
    """

    elements: Elements
    scale: Optional[torch.Tensor]
    per_node: Optional[torch.Tensor]


def _one_element(nodes: int, device) -> Elements:
    return Elements(torch.zeros(nodes, dtype=torch.int64, device=device), 1, check=False)


def _nonzero_columns(y: torch.Tensor) -> torch.Tensor:
    """The column of each row's nonzero (of its largest magnitude; 0 for a zero row)."""
    return y.abs().argmax(1)


def _classified(y: torch.Tensor, num_elements: int) -> tuple:
    """``(elements, scale, per node)`` of ``y``, read once: one-hot rows, rows with at most one nonzero, or
    anything else (remembered, so it holds no reference to ``y``)."""
    nonzero = (y != 0).sum(1)
    one_hot, single = torch.stack([((nonzero == 1) & (y == 1).any(1)).all(), (nonzero <= 1).all()]).tolist()
    if not single:
        return _one_element(y.shape[0], y.device), None, True
    columns = _nonzero_columns(y)
    return Elements(columns, num_elements, check=False), None if one_hot else y.gather(1, columns[:, None]), False


def prepare(y, num_elements: int, name: str = "y") -> Attributes:
    """The :class:`Attributes` of ``y``: integer element indices ``[N]`` or node attributes ``[N, num_elements]``
    of a floating dtype (MACE's ``node_attrs``; any values: the result is linear in each row). An
    :class:`Elements` or :class:`Attributes` is taken as it is.

    * Integer indices and one-hot rows: the nodes' :class:`Elements`, nothing else.
    * Rows with at most one nonzero (scaled one-hot rows, zero rows of padding nodes): the elements of the
      nonzeros and the ``scale`` of every row.
    * Any other rows (soft or mixed), and any 2-D ``y`` that requires grad: ``per_node`` (the caller gathers
      the weights as ``y @ P``, differentiable with respect to ``y``).

    In eager mode ``y`` is read (one synchronisation on CUDA) and checked on first use, and what is made is
    found again by the tensor's identity and version (:mod:`.remembered`). While ``torch.compile`` traces or a
    CUDA graph is captured nothing may be read: integer indices are not checked, and a 2-D ``y`` that does not
    require grad takes the scaled reading, with a device-side assertion that no row holds several nonzeros.

    Raises:
        TypeError: ``y`` is not a tensor, a 1-D ``y`` of a floating dtype, a 2-D ``y`` of a dtype not floating.
        ValueError: a 2-D ``y`` whose second dimension is not ``num_elements``, a ``y`` neither 1-D nor 2-D, an
            :class:`Elements` of another number of elements.
        IndexError: an element index out of range.
        RuntimeError: (asynchronously, from the device) rows with several nonzeros in a compiled or captured
            call with a ``y`` that does not require grad.
    """
    if isinstance(y, (Attributes, Elements)):
        prepared = y if isinstance(y, Attributes) else Attributes(y, None, None)
        width = prepared.elements.num_elements if prepared.per_node is None else prepared.per_node.shape[1]
        if width != num_elements:
            raise ValueError(f"{name} was prepared for {width} elements, expected {num_elements}")
        return prepared
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(y).__name__}")
    if y.dtype.is_complex or y.dtype == torch.bool:
        raise TypeError(f"{name} must hold element indices or floating node attributes, got dtype {y.dtype}")
    if y.dim() == 2:
        if not y.dtype.is_floating_point:
            raise TypeError(f"a 2-D {name} must be floating node attributes (e.g. one-hot rows), got dtype "
                            f"{y.dtype}")
        if y.shape[1] != num_elements:
            raise ValueError(f"{name} must be [nodes, num_elements={num_elements}], got shape {tuple(y.shape)}")
        if y.requires_grad:
            return Attributes(_one_element(y.shape[0], y.device), None, y)
    elif y.dim() != 1 or y.dtype.is_floating_point:
        raise ValueError(f"{name} must be 1-D integer element indices or 2-D node attributes, got shape "
                         f"{tuple(y.shape)} of dtype {y.dtype}")
    if torch.compiler.is_compiling() or (y.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        if y.dim() == 1:
            return Attributes(Elements(y, num_elements, check=False), None, None)
        torch._assert_async(((y != 0).sum(1) <= 1).all(),
                            f"{name} has rows with several nonzeros: such node attributes need eager mode, or a "
                            f"{name} that requires grad, under torch.compile and CUDA graphs")
        columns = _nonzero_columns(y)
        return Attributes(Elements(columns, num_elements, check=False), y.gather(1, columns[:, None]), None)

    def make():
        if y.dim() == 2:
            return _classified(y, num_elements)
        try:
            return Elements(y, num_elements), None, False
        except IndexError as error:
            raise IndexError(str(error).replace("elements contains", f"{name} contains", 1)) from None

    elements, scale, per_node = _prepared.get((y,), (num_elements,), make)
    return Attributes(elements, scale, y if per_node else None)
