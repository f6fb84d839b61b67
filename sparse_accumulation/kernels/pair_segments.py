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

:func:`lookup` remembers the check and the segments of recent index tensors (:data:`CACHE_SIZE` of them), keyed
by the tensor itself (a reference is kept, so it cannot be freed and replaced by another at the same address),
its version counter (any in-place change through torch makes a new entry) and ``n_atoms``: a forward and its
backward sort each index once. Not cached: inference tensors (they have no version counter), calls made while
a CUDA graph is captured (the capture must record the sort, or a replay would reuse stale segments) and calls
inside :func:`unremembered` (the registered ops, which compiled graphs call: their warm-up runs allocate from a
CUDA graph's private memory pool, where a remembered tensor would outlive the graph's outputs). Index
tensors changed behind torch's back (through a numpy view of their memory) are not noticed; call
:func:`clear_cache` after doing that.
"""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

import torch

#: index tensors whose check and segments are remembered
CACHE_SIZE = 8

_lock = threading.Lock()
_cache: "OrderedDict[tuple, PairIndex]" = OrderedDict()
_local = threading.local()


@contextlib.contextmanager
def unremembered():
    """Within this context (per thread), index tensors are prepared afresh: nothing is looked up in or added to
    the caches."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def _host_tools():
    from . import hippynn_numba

    return hippynn_numba


class PairIndex:
    """One index tensor (``pair_first`` or ``pair_second``) against ``n_atoms``: its range check and segments,
    each made on first use."""

    def __init__(self, key: torch.Tensor, n_atoms: int):
        self.key = key
        self.n_atoms = n_atoms
        self.version = _version(key)
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
    return _remembered(("sorted", by_name, other_name, n_atoms), by, other,
                       lambda: _make_sorted(by, by_name, other, other_name, n_atoms))


def _make_sorted(by, by_name, other, other_name, n_atoms):
    entry = lookup(by, n_atoms)
    order, offsets = entry.segments(by_name)
    other_entry = lookup(other, n_atoms)
    other_entry.check(other_name)
    return order, offsets, other_entry.long()[order]


#: prepared tensors of recent pairs of index tensors: key -> (first, second, versions, value)
_pairs_cache: "OrderedDict[tuple, tuple]" = OrderedDict()


def _remembered(what: tuple, a: torch.Tensor, b: torch.Tensor, make):
    """``make()`` for index tensors ``a`` and ``b``, remembered while both are the same unchanged tensors (as
    :func:`lookup` remembers one; references are kept)."""
    if not _cacheable(a, b):
        return make()
    key = what + (a._cdata, b._cdata)
    hit = _pairs_cache.get(key)
    if hit is not None and hit[0] is a and hit[1] is b and hit[2] == (a._version, b._version):
        return hit[3]
    value = make()
    with _lock:
        _pairs_cache[key] = (a, b, (a._version, b._version), value)
        while len(_pairs_cache) > CACHE_SIZE:
            _pairs_cache.popitem(last=False)
    return value


def device_segments(key: torch.Tensor, n_atoms: int) -> tuple:
    """``(order, offsets)`` of an int64 ``key`` with device operations only (no host synchronisation); pairs
    whose key lies outside ``[0, n_atoms)`` are in no segment."""
    ordered, order = torch.sort(key, stable=True)
    atoms = torch.arange(n_atoms + 1, device=key.device, dtype=key.dtype)
    return order, torch.searchsorted(ordered, atoms)


def _version(key: torch.Tensor):
    return None if key.is_inference() else key._version


def _cacheable(*keys: torch.Tensor) -> bool:
    """Whether index tensors on one device may be remembered now (see the module docstring)."""
    if getattr(_local, "depth", 0) or any(key.is_inference() for key in keys):
        return False
    return not (keys[0].device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def lookup(key: torch.Tensor, n_atoms: int) -> PairIndex:
    """The :class:`PairIndex` of ``key`` against ``n_atoms``, remembered while ``key`` is unchanged."""
    if not _cacheable(key):
        return PairIndex(key, n_atoms)
    cache_key = (key._cdata, n_atoms)
    with _lock:
        entry = _cache.get(cache_key)
        if entry is not None and entry.key is key and entry.version == key._version:
            _cache.move_to_end(cache_key)
            return entry
        entry = _cache[cache_key] = PairIndex(key, n_atoms)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return entry


def clear_cache() -> None:
    """Forget every remembered index tensor."""
    with _lock:
        _cache.clear()
        _pairs_cache.clear()
