"""Element-weighted polynomials: sums of products of per-node features and per-element weights, and every
derivative of them.

A :class:`Program` computes, for every node ``n`` and channel ``b`` (a *lane*), outputs that are sums of
terms::

    out_j[row, column(component, b)] += coefficient * prod over factors (s, m) of operand_s[row_s, column(m, b)]

Each operand and output is a :class:`Slot`: a *lane* slot has one row per node (``row_s = n``), an *element*
slot one row per element (``row_s = element[n]``: weights gathered by the node's element). A lane output gets
its node's sum; an element output the sum over the nodes of that element. Components sit in a row at
``base[m] + b * step[m]`` (a :class:`~sparse_accumulation.descriptors.channel_rules.ColumnMap`).

The derivative of a program with respect to some operands, given cotangents of its outputs, is again a
program (:meth:`Program.derivative`): each factor of an operand differentiated is replaced by the cotangent of
the term's output, and the term goes to the gradient of that operand. So the family is closed under
differentiation to any order, and one kernel generator serves them all.

MACE's symmetric contraction is the program with operands ``x`` (lane) and ``P`` (element: per-element
weights of every monomial) and terms ``P[t] * x[i] * x[j] * x[l]``; its backward computes ``dx`` (lane) and
``dP`` (element), and its double backward the derivatives of those.

Programs are immutable and interned; :attr:`Program.key` names one in the registered ops. A key encodes the
whole program (compressed), so :meth:`Program.from_key` finds it, or rebuilds it in a process that never made
it (a compiled graph loaded from a warm cache).
"""
from __future__ import annotations

import base64
import binascii
import zlib
from typing import NamedTuple

import numpy as np

from .channel_rules import ColumnMap
from .interning import Descriptor

LANE, ELEMENT = "lane", "element"
KINDS = (LANE, ELEMENT)


class Slot(NamedTuple):
    """An operand or output: ``kind`` (``"lane"``: a row per node, ``"element"``: a row per element) and the
    :class:`~sparse_accumulation.descriptors.channel_rules.ColumnMap` of its components in a row."""

    kind: str
    map: ColumnMap

    @property
    def size(self) -> int:
        return self.map.size

    @property
    def width(self) -> int:
        return self.map.width


def lane_slot(size: int, channels: int) -> Slot:
    """A lane slot ``[nodes, channels, size]`` viewed as ``[nodes, channels * size]``."""
    return Slot(LANE, ColumnMap(tuple(range(size)), (size,) * size, channels * size))


def element_slot(size: int, channels: int) -> Slot:
    """An element slot ``[elements, size, channels]`` viewed as ``[elements, size * channels]`` (channels
    contiguous)."""
    return Slot(ELEMENT, ColumnMap(tuple(m * channels for m in range(size)), (1,) * size, channels * size))


def _encode_slot(slot: Slot) -> str:
    return f"{slot.kind[0]}{slot.map.width}/" + ",".join(f"{b}+{s}" for b, s in zip(slot.map.base, slot.map.step))


def _decode_slots(text: str) -> tuple:
    slots = []
    for part in text.split(";") if text else ():
        head, pairs = part.split("/")
        kind = {"l": LANE, "e": ELEMENT}[head[0]]
        base_step = [tuple(int(v) for v in pair.split("+")) for pair in pairs.split(",")] if pairs else []
        slots.append(Slot(kind, ColumnMap(tuple(b for b, _ in base_step), tuple(s for _, s in base_step),
                                          int(head[1:]))))
    return tuple(slots)


def _decode_terms(text: str) -> list:
    terms = []
    for part in text.split(";") if text else ():
        component, value, factors = part.split(",")
        terms.append((int(component), float.fromhex(value),
                      [tuple(int(v) for v in f.split(":")) for f in factors.split(".")] if factors else []))
    return terms


def _canonical(terms) -> tuple:
    """Terms ``(component, coefficient, factors)`` with sorted factors, equal products merged, zeros dropped,
    in a fixed order."""
    merged = {}
    for component, coefficient, factors in terms:
        key = (int(component), tuple(sorted((int(s), int(m)) for s, m in factors)))
        merged[key] = merged.get(key, 0.0) + float(coefficient)
    return tuple((component, coefficient, factors) for (component, factors), coefficient in sorted(merged.items())
                 if coefficient != 0.0)


_KEY_PREFIX = "poly2:"


class Program(Descriptor):
    """Outputs that are sums of products of lane and element operands (see the module docstring).

    Args:
        channels: number of channels ``B`` (>= 1).
        operands: the :class:`Slot` of each operand.
        outputs: the :class:`Slot` of each output.
        terms: per output, a sequence of ``(component, coefficient, factors)``: the term adds
            ``coefficient * prod(operand_s[m] for (s, m) in factors)`` to the output's ``component``.

    Raises:
        ValueError: a slot of unknown kind or a map that does not fit the channels, a term with an out of range
            component, operand or factor, or no factor.
    """

    def __new__(cls, channels: int, operands, outputs, terms):
        if isinstance(channels, bool) or not isinstance(channels, (int, np.integer)) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        operands, outputs = tuple(operands), tuple(outputs)
        terms = tuple(terms)
        if len(terms) != len(outputs):
            raise ValueError(f"terms must hold one sequence per output ({len(outputs)}), got {len(terms)}")
        for name, slots in (("operand", operands), ("output", outputs)):
            for slot in slots:
                if not isinstance(slot, Slot) or slot.kind not in KINDS:
                    raise ValueError(f"every {name} must be a Slot of kind 'lane' or 'element', got {slot!r}")
                cols = slot.map.columns(int(channels))
                if cols.size and (cols.min() < 0 or cols.max() >= slot.map.width):
                    raise ValueError(f"an {name} map reaches outside its rows of width {slot.map.width}")
        canonical = []
        for j, output_terms in enumerate(terms):
            output_terms = _canonical(output_terms)
            for component, _, factors in output_terms:
                if not 0 <= component < outputs[j].size:
                    raise ValueError(f"a term of output {j} writes component {component} of {outputs[j].size}")
                if not factors:
                    raise ValueError(f"a term of output {j} has no factor")
                for s, m in factors:
                    if not 0 <= s < len(operands) or not 0 <= m < operands[s].size:
                        raise ValueError(f"a term of output {j} reads component {m} of operand {s}, which does "
                                         "not exist")
            canonical.append(output_terms)
        encoding = (f"{int(channels)}|" + ";".join(map(_encode_slot, operands)) + "|"
                    + ";".join(map(_encode_slot, outputs)) + "|"
                    + "/".join(";".join(f"{c},{v.hex()},{'.'.join(f'{s}:{m}' for s, m in f)}" for c, v, f in ts)
                               for ts in canonical))
        key = _KEY_PREFIX + base64.urlsafe_b64encode(zlib.compress(encoding.encode(), 9)).decode()
        return cls._interned(key, channels=int(channels), operands=operands, outputs=outputs,
                             terms=tuple(canonical))

    @classmethod
    def _decode(cls, key: str) -> "Program":
        try:
            if not key.startswith(_KEY_PREFIX):
                raise ValueError
            encoding = zlib.decompress(base64.urlsafe_b64decode(key[len(_KEY_PREFIX):].encode())).decode()
            channels, operands, outputs, terms = encoding.split("|")
            rebuilt = cls(int(channels), _decode_slots(operands), _decode_slots(outputs),
                          [_decode_terms(t) for t in terms.split("/")] if outputs else [])
        except (ValueError, TypeError, zlib.error, UnicodeDecodeError, binascii.Error):
            raise ValueError(f"not a polynomial program key: {key[:60]!r}") from None
        if rebuilt.key != key:
            raise ValueError(f"not a polynomial program key: {key[:60]!r}")
        return rebuilt

    def __repr__(self) -> str:
        kinds = lambda slots: ", ".join(f"{s.kind}[{s.size}]" for s in slots)  # noqa: E731
        return (f"Program(channels={self.channels}, operands: {kinds(self.operands)}; outputs: {kinds(self.outputs)};"
                f" terms={[len(t) for t in self.terms]})")

    def derivative(self, wrt, cotangents) -> "Program":
        """The program of the gradients of operands ``wrt`` given cotangents of the outputs.

        Its operands are this program's operands followed by one cotangent per output whose entry of
        ``cotangents`` is True (same slot as that output); its outputs are the gradients of the operands
        ``wrt``, in that order (same slots as those operands).
        """
        wrt, cotangents = tuple(int(s) for s in wrt), tuple(bool(c) for c in cotangents)
        if len(cotangents) != len(self.outputs):
            raise ValueError(f"cotangents must have one flag per output ({len(self.outputs)})")
        if any(not 0 <= s < len(self.operands) for s in wrt) or len(set(wrt)) != len(wrt):
            raise ValueError(f"wrt must list distinct operands of {len(self.operands)}, got {wrt}")

        def build():
            position = {}
            for j, present in enumerate(cotangents):
                if present:
                    position[j] = len(self.operands) + len(position)
            operands = self.operands + tuple(self.outputs[j] for j in position)
            target = {s: i for i, s in enumerate(wrt)}
            terms = [[] for _ in wrt]
            for j, output_terms in enumerate(self.terms):
                if j not in position:
                    continue
                for component, coefficient, factors in output_terms:
                    counts = {}
                    for factor in factors:
                        counts[factor] = counts.get(factor, 0) + 1
                    for (s, m), count in counts.items():
                        if s not in target:
                            continue
                        rest = list(factors)
                        rest.remove((s, m))
                        terms[target[s]].append((m, coefficient * count, rest + [(position[j], component)]))
            return Program(self.channels, operands, tuple(self.operands[s] for s in wrt), terms)

        return self.cached(("derivative", wrt, cotangents), build)

    def select(self, outputs) -> "Program":
        """The program of some of the outputs only (same operands)."""
        outputs = tuple(int(j) for j in outputs)
        return self.cached(("select", outputs), lambda: Program(
            self.channels, self.operands, tuple(self.outputs[j] for j in outputs), [self.terms[j] for j in outputs]))

    def uses(self, operand: int) -> bool:
        """Whether some term reads ``operand``."""
        return self.cached(("uses", operand), lambda: any(s == operand for ts in self.terms for _, _, f in ts
                                                           for s, _ in f))

    @property
    def flops(self) -> int:
        """Multiplications and additions of the terms as written (a measure of size, not of the kernels'
        work, which shares products between terms)."""
        return sum(len(f) + 1 for ts in self.terms for _, _, f in ts)
