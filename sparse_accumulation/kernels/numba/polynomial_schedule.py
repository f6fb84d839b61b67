"""The order of operations of a polynomial kernel: products shared between terms, in steps of two factors.

A group is a set of output components computed together. Its terms are split into two factor lists: the
factors of the *primary* operand (the lane operand with the most factors, e.g. the features ``x``) and the
others (weights, cotangents). Terms are sorted by one list, then the other, and each list's running products
are kept on a stack, so consecutive terms that share a prefix share its products (``x_i x_j`` for every
``x_i x_j x_l``, the monomial for every component it feeds): the steps walk a trie depth first and hold only
the current path. Every term ends in one multiply-add ``acc += coefficient * u * v``. Of the two orders (primary
factors first or last) the one with fewer steps is kept.

Steps name values by reference: ``("f", s, m)`` component ``m`` of operand ``s``, ``("t", i)`` stack slot
``i`` (its latest value), ``("1",)`` the constant one.
"""
from __future__ import annotations

from typing import NamedTuple

ONE = ("1",)


class Step(NamedTuple):
    """``op == "mul"``: slot ``target`` becomes ``a * b``; ``op == "acc"``: accumulator ``target`` gains
    ``coefficient * a * b``."""

    op: str
    target: int
    a: tuple
    b: tuple
    coefficient: float


class Group(NamedTuple):
    """``accumulators``: the ``(output, component)`` of each accumulator; ``steps``; ``factors``: the
    ``(operand, component)`` pairs the steps read; ``slots``: stack slots used."""

    accumulators: tuple
    steps: tuple
    factors: tuple
    slots: int


def _primary(terms, program) -> int:
    counts = {}
    for _, _, _, factors in terms:
        for s, _ in factors:
            if program.operands[s].kind == "lane":
                counts[s] = counts.get(s, 0) + 1
    return max(counts, key=lambda s: (counts[s], -s)) if counts else -1


def _steps(terms, primary: int, primary_first: bool) -> tuple:
    """Steps and stack slots of ``terms`` ``(accumulator, coefficient, factors)``."""
    split = []
    for acc, coefficient, factors in terms:
        mine = tuple(f for f in factors if f[0] == primary)
        others = tuple(f for f in factors if f[0] != primary)
        first, second = (mine, others) if primary_first else (others, mine)
        split.append((first, second, acc, coefficient))
    split.sort()
    depth = max((len(first) for first, _, _, _ in split), default=0)
    stacks = ([], [])  # per list: [(factor, ref)]
    bases = (0, depth)
    steps = []

    def walk(which: int, factors: tuple) -> tuple:
        """Push the running products of ``factors`` (reusing the common prefix); the full product's ref."""
        stack = stacks[which]
        common = 0
        while common < min(len(stack), len(factors)) and stack[common][0] == factors[common]:
            common += 1
        del stack[common:]
        for factor in factors[common:]:
            ref = ("f",) + factor
            if stack:
                slot = bases[which] + len(stack)
                steps.append(Step("mul", slot, stack[-1][1], ref, 1.0))
                ref = ("t", slot)
            stack.append((factor, ref))
        return stack[-1][1] if stack else ONE

    for first, second, acc, coefficient in split:
        if first and second:
            u = walk(0, first)
            v = ("f",) + second[0] if len(second) == 1 else walk(1, second)
        elif first:
            u = walk(0, first[:-1]) if len(first) > 1 else ONE
            v = ("f",) + first[-1]
        else:
            u = walk(1, second[:-1]) if len(second) > 1 else ONE
            v = ("f",) + second[-1]
        steps.append(Step("acc", acc, u, v, coefficient))
    slots = 1 + max((s.target for s in steps if s.op == "mul"), default=-1)
    return tuple(steps), slots


def group(program, accumulators) -> Group:
    """The :class:`Group` computing ``accumulators`` (a sequence of ``(output, component)``) of ``program``."""
    accumulators = tuple(accumulators)
    index = {a: i for i, a in enumerate(accumulators)}
    terms = [(index[(j, c)], coefficient, factors) for j, output_terms in enumerate(program.terms)
             for c, coefficient, factors in output_terms if (j, c) in index]
    primary = _primary([(None,) + t for t in terms], program)
    candidates = [_steps(terms, primary, first) for first in (True, False)]
    steps, slots = min(candidates, key=lambda c: len(c[0]))
    factors = tuple(sorted({f for _, _, fs in terms for f in fs}))
    return Group(accumulators, steps, factors, slots)
