"""What is prepared from index tensors, remembered per tensor under one policy.

Index tensors (a rule's ``m1, m2, mu``, a graph's ``indices_out``, MACE's elements, HIP-NN's pairs) are checked
and sorted once and the result found again on later calls with the same tensors. A :class:`Memory` holds such
results, keyed by the tensors' identity and version counters, for a bounded number of recent tensors:

* weak references: a remembered entry never keeps a tensor alive, and a freed tensor whose address is reused
  by another never hits;
* version-aware: any in-place change through torch (``t[0] = 1``, ``t.copy_(...)``) bumps the version counter
  and makes a new entry;
* inference-safe: inference tensors (made under ``torch.inference_mode()``) have no version counter and may be
  changed in place inside inference mode, so what is made from them is never remembered (made afresh each
  call, with the same results);
* capture-safe: nothing is remembered or found while a CUDA graph is being captured (the capture must record
  the device work, or a replay would reuse what the index held at capture time), while ``torch.compile``
  traces, or inside :func:`unremembered` (the bodies of registered ops that compiled graphs call: their
  warm-up runs allocate from a CUDA graph's private memory pool, where a remembered tensor would outlive the
  graph's outputs).

Changes made behind torch's back (through a numpy view of a tensor's memory) are not noticed; call
:func:`clear` after such a change.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from typing import Callable, Sequence

import torch

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


def rememberable(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether what is made from ``tensors`` may be remembered now (see the module docstring)."""
    if getattr(_local, "depth", 0) or torch.compiler.is_compiling():
        return False
    for t in tensors:
        if t.is_inference():
            return False
        if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
    return True


class Memory:
    """Results made from index tensors, remembered for the ``size`` most recently used sets of tensors."""

    def __init__(self, size: int):
        self.size = size
        self._entries: "OrderedDict[tuple, tuple]" = OrderedDict()
        self._lock = threading.Lock()
        _memories.add(self)

    def get(self, tensors: Sequence[torch.Tensor], extra: tuple, make: Callable[[], object]):
        """``make()``, or what it returned for the same, unchanged ``tensors`` and equal ``extra`` (hashable)."""
        if not rememberable(tensors):
            return make()
        key = tuple((id(t), t._version) for t in tensors) + tuple(extra)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and all(ref() is t for ref, t in zip(hit[0], tensors)):
                self._entries.move_to_end(key)
                return hit[1]
        value = make()
        with self._lock:
            self._entries[key] = (tuple(weakref.ref(t) for t in tensors), value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def clear() -> None:
    """Forget everything every :class:`Memory` holds (after index tensors were changed behind torch's back)."""
    for memory in list(_memories):
        memory.clear()
