"""Nodes' elements, prepared once per element tensor: sorted, and cut into tiles of one element each.

Kernels of :mod:`sparse_accumulation.polynomials` visit the nodes in the order of their elements, in tiles that
each hold nodes of one element only: a tile reads its element's weights once, and sums an element output over
its rows without atomics. :class:`Elements` holds the element of every node, the permutation that sorts them
and where each element's nodes start; :meth:`Elements.tiles` cuts them into tiles of a given number of rows.
Everything is made with device operations (no synchronisation); only the optional check reads values.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Optional

import torch

from .rules import check_index_tensor

_CACHE_SIZE = 64


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
        self.order = torch.sort(self.tensor, stable=True)[1]
        counts = torch.bincount(self.tensor, minlength=num_elements)[:num_elements]
        self.starts = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
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


_cache: "OrderedDict[tuple, tuple]" = OrderedDict()
_cache_lock = threading.Lock()


def _one_hot_elements(y: torch.Tensor, check: bool) -> torch.Tensor:
    if check and y.numel():
        ones = (y == 1).sum(1)
        zeros = (y == 0).sum(1)
        bad = torch.stack([((ones != 1) | (ones + zeros != y.shape[1])).any()]).tolist()[0]
        if bad:
            raise ValueError("y must be one-hot: every row one 1 and zeros elsewhere (or pass element indices)")
    return y.argmax(1) if y.shape[1] else y.new_zeros(y.shape[0], dtype=torch.int64)


def prepare(y, num_elements: int, name: str = "y") -> Elements:
    """The :class:`Elements` of ``y``: integer element indices ``[N]`` or a one-hot ``[N, num_elements]``
    floating tensor (MACE's node attributes); checked and sorted on first use, then found again by the
    tensor's identity and version (in eager mode; while ``torch.compile`` traces, made on the device with no
    check).

    Raises:
        TypeError: ``y`` is not a tensor of an integer or floating dtype.
        ValueError: a 2-D ``y`` whose second dimension is not ``num_elements`` or that is not one-hot, or a
            ``y`` that is neither 1-D nor 2-D.
        IndexError: an element index out of range.
    """
    if isinstance(y, Elements):
        if y.num_elements != num_elements:
            raise ValueError(f"{name} was prepared for {y.num_elements} elements, expected {num_elements}")
        return y
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(y).__name__}")
    if y.dtype.is_complex or y.dtype == torch.bool:
        raise TypeError(f"{name} must hold element indices or a one-hot float tensor, got dtype {y.dtype}")
    if y.dim() == 2:
        if not y.dtype.is_floating_point:
            raise TypeError(f"a 2-D {name} must be a one-hot floating tensor, got dtype {y.dtype}")
        if y.shape[1] != num_elements:
            raise ValueError(f"{name} must be [nodes, num_elements={num_elements}], got shape {tuple(y.shape)}")
    elif y.dim() != 1 or y.dtype.is_floating_point:
        raise ValueError(f"{name} must be 1-D integer element indices or a 2-D one-hot tensor, got shape "
                         f"{tuple(y.shape)} of dtype {y.dtype}")
    compiling = torch.compiler.is_compiling()
    if compiling:
        elements = _one_hot_elements(y, False) if y.dim() == 2 else y
        return Elements(elements, num_elements, check=False)
    key = (id(y), y._version, num_elements)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0]() is y:
            _cache.move_to_end(key)
            return hit[1]
    try:
        elements = _one_hot_elements(y, True) if y.dim() == 2 else y
        prepared = Elements(elements, num_elements)
    except IndexError as error:
        raise IndexError(str(error).replace("elements contains", f"{name} contains", 1)) from None
    with _cache_lock:
        _cache[key] = (weakref.ref(y), prepared)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return prepared


def elements_of(value, num_elements: int) -> Optional[Elements]:
    """``value`` if it is an :class:`Elements`, else None."""
    return value if isinstance(value, Elements) else None
