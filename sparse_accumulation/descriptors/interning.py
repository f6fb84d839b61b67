"""Descriptors interned by key: one living object per key, rebuilt from its key anywhere.

A descriptor (rule, channel rule, program) is immutable and named by :attr:`Descriptor.key`, a string that
encodes it whole: the registered ops take keys (constants to ``torch.compile`` and ``torch.export``), and a key
read from a compiled graph in a new process rebuilds its descriptor (:meth:`Descriptor.from_key`). Equal
descriptors are the same object while one is alive, so what is derived from one (its gradients' descriptors,
kernel plans, device tables) is made once and kept in it (:meth:`Descriptor.cached`).

A compiled graph holds its descriptors' keys only (a graph loaded from a warm compile cache names gradients'
descriptors that nothing in the process made): the :data:`RECENT` descriptors most recently found by key are
therefore held alive, so that a key read on every call is decoded once, not on every call.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

#: descriptors of each kind most recently found by :meth:`Descriptor.from_key`, held alive
RECENT = 256


class Descriptor:
    """Base of interned, immutable descriptors.

    A subclass builds its instances with :meth:`_interned` and defines the class method ``_decode(key)``: the
    descriptor a key encodes, for keys of no living object (raising ``ValueError`` for anything else).
    """

    _registry: "weakref.WeakValueDictionary[str, Descriptor]"
    _registry_lock: threading.Lock
    _recent: "OrderedDict[str, Descriptor]"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._registry = weakref.WeakValueDictionary()
        cls._registry_lock = threading.Lock()
        cls._recent = OrderedDict()

    @classmethod
    def _interned(cls, key: str, **fields) -> "Descriptor":
        """The living descriptor of ``key``, or a new one holding ``fields`` (already checked)."""
        with cls._registry_lock:
            found = cls._registry.get(key)
            if found is None:
                found = object.__new__(cls)
                found.__dict__.update(fields, key=key, _derived={}, _derived_lock=threading.Lock())
                cls._registry[key] = found
        return found

    @classmethod
    def from_key(cls, key: str):
        """The descriptor a :attr:`key` encodes: the living one, or one rebuilt from the key; held alive among
        the :data:`RECENT` most recently found.

        Raises:
            ValueError: ``key`` is not a key of this kind of descriptor.
        """
        with cls._registry_lock:
            found = cls._registry.get(key)
            if found is not None:
                cls._hold(key, found)
                return found
        if not isinstance(key, str):
            raise ValueError(f"a {cls.__name__} key is a string, got {type(key).__name__}")
        found = cls._decode(key)
        with cls._registry_lock:
            cls._hold(key, found)
        return found

    @classmethod
    def _hold(cls, key: str, found: "Descriptor") -> None:
        """Hold ``found`` among the most recently found (the registry's lock held)."""
        cls._recent[key] = found
        cls._recent.move_to_end(key)
        while len(cls._recent) > RECENT:
            cls._recent.popitem(last=False)

    def cached(self, key, build):
        """What ``build()`` makes, made once per ``key`` for this descriptor (thread-safe)."""
        with self._derived_lock:
            found = self._derived.get(key)
        if found is None:
            found = build()
            with self._derived_lock:
                found = self._derived.setdefault(key, found)
        return found

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} objects are immutable")

    def __reduce__(self):
        return (type(self).from_key, (self.key,))
