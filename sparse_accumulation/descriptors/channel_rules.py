"""Channel rules: a rule applied to every channel of a row, with the columns of each operand placed by a map.

The graph accumulation (:mod:`sparse_accumulation.ops.graph`) computes, for every edge ``e`` and channel
``b < channels``::

    out[row_out(e), col_out(mu[k], b)] += X1[row_1(e), col_1(m1[k], b)] * X2[row_2(e), col_2(m2[k], b)]
                                          * W[row_w(e), col_w(w[k], b)] * C[k]

on 2-D operands ``[rows, width]``. A :class:`ColumnMap` places component ``m`` of channel ``b`` of an operand
at column ``base[m] + b * step[m]`` of its row: ``step = M`` for a contiguous ``[rows, channels, M]`` operand,
``step = 0`` for one that every channel shares (``[rows, 1, M]``: its gradient is summed over the channels),
and per irrep block for e3nn's ``mul x ir`` layout, which is therefore read and written in place. A column
``base = -1`` reads as the constant 1 (a weight column of instructions without weights).

A :class:`ChannelRule` is a :class:`~sparse_accumulation.Rule` (the rule of ONE channel) with the
channel count and the maps of X1, X2, W (weighted rules) and the output. Like rules, channel rules are
immutable and interned, and their :attr:`~ChannelRule.key` names them in the registered ops; the rule of a
gradient is :meth:`ChannelRule.swapped`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import numpy as np

from .interning import Descriptor
from .rules import Rule

#: ``base`` of a column that reads as the constant 1
ONE = -1
SLOTS = ("X1", "X2", "W", "out")


class ColumnMap(NamedTuple):
    """Where component ``m`` of channel ``b`` lies in a row of ``width`` elements: ``base[m] + b * step[m]``
    (``base[m] == ONE``: the constant 1, never read)."""

    base: tuple
    step: tuple
    width: int

    @property
    def size(self) -> int:
        """Number of components (the rule's operand size)."""
        return len(self.base)

    @property
    def shared(self) -> bool:
        """Every channel reads the same columns (all steps 0)."""
        return not any(self.step)

    def columns(self, channels: int) -> np.ndarray:
        """``[size, channels]`` int64 array of the columns (``ONE`` for constant columns)."""
        base, step = np.asarray(self.base, np.int64), np.asarray(self.step, np.int64)
        cols = base[:, None] + step[:, None] * np.arange(channels)[None, :]
        cols[base == ONE] = ONE
        return cols

    def covers(self, channels: int) -> bool:
        """Whether the map writes every column of a row (else an output must start from zeros); remembered per
        map and channel count (kernels ask on every call)."""
        return _covers(self, channels)


@functools.lru_cache(maxsize=4096)
def _covers(column_map: ColumnMap, channels: int) -> bool:
    cols = column_map.columns(channels)
    return np.unique(cols[cols != ONE]).size == column_map.width


def contiguous_map(size: int, channels: int) -> ColumnMap:
    """The map of a contiguous ``[rows, channels, size]`` operand viewed as ``[rows, channels * size]``;
    ``channels == 1`` gives a map shared by every channel."""
    step = size if channels > 1 else 0
    return ColumnMap(tuple(range(size)), (step,) * size, channels * size)


def check_map(name: str, column_map: ColumnMap, size: int, channels: int, output: bool) -> None:
    """Raise ``ValueError`` unless ``column_map`` places ``size`` components of ``channels`` channels inside
    its row (and, for an output, no two (component, channel) pairs of different components on one column)."""
    if len(column_map.base) != size or len(column_map.step) != size:
        raise ValueError(f"the column map of {name} must have {size} entries, got {len(column_map.base)}")
    cols = column_map.columns(channels)
    real = cols[cols != ONE]
    if real.size and (real.min() < 0 or real.max() >= column_map.width):
        raise ValueError(f"the column map of {name} reaches outside its rows of width {column_map.width}")
    if output:
        if (cols == ONE).any():
            raise ValueError(f"the output map of {name} cannot hold constant columns")
        owner = {}
        for m in range(size):
            for c in np.unique(cols[m]):
                if owner.setdefault(int(c), m) != m:
                    raise ValueError(f"the output map of {name} puts components {owner[int(c)]} and {m} on "
                                     f"column {int(c)}")


def _encode_map(column_map: Optional[ColumnMap]) -> str:
    if column_map is None:
        return "-"
    return f"{column_map.width}/" + ",".join(f"{b}+{s}" for b, s in zip(column_map.base, column_map.step))


class ChannelRule(Descriptor):
    """A rule applied per channel, with the column maps of its operands; build once, share between calls.

    Args:
        rule: the :class:`~sparse_accumulation.Rule` of one channel.
        channels: number of channels ``B`` (>= 1).
        maps: ``(X1, X2, W, out)`` :class:`ColumnMap` s (W None for a rule without weights), sized
            ``rule.input_sizes``, ``rule.weight_size`` and ``rule.output_size``.
        coefficients: constant coefficients (``rule.nnz`` floats) that GPU kernels may compile in instead of
            reading ``C``; every call must then pass ``C`` equal to them (in its dtype). None: ``C`` is data.

    Raises:
        TypeError: ``rule`` is not a Rule.
        ValueError: a map of the wrong size, reaching outside its rows, or an output map that sends two
            components to one column; W's map missing for a weighted rule or given for an unweighted one.
    """

    def __new__(cls, rule: Rule, channels: int, maps, coefficients=None):
        if not isinstance(rule, Rule):
            raise TypeError(f"rule must be a sparse_accumulation.Rule, got {type(rule).__name__}")
        if isinstance(channels, bool) or not isinstance(channels, (int, np.integer)) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        maps = tuple(maps)
        if len(maps) != 4:
            raise ValueError(f"maps must be (X1, X2, W, out), got {len(maps)} entries")
        if (maps[2] is None) == rule.weighted:
            raise ValueError("W's map is required for a weighted rule" if rule.weighted
                             else "W's map was given but the rule has no weights")
        sizes = (*rule.input_sizes, rule.weight_size, rule.output_size)
        for name, column_map, size in zip(SLOTS, maps, sizes):
            if column_map is not None:
                check_map(name, column_map, size, int(channels), name == "out")
        if coefficients is not None:
            coefficients = tuple(float(c) for c in np.asarray(coefficients, dtype=np.float64).ravel())
            if len(coefficients) != rule.nnz:
                raise ValueError(f"coefficients must hold one value per nonzero ({rule.nnz}), got {len(coefficients)}")
        return cls._intern(rule, int(channels), maps, coefficients)

    @classmethod
    def _intern(cls, rule: Rule, channels: int, maps: tuple, coefficients=None) -> "ChannelRule":
        values = "" if coefficients is None else ",".join(c.hex() for c in coefficients)
        key = f"c1:{channels}:" + ";".join(_encode_map(m) for m in maps) + f":{values}:" + rule.key
        return cls._interned(key, rule=rule, channels=channels, maps=maps, coefficients=coefficients)

    @classmethod
    def _decode(cls, key: str) -> "ChannelRule":
        try:
            version, channels, maps, values, rule_key = key.split(":", 4)
            if version != "c1":
                raise ValueError
            decoded = []
            for text in maps.split(";"):
                if text == "-":
                    decoded.append(None)
                    continue
                width, _, entries = text.partition("/")
                pairs = [e.rsplit("+", 1) for e in entries.split(",")] if entries else []
                decoded.append(ColumnMap(tuple(int(b) for b, _ in pairs), tuple(int(s) for _, s in pairs),
                                         int(width)))
            coefficients = [float.fromhex(v) for v in values.split(",")] if values else None
            return cls(Rule.from_key(rule_key), int(channels), decoded, coefficients)
        except (ValueError, TypeError):
            raise ValueError(f"not a channel rule key: {key[:60]!r}") from None

    @classmethod
    def regular(cls, rule: Rule, channels: int, operand_channels) -> "ChannelRule":
        """The channel rule of contiguous ``[rows, B_i, M_i]`` operands (``B_i`` in ``operand_channels``, one
        per slot X1, X2, W, out, each ``channels`` or 1; W's ignored without weights)."""
        sizes = (*rule.input_sizes, rule.weight_size, rule.output_size)
        maps = [None if size is None else contiguous_map(size, b) for size, b in zip(sizes, operand_channels)]
        return cls(rule, channels, maps)

    def __repr__(self) -> str:
        widths = ", ".join(f"{n}={m.width}" for n, m in zip(SLOTS, self.maps) if m is not None)
        return f"ChannelRule(nnz={self.rule.nnz}, channels={self.channels}, widths: {widths})"

    @property
    def weighted(self) -> bool:
        return self.rule.weighted

    def swapped(self, role: str) -> "ChannelRule":
        """The channel rule of the gradient of operand ``role`` ("X1", "X2" or "W"): the rule with that slot
        and the output trading places, and their maps with them."""
        def build():
            slot = SLOTS.index(role)
            maps = list(self.maps)
            maps[slot], maps[3] = maps[3], maps[slot]
            return ChannelRule._intern(self.rule.swapped(role), self.channels, tuple(maps), self.coefficients)

        return self.cached(("swapped", role), build)

    def with_data_coefficients(self) -> "ChannelRule":
        """The same rule with ``C`` read as data (no constant coefficients)."""
        if self.coefficients is None:
            return self
        return ChannelRule._intern(self.rule, self.channels, self.maps)

    def with_zero_constants(self) -> "ChannelRule":
        """The rule with each constant W column read from one more column, ``width_w``, of W: the W slot then
        holds a gradient padded with a zero column (the gradient of a constant 1 is 0, not 1)."""
        def build():
            w = self.maps[2]
            base = tuple(w.width if b == ONE else b for b in w.base)
            step = tuple(0 if b == ONE else t for b, t in zip(w.base, w.step))
            maps = self.maps[:2] + (ColumnMap(base, step, w.width + 1),) + self.maps[3:]
            return ChannelRule._intern(self.rule, self.channels, maps, self.coefficients)

        return self.cached("zero constants", build)

    def flat(self) -> tuple:
        """``(rule, C index)``: the rule of all channels at once on the rows' own columns (one nonzero per
        nonzero and channel; a constant W column becomes column ``width_w`` of a W extended by a column of
        ones), and for each of its nonzeros the nonzero of this rule it copies."""
        def build():
            B, rule = self.channels, self.rule
            nnz = rule.nnz
            index = np.repeat(np.arange(nnz), B)
            arrays = []
            for name, column_map in zip(("m1", "m2", "w", "mu"), self.maps):
                if column_map is None:
                    arrays.append(None)
                    continue
                cols = column_map.columns(B)[rule.array(name)].ravel()
                if name == "w":
                    cols = np.where(cols == ONE, column_map.width, cols)
                arrays.append(cols)
            widths = [m.width if m is not None else None for m in self.maps]
            extra = {}
            if rule.weighted:
                ones = (self.maps[2].columns(B) == ONE).any()
                extra = {"w": arrays[2], "weight_size": widths[2] + int(ones)}
            flat = Rule(arrays[0], arrays[1], arrays[3], widths[3], input_sizes=(widths[0], widths[1]), **extra)
            return flat, index

        return self.cached("flat", build)

    def writes_every_column(self, slot: int) -> bool:
        """Whether an output in ``slot`` gets a value in every column of its rows (else it starts from zeros):
        its map covers the row and every component receives some nonzero."""
        def build():
            name = ("m1", "m2", "w", "mu")[slot]
            column_map = self.maps[slot]
            return column_map.covers(self.channels) and len(set(getattr(self.rule, name))) == column_map.size

        return self.cached(("writes", slot), build)

    @property
    def has_constant_weights(self) -> bool:
        """Whether some W column reads as the constant 1."""
        return self.maps[2] is not None and ONE in self.maps[2].base
