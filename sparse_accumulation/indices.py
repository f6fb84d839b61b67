"""Prepared indices: every index tensor a call takes, checked and sorted once, and remembered under one policy.

* :func:`prepare_rule`: the :class:`~sparse_accumulation.descriptors.rules.Rule` of the tensor API's ``m1, m2,
  mu`` tensors (their values read once);
* :class:`Index`: a graph's row index (``indices_1`` ... ``indices_out``), range-checked, with the segments
  that sort it (:func:`segments`);
* :class:`Elements`: the nodes' elements, sorted, cut into tiles of one element (MACE's polynomials);
* :class:`Pairs`: the pair indices of the interaction sums, with the segments of each side.

What is made from index tensors is found again on later calls with the same tensors. A :class:`Memory` holds
it, keyed by the tensors' identity and version counters, for a bounded number of recent tensors:

* identity through weak references: a freed tensor whose address is reused by another never hits, and an entry
  goes when its tensor is freed (unless what was made holds the tensor);
* views: a view is named by the tensor it views and where it lies in it, so that ``edge_index[0]``, taken
  afresh on each call, finds what the first call made;
* version-aware: any in-place change through torch (``t[0] = 1``, ``t.copy_(...)``) bumps the version counter
  and makes a new entry;
* inference-safe: inference tensors (made under ``torch.inference_mode()``) have no version counter and may be
  changed in place inside inference mode, so what is made from them is never remembered (made afresh each
  call, with the same results); what is made inside inference mode from other tensors is found but not kept
  (it is inference tensors, which a later call outside inference mode could not save for its backward);
* capture-safe: nothing is remembered or found while a CUDA graph is being captured (the capture must record
  the device work, or a replay would reuse what the index held at capture time), while ``torch.compile``
  traces, or inside :func:`unremembered` (the bodies of registered ops that compiled graphs call: their
  warm-up runs allocate from a CUDA graph's private memory pool, where a remembered tensor would outlive the
  graph's outputs). Inside a :func:`capture_scope`, what a capture makes is found again by the same capture
  (recorded once, replayed once per graph launch) and forgotten when the scope ends.

Changes made behind torch's back (through a numpy view of a tensor's memory) are not noticed; call
:func:`clear` after such a change.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections import OrderedDict
from typing import Callable, Optional, Sequence, Tuple

import torch

from .descriptors.rules import Rule, check_index_tensor

_local = threading.local()
_memories: "weakref.WeakSet[Memory]" = weakref.WeakSet()


@contextlib.contextmanager
def unremembered():
    """Within this context (per thread), nothing is looked up in or added to any :class:`Memory`."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def capturing(t: torch.Tensor) -> bool:
    """Whether work on ``t`` is being recorded into a CUDA graph (a CUDA tensor while the current stream
    captures): nothing may be read back then."""
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def capture_scope():
    """Within this context (per thread), what is made from index tensors while a CUDA graph is captured is
    remembered for the rest of the context: the layers of a captured model sort an index once, where each would
    record its own sort. Entries never outlive the context (a later capture records its own work): open it
    around one capture, as :func:`sparse_accumulation.mace.accelerate`'s models do around each call."""
    previous = getattr(_local, "scope", None)
    _local.scope = {}
    try:
        yield
    finally:
        _local.scope = previous


def _capture_scope(tensors: Sequence[torch.Tensor]) -> Optional[dict]:
    """The open :func:`capture_scope`'s entries where ``tensors`` (CUDA, not inference tensors) are used by a
    capture on this thread outside :func:`unremembered` and ``torch.compile``; else None."""
    scope = getattr(_local, "scope", None)
    if (scope is None or getattr(_local, "depth", 0) or torch.compiler.is_compiling() or not tensors
            or any(t.is_inference() or not capturing(t) for t in tensors)):
        return None
    return scope


def rememberable(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether what is made from ``tensors`` may be remembered now (see the module docstring)."""
    if getattr(_local, "depth", 0) or torch.compiler.is_compiling():
        return False
    for t in tensors:
        if t.is_inference():
            return False
        if capturing(t):
            return False
    return True


class Memory:
    """Results made from index tensors, remembered for the ``size`` most recently used sets of tensors."""

    def __init__(self, size: int):
        self.size = size
        self._entries: "OrderedDict[tuple, tuple]" = OrderedDict()
        # reentrant: freeing an evicted entry's tensor may call _forget while the lock is held
        self._lock = threading.RLock()
        _memories.add(self)

    def get(self, tensors: Sequence[torch.Tensor], extra: tuple, make: Callable[[], object]):
        """``make()``, or what it returned for the same, unchanged ``tensors`` and equal ``extra`` (hashable)."""
        if not rememberable(tensors):
            scope = _capture_scope(tensors)
            if scope is None:
                return make()
            # the entry holds the tensors: no other tensor takes their identity while the scope lasts
            key = (id(self),) + tuple(_identity(t, _base(t)) for t in tensors) + tuple(extra)
            if key not in scope:
                scope[key] = (tuple(tensors), make())
            return scope[key][1]
        found = self.find(tensors, extra)
        if found is not None:
            return found
        bases = [_base(t) for t in tensors]
        key = tuple(_identity(t, b) for t, b in zip(tensors, bases)) + tuple(extra)
        value = make()
        if torch.is_inference_mode_enabled():
            return value
        forget = functools.partial(_forget, weakref.ref(self), key)
        with self._lock:
            self._entries[key] = (tuple(weakref.ref(b, forget) for b in bases), value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def find(self, tensors: Sequence[torch.Tensor], extra: tuple):
        """What :meth:`get` remembered for the same, unchanged ``tensors`` and equal ``extra``, or None (nothing is
        made; also while a CUDA graph is captured, where :meth:`get` remembers nothing)."""
        bases = [_base(t) for t in tensors]
        key = tuple(_identity(t, b) for t, b in zip(tensors, bases)) + tuple(extra)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and all(ref() is b for ref, b in zip(hit[0], bases)):
                self._entries.move_to_end(key)
                return hit[1]
        return None

    def _forget(self, key: tuple) -> None:
        """Drop ``key``'s entry if it is still there and one of its tensors is gone."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and any(ref() is None for ref in hit[0]):
                del self._entries[key]

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _base(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory ``t`` views (``t`` itself if it is not a view)."""
    return t if t._base is None else t._base


def _identity(t: torch.Tensor, base: torch.Tensor) -> tuple:
    """What names ``t``'s values while they are unchanged: its base's identity and version counter (shared by
    its views) and where in the base it lies."""
    return id(base), base._version, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype


def _forget(memory_ref, key, _dead_ref) -> None:
    """Weak-reference callback: a tensor of ``key`` was freed."""
    memory = memory_ref()
    if memory is not None:
        memory._forget(key)


def clear() -> None:
    """Forget everything every :class:`Memory` holds (after index tensors were changed behind torch's back)."""
    for memory in list(_memories):
        memory.clear()


# ----------------------------------------------------------------------------------------------------------
# index tensors


_prepared_rules = Memory(512)


def prepare_rule(m1: torch.Tensor, m2: torch.Tensor, mu: torch.Tensor, M1: int, M2: int,
                 output_size: int, w: torch.Tensor | None = None, weight_size: int | None = None) -> Rule:
    """The :class:`Rule` of index tensors, checked against the sizes they address (remembered per tensor).

    Reads the index values on the first call for a set of tensors (a device-to-host copy for CUDA tensors);
    later calls with the same, unmodified tensors find the rule again (never for inference tensors, whose
    values are read on every call).

    Args:
        m1, m2, mu (, w): 1-D integer tensors of equal length, on any device.
        M1, M2, output_size (, weight_size): sizes of the active dimensions of X1, X2, the output (and W).

    Raises:
        IndexError: an index is negative or not below the size it addresses.
        ValueError: the arrays are not 1-D or differ in length.
        TypeError: an index tensor is not of an integer dtype.
    """
    tensors = (m1, m2, mu) if w is None else (m1, m2, mu, w)

    def make():
        try:
            return Rule(m1, m2, mu, output_size, input_sizes=(M1, M2), w=w, weight_size=weight_size)
        except IndexError as error:  # name the sizes as the tensor API's caller knows them
            message = str(error).replace("for M1=", "for X1.shape[-1]=").replace("for M2=", "for X2.shape[-1]=")
            raise IndexError(message) from None

    return _prepared_rules.get(tensors, (M1, M2, output_size, weight_size), make)


# ----------------------------------------------------------------------------------------------------------
# graph rows


def segments(index: torch.Tensor, size: int) -> tuple:
    """``(offsets, order)``: ``order`` sorts the edges by ``index`` (stable), and the edges of row ``r`` are
    ``order[offsets[r]:offsets[r + 1]]``; values outside ``[0, size)`` lie in no row. Device operations only
    (no synchronisation)."""
    values, order = torch.sort(sort_keys(index, size), stable=True)
    boundaries = torch.arange(size + 1, device=index.device, dtype=values.dtype)
    return torch.searchsorted(values, boundaries), order


def sort_keys(index: torch.Tensor, size: int) -> torch.Tensor:
    """``index`` as the keys a stable sort by row needs: int32 where ``size`` is an int that fits (a GPU radix
    sort then makes half the passes of int64's), values outside ``[0, size)`` clamped to -1 or ``size`` (still in
    no row); as it is for a symbolic ``size`` (a traced graph holds no assumption on it)."""
    if not isinstance(size, int) or size >= 2147483647:
        return index
    return torch.clamp(index, -1, size).to(torch.int32)


def check_size(name: str, value) -> int:
    """``value`` if it is a non-negative int (a ``SymInt`` while compiling), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


class Index:
    """A row index prepared once for message passing: checked, and sorted once.

    Args:
        index: 1-D integer tensor (any integer dtype, any device): the row each edge reads or adds to.
        size: number of rows it addresses (``0 <= index < size``).
        sorted: True: ``index`` must be non-decreasing (checked with ``check``; a ValueError if it is not);
            False: make the sorting permutation even for sorted values; None (default): whether the checked
            values are non-decreasing. Segments skip the permutation only for values checked to be sorted.
        check: read the values (one synchronisation on CUDA) to check their range and order (default True).
            Without it nothing is read: rows out of range are skipped by the kernels, and the index is sorted
            on the device.

    Attributes:
        tensor: the index as a contiguous int64 tensor; ``size``; ``sorted``.

    Raises:
        TypeError: ``index`` is not an integer tensor.
        ValueError: ``index`` is not 1-D, ``size`` is not a non-negative int, ``sorted=True`` for values that are
            not non-decreasing (with ``check``).
        IndexError: a value is negative or not below ``size`` (with ``check``).
    """

    def __init__(self, index: torch.Tensor, size: int, *, sorted: Optional[bool] = None, check: bool = True):
        check_index_tensor("index", index)
        self.size = check_size("size", size)
        self.tensor = index.to(torch.int64).contiguous()
        ordered = False
        if check:
            ordered = True
            if self.tensor.numel():
                low, high, ordered = _summary(self.tensor)
                if low < 0:
                    raise IndexError(f"index contains a negative row ({low}); rows must lie in [0, {size})")
                if high >= size:
                    raise IndexError(f"index contains row {high}, out of range for size {size}")
            if sorted and not ordered:
                raise ValueError("index is not sorted (non-decreasing), but sorted=True was given")
        # unchecked values may be in any order: only a verified order lets the segments skip the permutation
        self.sorted = ordered and sorted is not False
        self._version = None if self.tensor.is_inference() else self.tensor._version
        self._segments = [None]  # a list: the Indexes of one prepared tensor share it (prepared_index)

    @classmethod
    def _again(cls, index: torch.Tensor, size: int, sorted: bool, segments: list) -> "Index":
        """The Index of ``index`` from what an earlier one found: its order and its segments' holder."""
        made = cls.__new__(cls)
        made.size, made.sorted, made._segments = size, sorted, segments
        made.tensor = index.to(torch.int64).contiguous()
        made._version = None if made.tensor.is_inference() else made.tensor._version
        return made

    def __len__(self) -> int:
        return self.tensor.shape[0]

    def __repr__(self) -> str:
        return f"Index(edges={len(self)}, size={self.size}, sorted={self.sorted})"

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def check_unchanged(self, name: str = "index") -> None:
        """Raise ``ValueError`` if the index tensor was changed in place since this Index was made (what was
        checked and sorted would no longer hold)."""
        if self._version is not None and self.tensor._version != self._version:
            raise ValueError(f"{name}: the index tensor was changed in place after its Index was made; make a new "
                             "Index")

    def segments(self) -> tuple:
        """``(offsets, order)``: the edges of row ``r`` are ``order[offsets[r]:offsets[r + 1]]`` (``order`` None
        when the index is sorted); made once, on the device."""
        if self._segments[0] is None:
            if self.sorted:
                boundaries = torch.arange(self.size + 1, device=self.device, dtype=torch.int64)
                self._segments[0] = (torch.searchsorted(self.tensor, boundaries), None)
            else:
                self._segments[0] = segments(self.tensor, self.size)
        return self._segments[0]


def _summary(t: torch.Tensor) -> tuple:
    """``(min, max, non-decreasing)`` of a non-empty index tensor, in one transfer."""
    ordered = (t[1:] >= t[:-1]).all() if t.shape[0] > 1 else torch.ones((), dtype=torch.bool, device=t.device)
    values = torch.stack([t.min(), t.max(), ordered.to(torch.int64)]).tolist()
    return values[0], values[1], bool(values[2])


_prepared_indices = Memory(256)


def prepared_index(name: str, t: torch.Tensor, size: int) -> Index:
    """The :class:`Index` of an index tensor ``name``, checked on its first use; later calls with ``t`` (or the
    same view of the same tensor) unchanged find its order and segments again, until ``t`` is freed (made afresh,
    unchecked, while a CUDA graph is captured: nothing may be read then; found again within a
    :func:`capture_scope`)."""
    if capturing(t):
        return _prepared_indices.get((t,), (size, "unchecked"), lambda: Index(t, size, check=False))

    def make():
        try:
            index = Index(t, size)
        except IndexError as error:
            raise IndexError(str(error).replace("index contains", f"{name} contains", 1)) from None
        return index.sorted, index._segments  # not the Index: it holds the tensor, which would outlive its user

    return Index._again(t, size, *_prepared_indices.get((t,), (size,), make))


# ----------------------------------------------------------------------------------------------------------
# elements


class Elements:
    """The elements of ``N`` nodes, sorted once.

    The polynomial kernels visit the nodes in the order of their elements, in tiles that each hold nodes of
    one element only: a tile reads its element's weights once, and sums an element output over its rows
    without atomics. Everything is made with device operations of static shapes (no synchronisation, no graph
    break under ``torch.compile``); only the optional check reads values.

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
        self.order, self.starts = element_segments(self.tensor, num_elements)
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
        per ``rows``: on the CPU in one pass (numba), elsewhere and while ``torch.compile`` traces by device
        operations (no synchronisation)."""
        found = self._tiles.get(rows)
        if found is None:
            if self.starts.device.type == "cpu" and not torch.compiler.is_compiling():
                found = _numba_tools().element_tiles(self.starts, len(self), rows)
            else:
                found = _tiles(self.starts, len(self), rows)
            self._tiles[rows] = found
        return found

    def copy_from(self, other: "Elements") -> None:
        """Write ``other``'s values (the same number of nodes and elements) into this one's tensors in place, the
        tile tables made so far included (made for ``other`` as needed): what a CUDA graph that reads this one's
        tensors sees next."""
        if len(other) != len(self) or other.num_elements != self.num_elements:
            raise ValueError(f"{other!r} cannot be copied into {self!r}")
        for mine, theirs in ((self.tensor, other.tensor), (self.order, other.order), (self.starts, other.starts)):
            mine.copy_(theirs)
        for key, held in self._tiles.items():
            fresh = other.tile_slots(key[1]) if isinstance(key, tuple) else other.tiles(key)
            for mine, theirs in zip(held, fresh):
                mine.copy_(theirs)

    def tile_slots(self, rows: int) -> tuple:
        """``(node, slot)`` for the tiles of :meth:`tiles`: ``node [T * rows]`` int64, the node each tile slot
        holds (in :attr:`order`; a padding slot holds some node and is never read back), and ``slot [N]``, where
        each node's row lies among the slots. Made once per ``rows`` by device operations."""
        key = ("slots", rows)
        found = self._tiles.get(key)
        if found is None:
            table, _ = self.tiles(rows)
            N, tiles, device = len(self), table.shape[1], self.tensor.device
            if N == 0:
                empty = torch.zeros(0, dtype=torch.int64, device=device)
                self._tiles[key] = (torch.zeros(tiles * rows, dtype=torch.int64, device=device), empty)
                return self._tiles[key]
            position = table[1][:, None] + torch.arange(rows, device=device)  # [tiles, rows] slots in order
            valid = position < table[2][:, None]
            node = self.order[position.clamp(max=N - 1)]
            # padding slots write to row N, dropped
            slot = torch.empty(N + 1, dtype=torch.int64, device=device).scatter_(
                0, torch.where(valid, node, N).flatten(), torch.arange(tiles * rows, device=device))[:N]
            found = self._tiles[key] = (node.reshape(-1), slot)
        return found


def element_segments(elements: torch.Tensor, num_elements: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(order, starts)`` of int64 ``elements``: the nodes sorted by element (stable), and the ``[E + 1]``
    offsets in ``order`` of each element's nodes (values outside ``[0, E)`` lie in no element). Device
    operations of static shapes only (no bincount, whose output size depends on the values: compiled graphs
    stay whole); TorchScript compiles it."""
    ordered, order = torch.sort(sort_keys(elements, num_elements), stable=True)
    bounds = torch.arange(num_elements + 1, device=elements.device, dtype=ordered.dtype)
    return order, torch.searchsorted(ordered, bounds)


def _tiles(starts: torch.Tensor, nodes: int, rows: int) -> tuple:
    E = starts.shape[0] - 1
    counts = starts[1:] - starts[:-1]
    per = torch.div(counts + (rows - 1), rows, rounding_mode="floor")
    offsets = torch.cat([per.new_zeros(1), torch.cumsum(per, 0)])
    total = -(-nodes // rows) + E
    t = torch.arange(total, device=starts.device, dtype=torch.int64)
    # offsets[0] == 0 <= t: the count of offsets[1:] <= t is one less than that of offsets; searched in the whole
    # tensor because inductor's CUDA code for searchsorted ignores a view's storage offset (torch 2.11)
    element = torch.searchsorted(offsets, t, right=True) - 1
    valid = element < E
    element = element.clamp(max=E - 1)
    start = starts[element] + (t - offsets[element]) * rows
    end = torch.minimum(start + rows, starts[element + 1])
    zero = torch.zeros_like(t)
    table = torch.stack([torch.where(valid, element, zero), torch.where(valid, start, zero),
                         torch.where(valid, end, zero)])
    return table, offsets


# ----------------------------------------------------------------------------------------------------------
# pairs

#: pair index tensors whose check and segments are remembered
PAIR_CACHE_SIZE = 8
_pair_entries = Memory(PAIR_CACHE_SIZE)
_pairs_in_order = Memory(PAIR_CACHE_SIZE)


class PairIndex:
    """One pair index tensor (``pair_first`` or ``pair_second``) against ``n_atoms``: its range check and its
    segments, each made on first use.

    Segments: ``order``, the pairs sorted stably by atom (the pairs of one atom keep their order, so segmented
    sums run in a fixed order), and ``offsets`` (``n_atoms + 1``), the pairs of atom ``a`` being
    ``order[offsets[a]:offsets[a + 1]]``. On the CPU the values are checked (``IndexError`` naming the argument)
    and counting-sorted by numba; elsewhere with device operations only, the check a ``torch._assert_async``
    (surfacing at a later synchronisation, as torch's own indexing errors do) and pairs out of range in no
    segment."""

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
            _numba_tools().check_range(self.long(), self.n_atoms, name)
        elif self.key.numel():
            key = self.long()
            inside = (key.min() >= 0) & (key.max() < self.n_atoms)
            torch._assert_async(inside, f"{name} holds an atom index outside [0, {self.n_atoms})")
        self._checked = True

    def segments(self, name: str) -> tuple:
        """``(order, offsets)`` (see the class), the values checked first (:meth:`check`)."""
        self.check(name)
        if self._segments is None:
            if self.key.device.type == "cpu":
                self._segments = _numba_tools().counting_sort(self.long(), self.n_atoms)
            else:
                offsets, order = segments(self.long(), self.n_atoms)
                self._segments = order, offsets
        return self._segments


def _numba_tools():
    from .kernels.numba import indices

    return indices


def pair_index(key: torch.Tensor, n_atoms: int) -> PairIndex:
    """The :class:`PairIndex` of ``key`` against ``n_atoms``, remembered while ``key`` is unchanged."""
    return _pair_entries.get((key,), (n_atoms,), lambda: PairIndex(key, n_atoms))


class Pairs:
    """The pairs of an interaction sum (``pair_first``, ``pair_second``: 1-D integer tensors of one length, one
    atom per pair, on the data's device) against ``n_atoms``, prepared for the kernels on demand and
    remembered per index tensor (a forward and its backward sort each index once)."""

    def __init__(self, pair_first: torch.Tensor, pair_second: torch.Tensor, n_atoms: int):
        self.first, self.second, self.n_atoms = pair_first, pair_second, n_atoms

    def __len__(self) -> int:
        return self.first.shape[0]

    def checked(self) -> tuple:
        """``(pair_first, pair_second)`` as they are, both checked against ``n_atoms``."""
        for name, key in (("pair_first", self.first), ("pair_second", self.second)):
            pair_index(key, self.n_atoms).check(name)
        return self.first, self.second

    def by_first(self, other_in_order: bool = False) -> tuple:
        """``(order, offsets, second)``: the segments of ``pair_first`` and ``pair_second`` as int64, both
        checked; with ``other_in_order``, ``second[order]`` (a kernel then reads a pair's other atom beside the
        pair instead of through it; remembered for the two tensors)."""
        return _by(self.first, "pair_first", self.second, "pair_second", self.n_atoms, other_in_order)

    def by_second(self, other_in_order: bool = False) -> tuple:
        """``(order, offsets, first)``: as :meth:`by_first`, by ``pair_second``."""
        return _by(self.second, "pair_second", self.first, "pair_first", self.n_atoms, other_in_order)


def _by(by, by_name: str, other, other_name: str, n_atoms: int, other_in_order: bool) -> tuple:
    def make():
        order, offsets = pair_index(by, n_atoms).segments(by_name)
        entry = pair_index(other, n_atoms)
        entry.check(other_name)
        return order, offsets, entry.long()[order] if other_in_order else entry.long()

    if not other_in_order:
        return make()
    return _pairs_in_order.get((by, other), (by_name, other_name, n_atoms), make)
