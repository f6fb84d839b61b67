"""Generation of the Triton source and tables of polynomial kernels (plain Python: no triton import here).

A kernel computes some outputs of a :class:`~sparse_accumulation.descriptors.programs.Program`, all lane outputs or
all element outputs. The terms are data, not code: they sit in tables (an int32 tensor ``TAB`` and the
coefficients ``COEF``), walked one term at a time by a loop whose code does not grow with the number of terms (a
straight-line kernel of a few thousand terms takes Triton minutes to compile).

The kernels are persistent: ``P`` programs (a few per multiprocessor) take work items ``w = pid, pid + P, ..``,
each a tile of nodes of one element (``TABLE``: the tile's element and its ``[start, end)`` in ``ORDER``) and a
block of ``BLOCK_C`` channels. Per group of ``SUB`` nodes the program copies every lane component its terms read
into its own slice of a scratch buffer ``SCR``, one contiguous ``[SUB, BLOCK_C]`` block per component (a
*column*; the last column holds ones), so that each factor of a term afterwards costs one coalesced load of the
block, served by the multiprocessor's L1 cache, whatever the operand's layout.

The terms of an accumulator (an output component) are contiguous in the tables (``AT``: each accumulator's range);
a term's entries ``W<f>`` pack its lane columns three to an int32, padded with the column of ones. The loop over
an accumulator's terms is unrolled (``LANE_UNROLL``, ``ELEMENT_UNROLL``), so that the loads of several terms are
in flight at once: a term costs a coalesced load per lane factor, a multiply each, and its element factor (a ``[BLOCK_C]`` row of
the tile's element, shared by the ``SUB`` nodes).

* lane outputs: the accumulator ``[SUB, BLOCK_C]`` is stored per node;
* element outputs: it is summed over the ``SUB`` nodes and added to the tile's row of a partial sum (summed
  afterwards over each element's tiles, in order: deterministic).

Terms with more than one element factor do not fit (:func:`fits`). Like the other generators, the code calls
only triton builtins.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from .codegen import Code, next_pow2

#: nodes a program handles at once (the rows of its ``[SUB, BLOCK_C]`` blocks) in lane and element kernels
LANE_SUB = 16
ELEMENT_SUB = 32
#: terms unrolled in the loop of a lane and of an element kernel (their loads issued together; an element
#: output's components rarely have more than a few terms, and unrolling lengthens compilation)
LANE_UNROLL = 8
ELEMENT_UNROLL = 2


def block_channels(channels: int) -> int:
    """Channels a program handles (a power of two, at most 32)."""
    return min(next_pow2(channels), 32)


def fits(program, outputs) -> bool:
    """Whether the tables can hold the terms of ``outputs``: at most one element factor per term, and outputs
    of one kind."""
    kinds = {program.outputs[j].kind for j in outputs}
    if len(kinds) != 1:
        return False
    return all(sum(program.operands[s].kind == "element" for s, _ in factors) <= 1
               for j in outputs for _, _, factors in program.terms[j])


class Tables(NamedTuple):
    """A kernel's tables: ``ints`` (int32) and ``coefficients`` (float64), ``offsets`` of each named table in
    ``ints``; ``sizes``: ``NCOL`` (scratch columns, the last one of ones), ``DEGREE`` (lane factors of a term),
    ``WORDS`` (int32 entries of a term's columns), ``NACC`` (accumulators), ``NTERMS`` (terms walked),
    ``ELEMENT`` (element outputs); ``columns``: per lane operand its
    ``[first, end)`` columns; the element operands read, the outputs."""

    ints: np.ndarray
    coefficients: np.ndarray
    offsets: dict
    sizes: dict
    columns: dict
    element_operands: tuple
    outputs: tuple


def _pack(cols) -> list:
    """Columns packed three to an int32 (10 bits each)."""
    return [sum(c << (10 * b) for b, c in enumerate(cols[i:i + 3])) for i in range(0, len(cols), 3)]


def tables(program, outputs) -> Tables:
    """The tables of the kernel computing ``outputs`` (all lane or all element outputs) of ``program``."""
    outputs = tuple(outputs)
    element_out = program.outputs[outputs[0]].kind == "element"
    accumulators = [(j, c) for j in outputs for c in range(program.outputs[j].size)]
    lane = lambda s: program.operands[s].kind == "lane"  # noqa: E731
    lane_factors = sorted({f for j in outputs for _, _, fs in program.terms[j] for f in fs if lane(f[0])})
    if len(lane_factors) >= 1023:
        raise ValueError("a polynomial kernel reads more than 1022 lane components")
    column = {f: i for i, f in enumerate(lane_factors)}
    one = len(lane_factors)
    degree = max([sum(lane(s) for s, _ in fs) for j in outputs for _, _, fs in program.terms[j]] + [1])
    words = len(_pack([one] * degree))
    named = {"AT": [0], "AO": [], "AB": [], "AS": [], "EO": [], "EB": [], "ES": []}
    named.update({f"W{f}": [] for f in range(words)})
    coefficients = []
    by_accumulator = {}
    for j in outputs:
        for c, coefficient, factors in program.terms[j]:
            by_accumulator.setdefault((j, c), []).append((coefficient, factors))
    for j, c in accumulators:
        # an accumulator without terms is written too (zeros): outputs need not start from zeros
        for coefficient, factors in by_accumulator.get((j, c), [(0.0, ())]):
            cols = sorted(column[f] for f in factors if lane(f[0]))
            for f, word in enumerate(_pack(cols + [one] * (degree - len(cols)))):
                named[f"W{f}"].append(word)
            element = [(s, m) for s, m in factors if not lane(s)]
            s, m = element[0] if element else (-1, None)
            named["EO"].append(s)
            named["EB"].append(program.operands[s].map.base[m] if element else 0)
            named["ES"].append(program.operands[s].map.step[m] if element else 0)
            coefficients.append(coefficient)
        named["AT"].append(len(coefficients))
        named["AO"].append(outputs.index(j))
        named["AB"].append(program.outputs[j].map.base[c])
        named["AS"].append(program.outputs[j].map.step[c])
    named["LB"] = [program.operands[s].map.base[m] for s, m in lane_factors]
    named["LS"] = [program.operands[s].map.step[m] for s, m in lane_factors]
    offsets, parts, total = {}, [], 0
    for name, values in named.items():
        offsets[name] = total
        parts.append(np.asarray(values, np.int64))
        total += len(values)
    ints = np.concatenate(parts)
    if ints.size and np.abs(ints).max() >= 2**31:
        raise ValueError("a polynomial kernel's table does not fit 32-bit integers")
    columns = {}
    for i, (s, _) in enumerate(lane_factors):
        first, _ = columns.get(s, (i, i))
        columns[s] = (first, i + 1)
    sizes = dict(NCOL=one + 1, DEGREE=degree, NACC=len(accumulators), WORDS=words, NTERMS=len(coefficients),
                 ELEMENT=element_out)
    element_operands = tuple(sorted({s for s in named["EO"] if s >= 0}))
    return Tables(ints.astype(np.int32), np.array(coefficients, np.float64), offsets, sizes, columns,
                  element_operands, outputs)


def parameters(found: Tables) -> tuple:
    """``(pointer names, int names)``: ``T<s>`` per operand read, ``TAB``, ``COEF``, ``ORDER``, ``TABLE``,
    ``SCR`` (scratch), ``D<j>`` per output (its position in the kernel's outputs); ints ``S<s>``, ``SD<j>``,
    ``NT`` (tiles), ``R_BUCKET``."""
    operands = sorted(tuple(found.columns) + found.element_operands)
    outputs = range(len(found.outputs))
    pointers = [f"T{s}" for s in operands] + ["TAB", "COEF", "ORDER", "TABLE", "SCR"] + [f"D{j}" for j in outputs]
    ints = [f"S{s}" for s in operands] + [f"SD{j}" for j in outputs] + ["NT", "R_BUCKET"]
    return pointers, ints


def sub_rows(found: Tables) -> int:
    """Nodes per ``[SUB, BLOCK_C]`` block of the kernel of ``found``."""
    return ELEMENT_SUB if found.sizes["ELEMENT"] else LANE_SUB


def kernel_source(name: str, found: Tables, channels: int, acc: str) -> tuple:
    """``(source, pointer names, int names)`` of the kernel ``name`` of the tables ``found``, accumulating in
    ``acc`` (``"tl.float32"`` or ``"tl.float64"``); constexprs ``BLOCK_C`` and ``SUB``."""
    pointers, ints = parameters(found)
    off, size = found.offsets, found.sizes
    element_out, degree = size["ELEMENT"], size["DEGREE"]
    blocks = f"(({channels} + BLOCK_C - 1) // BLOCK_C)"
    code = Code()
    code("pid = tl.program_id(0)")
    code("r = tl.arange(0, SUB)")
    code("cc = tl.arange(0, BLOCK_C)")
    # masks combine vectors with scalars through a vector of zeros (the interpreter rejects a scalar & vector mask)
    code("zc = cc * 0")
    code("RC = SUB * BLOCK_C")
    code("scr = SCR + pid * (NCOL * RC) + r[:, None] * BLOCK_C + cc[None, :]")
    code(f"zeros = tl.full([SUB, BLOCK_C], 0, dtype={acc})")
    code("tl.store(scr + (NCOL - 1) * RC, zeros + 1.0)")
    code(f"for w in range(pid, NT * {blocks}, tl.num_programs(0)):")
    code(f"t = w // {blocks}", 2)
    code(f"ch = (w % {blocks}) * BLOCK_C + cc", 2)
    code(f"cmask = ch < {channels}", 2)
    code("element = tl.load(TABLE + t)", 2)
    code("start = tl.load(TABLE + NT + t)", 2)
    code("end = tl.load(TABLE + 2 * NT + t)", 2)
    if element_out:
        # an empty tile (past the last element's) still writes its row of zeros
        code("for s0 in range(start, tl.maximum(end, start + 1), SUB):", 2)
        depth = 3
    else:
        code("s0 = start", 2)
        depth = 2
    code("rmask = s0 + r < end", depth)
    code("node = tl.load(ORDER + s0 + r, mask=rmask, other=0)", depth)
    code("m2 = rmask[:, None] & cmask[None, :]", depth)
    code("tl.debug_barrier()", depth)  # the scratch's previous readers are done
    for s, (first, end) in sorted(found.columns.items()):
        code(f"for q in range({first}, {end}):", depth)
        code(f"lb = tl.load(TAB + {off['LB']} + q)", depth + 1)
        code(f"ls = tl.load(TAB + {off['LS']} + q)", depth + 1)
        code(f"tl.store(scr + q * RC, tl.load(T{s} + node[:, None] * S{s} + lb + ch[None, :] * ls, mask=m2, "
             f"other=0.0).to({acc}))", depth + 1)
    code("tl.debug_barrier()", depth)
    code(f"for a in range({size['NACC']}):", depth)
    d = depth + 1
    code("acc = zeros", d)
    code(f"for k in tl.range(tl.load(TAB + {off['AT']} + a), tl.load(TAB + {off['AT']} + a + 1), "
         f"loop_unroll_factor={ELEMENT_UNROLL if element_out else LANE_UNROLL}):", d)
    code(f"v = tl.load(COEF + k).to({acc}) + zeros", d + 1)
    for f in range(size["WORDS"]):
        code(f"word = tl.load(TAB + {off[f'W{f}']} + k)", d + 1)
        for b in range(min(3, degree - 3 * f)):
            code(f"v *= tl.load(scr + ((word >> {10 * b}) & 1023) * RC)", d + 1)
    if found.element_operands:
        code(f"eo = tl.load(TAB + {off['EO']} + k)", d + 1)
        code(f"eb = tl.load(TAB + {off['EB']} + k)", d + 1)
        code(f"es = tl.load(TAB + {off['ES']} + k)", d + 1)
        for s in found.element_operands:
            code(f"v *= tl.load(T{s} + element * S{s} + eb + ch * es, mask=cmask & ((zc + eo) == {s}), "
                 f"other=1.0).to({acc})[None, :]", d + 1)
    code("acc += v", d + 1)
    code(f"ao = tl.load(TAB + {off['AO']} + a)", d)
    code(f"ab = tl.load(TAB + {off['AB']} + a)", d)
    code(f"ast = tl.load(TAB + {off['AS']} + a)", d)
    if element_out:
        code("total = tl.reduce(acc, 0, _add)", d)
        for j in range(len(found.outputs)):
            target = f"D{j} + t * SD{j} + ab + ch * ast"
            code(f"keep = cmask & ((zc + ao) == {j})", d)
            code(f"previous = tl.load({target}, mask=keep & ((zc + s0) > start), other=0.0).to({acc})", d)
            code(f"tl.store({target}, (total + previous).to(D{j}.dtype.element_ty), mask=keep)", d)
    else:
        for j in range(len(found.outputs)):
            code(f"tl.store(D{j} + node[:, None] * SD{j} + ab + ch[None, :] * ast, acc.to(D{j}.dtype.element_ty), "
                 f"mask=m2 & ((zc + ao) == {j})[None, :])", d)
    # a local combine function instead of tl.sum: triton's own @jit helpers are created once, when triton is
    # imported, and would not run under an interpreter turned on after that
    header = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def _add(a, b):",
              "    return a + b", "", "",
              f"# polynomial kernel: {size['NTERMS']} terms of {degree} lane factors, {channels} channels",
              f"def {name}({', '.join(pointers + ints)}, BLOCK_C: tl.constexpr, SUB: tl.constexpr):"]
    source = "\n".join(header) + "\n" + code.text()
    source = re.sub(r"\bNCOL\b", str(size["NCOL"]), source)
    return source, pointers, ints
