"""Pair indices of the interaction sums: range checks and CSR segments, made once per index tensor.

The kernels of :mod:`sparse_accumulation.hippynn` sum over the pairs of each atom. They need, for an index
tensor ``key`` (``pair_first`` or ``pair_second``, one atom per pair) and ``n_atoms``:

* a range check: every value in ``[0, n_atoms)``;
* CSR segments: ``order``, the pairs sorted stably by ``key`` (so the pairs of one atom keep their original
  order and every segmented sum runs in a fixed order), and ``offsets`` (``n_atoms + 1``), the pairs of atom
  ``a`` being ``order[offsets[a]:offsets[a + 1]]``. Both are int64 tensors on the key's device.

How each is made depends on the device:

* CPU: :mod:`.hippynn_numba` checks the values and counting-sorts in one pass each (a bad value raises
  ``IndexError`` naming the argument before any kernel runs);
* any other device (CUDA): device operations only, no host synchronisation: a stable ``torch.sort`` and
  ``torch.searchsorted`` of the atom numbers ``0 .. n_atoms``, so pairs whose key is out of range fall outside
  every segment and are never summed into an output; the range check is a ``torch._assert_async`` (a device-side
  assertion: the error surfaces at a later synchronisation and leaves the CUDA context unusable, as torch's own
  indexing errors do). Kernels mask the values they gather by, so a bad index is never read or written through.

:func:`lookup` remembers the check and the segments of recent index tensors (:data:`CACHE_SIZE` of them) and
:func:`prepare_sorted` the sorted pairs of recent pairs of index tensors, under the policy of
:mod:`sparse_accumulation.remembered` (identity and version counter; never inference tensors, CUDA-graph
captures or the bodies of the registered ops, which call :func:`unremembered`): a forward and its backward sort
each index once.
"""
from __future__ import annotations

import torch

from ..remembered import Memory, clear, unremembered  # noqa: F401  (unremembered: the ops' entry point)

#: index tensors whose check and segments are remembered
CACHE_SIZE = 8

_entries = Memory(CACHE_SIZE)
_pairs = Memory(CACHE_SIZE)


def _host_tools():
    from . import hippynn_numba

    return hippynn_numba


class PairIndex:
    """One index tensor (``pair_first`` or ``pair_second``) against ``n_atoms``: its range check and segments,
    each made on first use."""

    def __init__(self, key: torch.Tensor, n_atoms: int):
        self.key = key
        self.n_atoms = n_atoms
        self._checked = False
        self._segments = None
        self._long = None

    def long(self) -> torch.Tensor:
        """The key as a contiguous int64 tensor."""
        if self._long is None:
            self._long = self.key.to(torch.int64).contiguous()
        return self._long

    def check(self, name: str) -> None:
        """Check every value is in ``[0, n_atoms)``: on the CPU now (``IndexError`` naming ``name``), elsewhere
        with an asynchronous device-side assertion."""
        if self._checked:
            return
        if self.key.device.type == "cpu":
            _host_tools().check_range(self.long(), self.n_atoms, name)
        elif self.key.numel():
            key = self.long()
            inside = (key.min() >= 0) & (key.max() < self.n_atoms)
            torch._assert_async(inside, f"{name} holds an atom index outside [0, {self.n_atoms})")
        self._checked = True

    def segments(self, name: str) -> tuple:
        """``(order, offsets)``: the pairs sorted stably by atom, and where each atom's pairs start
        (``n_atoms + 1`` entries); values are checked first (:meth:`check`)."""
        self.check(name)
        if self._segments is None:
            if self.key.device.type == "cpu":
                self._segments = _host_tools().counting_sort(self.long(), self.n_atoms)
            else:
                self._segments = device_segments(self.long(), self.n_atoms)
        return self._segments


def prepare(by, by_name: str, other, other_name: str, n_atoms: int) -> tuple:
    """What a kernel needs of ``pair_first`` and ``pair_second``: ``(order, offsets, other)``, the segments of
    the index ``by`` and the other index as contiguous int64, both checked against ``n_atoms`` (``by_name`` and
    ``other_name`` name them in errors)."""
    order, offsets = lookup(by, n_atoms).segments(by_name)
    entry = lookup(other, n_atoms)
    entry.check(other_name)
    return order, offsets, entry.long()


def prepare_sorted(by, by_name: str, other, other_name: str, n_atoms: int) -> tuple:
    """As :func:`prepare`, with the other index in segment order (``other[order]``), so a kernel reads a
    pair's other atom beside the pair instead of through it. Remembered for the pair of tensors (one dictionary
    lookup per call once made)."""
    def make():
        entry = lookup(by, n_atoms)
        order, offsets = entry.segments(by_name)
        other_entry = lookup(other, n_atoms)
        other_entry.check(other_name)
        return order, offsets, other_entry.long()[order]

    return _pairs.get((by, other), ("sorted", by_name, other_name, n_atoms), make)


def device_segments(key: torch.Tensor, n_atoms: int) -> tuple:
    """``(order, offsets)`` of an int64 ``key`` with device operations only (no host synchronisation); pairs
    whose key lies outside ``[0, n_atoms)`` are in no segment."""
    ordered, order = torch.sort(key, stable=True)
    atoms = torch.arange(n_atoms + 1, device=key.device, dtype=key.dtype)
    return order, torch.searchsorted(ordered, atoms)


def lookup(key: torch.Tensor, n_atoms: int) -> PairIndex:
    """The :class:`PairIndex` of ``key`` against ``n_atoms``, remembered while ``key`` is unchanged."""
    return _entries.get((key,), (n_atoms,), lambda: PairIndex(key, n_atoms))


def clear_cache() -> None:
    """Forget every remembered index tensor (of every kind: :func:`sparse_accumulation.remembered.clear`)."""
    clear()
