"""Irreps as MACE spells them (``"128x0e+128x1o"``, e3nn ``Irreps`` objects), read without importing e3nn."""
from __future__ import annotations

import re
from typing import NamedTuple


class Irrep(NamedTuple):
    """An irreducible representation of O(3): degree ``l`` and parity ``p`` (+1 even, -1 odd). Sorted as e3nn
    sorts its ``Irrep`` tuples: by ``l``, then ``p`` (odd first)."""

    l: int
    p: int

    @property
    def dim(self) -> int:
        return 2 * self.l + 1

    def __str__(self) -> str:
        return f"{self.l}{'e' if self.p == 1 else 'o'}"


class MulIrrep(NamedTuple):
    """``mul`` copies of ``ir``."""

    mul: int
    ir: Irrep

    def __str__(self) -> str:
        return f"{self.mul}x{self.ir}"


_TERM = re.compile(r"^\s*(?:(\d+)\s*x\s*)?(\d+)\s*([eoy])\s*$")


def _irrep(value, name: str) -> Irrep:
    if isinstance(value, str):
        match = _TERM.match(value)
        if match is None or match.group(1) is not None:
            raise ValueError(f"{name}: {value!r} is not an irrep such as '1o'")
        l = int(match.group(2))
        return Irrep(l, 1 if match.group(3) == "e" or (match.group(3) == "y" and l % 2 == 0) else -1)
    try:
        l, p = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {value!r} is not an irrep (l, p)") from None
    if l < 0 or p not in (1, -1):
        raise ValueError(f"{name}: {value!r} is not an irrep (l >= 0, p = +1 or -1)")
    return Irrep(l, p)


def parse_irreps(value, name: str = "irreps") -> tuple:
    """``(MulIrrep, ...)`` of irreps given as a string (``"128x0e+128x1o"``, ``"0e + 1o"``), an e3nn
    ``Irreps`` or a sequence of ``(mul, (l, p))`` pairs.

    Raises:
        ValueError: a malformed string or entry (the message names ``name``).
    """
    if isinstance(value, str):
        terms = []
        for text in value.split("+"):
            if not text.strip():
                continue
            match = _TERM.match(text)
            if match is None:
                raise ValueError(f"{name}: {text.strip()!r} of {value!r} is not an irrep such as '128x1o'")
            mul = int(match.group(1)) if match.group(1) is not None else 1
            terms.append(MulIrrep(mul, _irrep(f"{match.group(2)}{match.group(3)}", name)))
        return tuple(terms)
    try:
        entries = list(value)
    except TypeError:
        raise TypeError(f"{name} must be a string, an e3nn Irreps or a sequence of (mul, (l, p)), "
                        f"got {type(value).__name__}") from None
    terms = []
    for entry in entries:
        try:
            mul, ir = entry
            mul = int(mul)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: {entry!r} is not a (mul, (l, p)) pair") from None
        if mul < 0:
            raise ValueError(f"{name}: multiplicity {mul} is negative")
        terms.append(MulIrrep(mul, _irrep(ir, name)))
    return tuple(terms)


def irreps_text(irreps) -> str:
    """The string of parsed irreps (``"128x0e+128x1o"``)."""
    return "+".join(str(term) for term in irreps)
