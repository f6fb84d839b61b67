"""What the generators of Triton source share (plain Python: no triton import here): a line buffer for the
generated code, powers of two, and factored sums of products.

Each operation's generator (:mod:`.accumulate_source`, :mod:`.graph_source`, :mod:`.polynomial_source`) writes
its kernels with these; :mod:`.build` turns the text into Triton kernels.
"""
from __future__ import annotations


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class Code:
    """Lines of generated source; ``indent`` defaults to ``base`` levels of four spaces."""

    def __init__(self, base: int = 1):
        self.lines = []
        self.base = base

    def __call__(self, line: str = "", indent: int = None) -> None:
        indent = self.base if indent is None else indent
        self.lines.append("    " * indent + line if line else "")

    def extend(self, other: "Code", levels: int = 0) -> None:
        self.lines += ["    " * levels + line if line else line for line in other.lines]

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def factored_sum(terms, acc: str, coefficient=None) -> str:
    """An expression for ``sum over terms (k, factors) of prod(factors) * C[k]`` that takes out, recursively,
    the factor position with the fewest distinct vectors: ``x * (y1 * C[k1] + y2 * C[k2])`` costs one
    multiply-add per nonzero plus one per distinct factor instead of one per factor and nonzero.
    ``coefficient(k)``: the expression of ``C[k]`` (default: a load from ``C``)."""
    if not terms[0][1]:
        return " + ".join(coefficient(k) if coefficient else f"tl.load(C + {k}).to({acc})" for k, _ in terms)
    width = len(terms[0][1])
    position = min(range(width), key=lambda p: (len({f[p] for _, f in terms}), p))
    groups = {}
    for k, factors in terms:
        rest = factors[:position] + factors[position + 1:]
        groups.setdefault(factors[position], []).append((k, rest))
    parts = []
    for vector, group in groups.items():
        inner = factored_sum(group, acc, coefficient)
        parts.append(f"{vector} * ({inner})" if " + " in inner else f"{vector} * {inner}")
    return " + ".join(parts)
