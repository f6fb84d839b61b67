"""Index tools on the CPU with numba: the range check and the counting sort of a pair index
(:class:`sparse_accumulation.indices.PairIndex` calls them for CPU tensors), and the tiles of nodes sorted by
element (:meth:`sparse_accumulation.indices.Elements.tiles`)."""
from __future__ import annotations

import numba
import torch


@numba.njit(cache=True, nogil=True)
def _counting_sort(key, n, order, offsets):
    """``order``: positions of ``key`` sorted stably by value (values in ``[0, n)``); ``offsets[a]``: where the
    positions of value ``a`` start (``n + 1`` entries)."""
    for a in range(n + 1):
        offsets[a] = 0
    for p in range(key.shape[0]):
        offsets[key[p] + 1] += 1
    for a in range(n):
        offsets[a + 1] += offsets[a]
    cursor = offsets[:n].copy()
    for p in range(key.shape[0]):
        k = key[p]
        order[cursor[k]] = p
        cursor[k] += 1


@numba.njit(cache=True, nogil=True)
def _first_outside(key, n):
    for p in range(key.shape[0]):
        if key[p] < 0 or key[p] >= n:
            return p
    return -1


def check_range(key: torch.Tensor, n_atoms: int, name: str) -> None:
    """Raise ``IndexError`` naming ``name`` unless every value of the int64 CPU tensor ``key`` is in
    ``[0, n_atoms)``."""
    position = _first_outside(key.numpy(), n_atoms)
    if position >= 0:
        raise IndexError(f"{name} must hold atom indices in [0, {n_atoms}) (n_atoms from the atom dimension), "
                         f"got {name}[{position}] = {int(key[position])}")


def counting_sort(key: torch.Tensor, n_atoms: int) -> tuple:
    """``(order, offsets)`` of an int64 CPU tensor with values in ``[0, n_atoms)`` (see :class:`sparse_accumulation.indices.PairIndex`)."""
    order = torch.empty(key.shape[0], dtype=torch.int64)
    offsets = torch.empty(n_atoms + 1, dtype=torch.int64)
    _counting_sort(key.numpy(), n_atoms, order.numpy(), offsets.numpy())
    return order, offsets


@numba.njit(cache=True, nogil=True)
def _element_tiles(starts, rows, table, offsets):
    elements = starts.shape[0] - 1
    t = 0
    offsets[0] = 0
    for e in range(elements):
        start, end = starts[e], starts[e + 1]
        while start < end and t < table.shape[1]:
            table[0, t] = e
            table[1, t] = start
            table[2, t] = min(start + rows, end)
            start += rows
            t += 1
        offsets[e + 1] = t
    for rest in range(t, table.shape[1]):
        table[0, rest] = 0
        table[1, rest] = 0
        table[2, rest] = 0


def element_tiles(starts: torch.Tensor, nodes: int, rows: int) -> tuple:
    """``(table [3, ceil(nodes / rows) + E], offsets [E + 1])`` of the int64 CPU tensor ``starts`` (``[E + 1]``):
    what :meth:`sparse_accumulation.indices.Elements.tiles` describes, in one pass."""
    table = torch.empty(3, -(-nodes // rows) + starts.shape[0] - 1, dtype=torch.int64)
    offsets = torch.empty(starts.shape[0], dtype=torch.int64)
    _element_tiles(starts.numpy(), rows, table.numpy(), offsets.numpy())
    return table, offsets
