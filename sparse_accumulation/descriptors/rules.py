"""Rules: the index part of a sparse accumulation, validated once and shared by every call that uses it.

A rule holds the index arrays of

    out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * W[..., w[k]] * C[k]

(``w`` and ``W`` only for weighted rules) and the sizes they address. The coefficients ``C`` are data and are
never part of a rule. A :class:`Rule` is immutable and interned: building the same rule twice returns the same
object, and :attr:`Rule.key`, a string that encodes the whole rule, names it in the registered ops (so
``torch.compile`` and ``torch.export`` see a constant, and no index value is read on any call).

The tensor API (``accumulate(X1, X2, mu, output_size, m1, m2, C)``) turns its index tensors into a rule with
:func:`sparse_accumulation.indices.prepare_rule`, which reads their values once and then finds the rule again
by the tensors' identity and version counter.
"""
from __future__ import annotations

import sys

import numpy as np

from .interning import Descriptor

_ROLES = ("X1", "X2", "W")


def check_index_tensor(name: str, t) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``t`` is a 1-D integer torch tensor (no value checks; torch is
    not imported here: a tensor exists only where it was)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")


def _as_index_tuple(name: str, values) -> tuple:
    """Index values as a tuple of Python ints, from a tensor (any device), an array or a sequence."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        check_index_tensor(name, values)
        return tuple(int(v) for v in values.detach().cpu().tolist())
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    return tuple(int(v) for v in array.tolist())


def _check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def _check_range(name: str, values: tuple, size: int, size_name: str) -> None:
    if not values:
        return
    low, high = min(values), max(values)
    if low < 0:
        raise IndexError(f"{name} contains a negative index ({low}); indices must lie in [0, {size_name}={size})")
    if high >= size:
        raise IndexError(f"{name} contains index {high}, out of range for {size_name}={size}")


def _encode(m1, m2, mu, w, input_sizes, output_size, weight_size) -> str:
    sizes = f"{input_sizes[0]},{input_sizes[1]},{output_size}" + ("" if w is None else f",{weight_size}")
    arrays = (m1, m2, mu) if w is None else (m1, m2, mu, w)
    return "v1:" + sizes + ":" + ";".join(",".join(map(str, a)) for a in arrays)


class Rule(Descriptor):
    """The index arrays of a sparse accumulation and the sizes they address; build once, use for every call.

    ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]``, or with a third, weight operand ``W``
    (``w`` given) ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * W[..., w[k]] * C[k]``.

    Args:
        m1, m2, mu: indices into X1, X2 and the output, one per nonzero (1-D integer tensors on any device,
            numpy arrays or sequences of ints; any order, duplicates allowed). Read once, here.
        output_size: size of the output's active dimension (``mu < output_size``).
        input_sizes: ``(M1, M2)``, sizes of the active dimensions of X1 and X2 (default: the largest index
            plus one).
        w: indices into the weight operand W (weighted rules only).
        weight_size: size of W's active dimension (default: the largest ``w`` plus one).

    Rules are immutable and interned (equal arguments give the same object); they pickle and deep-copy by
    :attr:`key`, a string that encodes the whole rule.

    Raises:
        TypeError: an index array is not of an integer type.
        ValueError: index arrays of different lengths or not 1-D, a negative or non-integer size.
        IndexError: an index is negative or not below the size it addresses.
    """

    def __new__(cls, m1, m2, mu, output_size, *, input_sizes=None, w=None, weight_size=None):
        m1, m2, mu = (_as_index_tuple(name, a) for name, a in (("m1", m1), ("m2", m2), ("mu", mu)))
        w = None if w is None else _as_index_tuple("w", w)
        lengths = [len(m1), len(m2), len(mu)] + ([] if w is None else [len(w)])
        if len(set(lengths)) != 1:
            names = "m1, m2, mu" + ("" if w is None else ", w")
            raise ValueError(f"{names} must have the same length, got {', '.join(map(str, lengths))}")
        output_size = _check_size("output_size", output_size)
        if input_sizes is None:
            input_sizes = (max(m1, default=-1) + 1, max(m2, default=-1) + 1)
        if len(tuple(input_sizes)) != 2:
            raise ValueError(f"input_sizes must be a pair (M1, M2), got {input_sizes!r}")
        input_sizes = tuple(_check_size("input_sizes entry", s) for s in input_sizes)
        if w is None:
            if weight_size is not None:
                raise ValueError("weight_size is given but w is not")
        else:
            weight_size = max(w, default=-1) + 1 if weight_size is None else _check_size("weight_size", weight_size)
        _check_range("m1", m1, input_sizes[0], "M1")
        _check_range("m2", m2, input_sizes[1], "M2")
        _check_range("mu", mu, output_size, "output_size")
        if w is not None:
            _check_range("w", w, weight_size, "weight_size")
        return cls._intern(m1, m2, mu, w, input_sizes, output_size, weight_size)

    @classmethod
    def _intern(cls, m1, m2, mu, w, input_sizes, output_size, weight_size) -> "Rule":
        """The rule of already checked tuples: the living one with the same key, or a new one."""
        key = _encode(m1, m2, mu, w, input_sizes, output_size, weight_size)
        return cls._interned(key, m1=m1, m2=m2, mu=mu, w=w, input_sizes=input_sizes, output_size=output_size,
                             weight_size=weight_size)

    @classmethod
    def _decode(cls, key: str) -> "Rule":
        try:
            version, sizes, arrays = key.split(":")
            if version != "v1":
                raise ValueError
            sizes = [int(s) for s in sizes.split(",")]
            arrays = [tuple(int(v) for v in a.split(",")) if a else () for a in arrays.split(";")]
            if len(sizes) != len(arrays) or len(arrays) not in (3, 4):
                raise ValueError
        except ValueError:
            raise ValueError(f"not a sparse accumulation rule key: {key[:60]!r}") from None
        w, weight_size = (arrays[3], sizes[3]) if len(arrays) == 4 else (None, None)
        return cls(*arrays[:3], sizes[2], input_sizes=sizes[:2], w=w, weight_size=weight_size)

    def __repr__(self) -> str:
        weights = "" if self.w is None else f", weight_size={self.weight_size}"
        return (f"Rule(nnz={self.nnz}, input_sizes={self.input_sizes}, output_size={self.output_size}"
                f"{weights})")

    @property
    def nnz(self) -> int:
        """Number of nonzeros (entries of each index array)."""
        return len(self.m1)

    @property
    def weighted(self) -> bool:
        """Whether the rule has a weight operand (``w``)."""
        return self.w is not None

    def _size_of(self, name: str) -> int:
        sizes = {"m1": self.input_sizes[0], "m2": self.input_sizes[1], "mu": self.output_size,
                 "w": self.weight_size}
        if name not in sizes or (name == "w" and self.w is None):
            raise ValueError(f"index array name must be one of m1, m2, mu{', w' if self.w else ''}, got {name!r}")
        return sizes[name]

    def array(self, name: str) -> np.ndarray:
        """Index array ``name`` ("m1", "m2", "mu" or "w") as a read-only int64 numpy array."""
        self._size_of(name)

        def build():
            array = np.asarray(getattr(self, name), dtype=np.int64)
            array.setflags(write=False)
            return array

        return self.cached(("array", name), build)

    def tensor(self, name: str, device):
        """Index array ``name`` as an int64 torch tensor on ``device`` (made once per device, then cached)."""
        import torch

        device = torch.device(device)
        return self.cached(("tensor", name, device), lambda: torch.from_numpy(self.array(name).copy()).to(device))

    def grouped_by(self, name: str) -> tuple:
        """``(order, starts)``: a stable permutation sorting the nonzeros by index array ``name``, and offsets
        such that group ``j`` (the nonzeros with index ``j``) is ``order[starts[j]:starts[j + 1]]``."""
        size = self._size_of(name)

        def build():
            values = self.array(name)
            order = np.argsort(values, kind="stable")
            starts = np.searchsorted(values[order], np.arange(size + 1)).astype(np.int64)
            order.setflags(write=False)
            starts.setflags(write=False)
            return order, starts

        return self.cached(("grouped", name), build)

    def swapped(self, role: str) -> "Rule":
        """The rule of a gradient, with operand ``role`` and the output trading places.

        ``"X1"``: ``dX1[m1] += G[mu] X2[m2] (W[w]) C``, the rule ``(mu, m2, [w]) -> m1`` on ``(G, X2, [W])``;
        ``"X2"``: ``(m1, mu, [w]) -> m2`` on ``(X1, G, [W])``; ``"W"``: ``(m1, m2, mu) -> w`` on ``(X1, X2, G)``.
        """
        if role not in _ROLES or (role == "W" and self.w is None):
            raise ValueError(f"role must be one of {_ROLES if self.w is not None else _ROLES[:2]}, got {role!r}")

        def build():
            M1, M2 = self.input_sizes
            O, Mw = self.output_size, self.weight_size
            if role == "X1":
                return Rule._intern(self.mu, self.m2, self.m1, self.w, (O, M2), M1, Mw)
            if role == "X2":
                return Rule._intern(self.m1, self.mu, self.m2, self.w, (M1, O), M2, Mw)
            return Rule._intern(self.m1, self.m2, self.w, self.mu, (M1, M2), Mw, O)

        return self.cached(("swapped", role), build)
