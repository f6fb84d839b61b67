"""Preparing (validating, converting, caching) the index part of a sparse accumulation rule.

A rule is the triple of index arrays ``m1, m2, mu`` (the coefficients ``C`` are data and are never cached).
Kernels receive a :class:`PreparedRule`: indices already checked against the sizes they address, held as
host tuples (for code generation), numpy arrays (for numba) and device tensors (for torch code).

Checking reads index values, which would break a ``torch.compile`` full graph if done in traced Python, so it
happens inside the registered ops, once per rule: :func:`prepare_rule` caches on the identity and version
counter of the index tensors (through weak references, so a freed tensor whose memory is reused never hits).
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

_CACHE_SIZE = 512


@dataclass(eq=False)
class PreparedRule:
    """Validated indices of one rule, in every form a kernel may want.

    Attributes:
        m1, m2, mu: host tuples of Python ints, one entry per nonzero.
        input_sizes: ``(M1, M2)``, the sizes the rule was checked against.
        output_size: the size ``mu`` was checked against.
        key: hashable, equal for rules with equal indices and sizes (for kernel caches).
    """

    m1: tuple
    m2: tuple
    mu: tuple
    input_sizes: tuple
    output_size: int
    _device_tensors: dict = field(default_factory=dict, repr=False)
    _groupings: dict = field(default_factory=dict, repr=False)  # derived data: groupings, swapped rules
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def nnz(self) -> int:
        return len(self.m1)

    @property
    def key(self) -> tuple:
        return (self.m1, self.m2, self.mu, self.input_sizes, self.output_size)

    def numpy(self) -> tuple:
        """``(m1, m2, mu)`` as contiguous int64 numpy arrays."""
        return self.tensors(torch.device("cpu"))[3]

    def tensors(self, device: torch.device) -> tuple:
        """``(m1, m2, mu, numpy_triple)``: int64 tensors on ``device`` (cached) and the numpy triple."""
        device = torch.device(device)
        with self._lock:
            cached = self._device_tensors.get(device)
            if cached is None:
                arrays = tuple(np.asarray(a, dtype=np.int64) for a in (self.m1, self.m2, self.mu))
                cached = tuple(torch.from_numpy(a).to(device) for a in arrays) + (arrays,)
                self._device_tensors[device] = cached
        return cached

    def grouped_by(self, name: str) -> tuple:
        """``(order, starts)``: a stable permutation sorting the nonzeros by index array ``name`` ("m1", "m2"
        or "mu"), and offsets such that group ``j`` (value ``j``) is ``order[starts[j]:starts[j + 1]]``."""
        with self._lock:
            cached = self._groupings.get(name)
        if cached is None:
            M1, M2 = self.input_sizes
            sizes = {"m1": M1, "m2": M2, "mu": self.output_size}
            values = np.asarray(getattr(self, name), dtype=np.int64)
            order = np.argsort(values, kind="stable")
            starts = np.searchsorted(values[order], np.arange(sizes[name] + 1)).astype(np.int64)
            cached = (order, starts)
            with self._lock:
                self._groupings[name] = cached
        return cached

    def swapped(self, role: str) -> "PreparedRule":
        """The rule of a gradient: ``role="X1"`` swaps m1 and mu (dX1), ``role="X2"`` swaps m2 and mu (dX2)."""
        M1, M2 = self.input_sizes
        with self._lock:
            cached = self._groupings.get(("swapped", role))
        if cached is not None:
            return cached
        if role == "X1":
            cached = _prepared_from_tuples(self.mu, self.m2, self.m1, (self.output_size, M2), M1)
        elif role == "X2":
            cached = _prepared_from_tuples(self.m1, self.mu, self.m2, (M1, self.output_size), M2)
        else:
            raise ValueError(f"role must be 'X1' or 'X2', got {role!r}")
        with self._lock:
            self._groupings[("swapped", role)] = cached
        return cached


_swapped_cache: "OrderedDict[tuple, PreparedRule]" = OrderedDict()
_cache: "OrderedDict[tuple, tuple]" = OrderedDict()
_cache_lock = threading.Lock()


def _prepared_from_tuples(m1, m2, mu, input_sizes, output_size) -> PreparedRule:
    key = (m1, m2, mu, input_sizes, output_size)
    with _cache_lock:
        rule = _swapped_cache.get(key)
        if rule is not None:
            _swapped_cache.move_to_end(key)
            return rule
    rule = PreparedRule(m1, m2, mu, input_sizes, output_size)
    with _cache_lock:
        _swapped_cache[key] = rule
        while len(_swapped_cache) > _CACHE_SIZE:
            _swapped_cache.popitem(last=False)
    return rule


def _check_range(name: str, values: np.ndarray, size: int, size_name: str) -> None:
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0:
        raise IndexError(f"{name} contains a negative index ({low}); indices must lie in [0, {size_name}={size})")
    if high >= size:
        raise IndexError(f"{name} contains index {high}, out of range for {size_name}={size}")


def prepare_rule(m1: torch.Tensor, m2: torch.Tensor, mu: torch.Tensor, M1: int, M2: int,
                 output_size: int) -> PreparedRule:
    """Validate index tensors against the sizes they address and return the (cached) prepared rule.

    Args:
        m1, m2, mu: 1-D integer tensors of equal length, on any device (any order, duplicates allowed).
        M1, M2: sizes of the active dimension of X1 and X2.
        output_size: size of the active dimension of the output.

    Raises:
        IndexError: an index is negative or not below the size it addresses.
        ValueError: the arrays are not 1-D or differ in length.
        TypeError: an index tensor is not of an integer dtype.
    """
    tensors = (("m1", m1), ("m2", m2), ("mu", mu))
    key = tuple((id(t), t._version) for _, t in tensors) + (M1, M2, output_size)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and all(ref() is t for ref, (_, t) in zip(hit[0], tensors)):
            _cache.move_to_end(key)
            return hit[1]

    for name, t in tensors:
        check_index_tensor(name, t)
    if not (m1.shape[0] == m2.shape[0] == mu.shape[0]):
        raise ValueError(
            f"m1, m2 and mu must have the same length, got {m1.shape[0]}, {m2.shape[0]} and {mu.shape[0]}")
    arrays = [t.detach().to("cpu", torch.int64).numpy() for _, t in tensors]
    _check_range("m1", arrays[0], M1, "X1.shape[-1]")
    _check_range("m2", arrays[1], M2, "X2.shape[-1]")
    _check_range("mu", arrays[2], output_size, "output_size")
    rule = _prepared_from_tuples(*(tuple(a.tolist()) for a in arrays), (M1, M2), output_size)

    with _cache_lock:
        _cache[key] = (tuple(weakref.ref(t) for _, t in tensors), rule)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return rule


def check_index_tensor(name: str, t) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``t`` is a 1-D integer tensor (no value checks)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
