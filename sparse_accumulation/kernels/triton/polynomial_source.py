"""Generation of the Triton source and tables of polynomial kernels (plain Python: no triton import here).

A kernel computes some outputs of a :class:`~sparse_accumulation.descriptors.programs.Program`, all lane outputs or
all element outputs. The terms are data, not code: they sit in tables (an int32 tensor ``TAB`` and the
coefficients ``COEF``) in *blocks* of ``TCH`` term slots, and the kernel's code does not grow with the number of
terms (a straight-line kernel of a few thousand terms takes Triton minutes to compile). Program ``(t, g, c)``
handles the nodes of tile ``t`` (``TABLE``: the tile's element and its ``[start, end)`` in ``ORDER``) and
channels ``c * BLOCK_C ..``. Per node it loads every lane component the terms read into one tile
``L [BLOCK_C, LPAD]`` (a column per component, one column of ones), then per block of terms gathers each
factor position's columns from ``L`` (``tl.gather``), loads the element factors from the element's rows, and
multiplies: ``prod [BLOCK_C, TCH]``.

* lane outputs: every block belongs to one accumulator (the terms of an output component, padded to whole
  blocks); the block's products are summed over its slots and added to that accumulator's column of
  ``acc [BLOCK_C, MPAD]``, stored per node. One program per tile (``g == 0``).
* element outputs: program ``g`` owns ``TCH`` accumulators (output components), one per slot; its blocks hold in
  slot ``r`` a term of accumulator ``r`` (a component with several terms has them in several blocks), so
  ``acc [BLOCK_C, TCH] += prod`` over the blocks and the tile's nodes, stored once per tile into the tile's row
  of a partial sum.

Terms with more than one element factor do not fit (:func:`fits`). Like the other generators, the code calls
only triton builtins.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from .codegen import next_pow2

#: term slots of a block
TCH = 16


def block_channels(channels: int) -> int:
    """Channels a program handles (a power of two, at most 32: the tiles of 128 channels take every register of
    sm_90 and spill in the double backward's kernels)."""
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
    ``ints``, the kernel's sizes (``LPAD``, ``MPAD``, ``DEGREE``: lane factor positions, ``NCH``: blocks of the
    lane kernel, ``GROUPS``: programs of the element kernel), the lane and element operands read, the outputs."""

    ints: np.ndarray
    coefficients: np.ndarray
    offsets: dict
    sizes: dict
    lane_operands: tuple
    element_operands: tuple
    outputs: tuple


def tables(program, outputs) -> Tables:
    """The tables of the kernel computing ``outputs`` (all lane or all element outputs) of ``program``."""
    outputs = tuple(outputs)
    element_out = program.outputs[outputs[0]].kind == "element"
    accumulators = [(j, c) for j in outputs for c in range(program.outputs[j].size)]
    index = {a: i for i, a in enumerate(accumulators)}
    terms = [(index[(j, c)], coefficient, factors) for j in outputs
             for c, coefficient, factors in program.terms[j]]
    lane_factors = sorted({f for _, _, fs in terms for f in fs if program.operands[f[0]].kind == "lane"})
    column = {f: i for i, f in enumerate(lane_factors)}
    one = len(lane_factors)
    lpad = next_pow2(one + 1)
    degree = max([sum(program.operands[s].kind == "lane" for s, _ in fs) for _, _, fs in terms] + [1])

    def slot(term):
        """(coefficient, lane columns per position, element operand, base, step) of a term or a padding slot."""
        if term is None:
            return 0.0, [one] * degree, -1, 0, 0
        _, coefficient, factors = term
        lanes = [column[f] for f in factors if program.operands[f[0]].kind == "lane"]
        elements = [f for f in factors if program.operands[f[0]].kind == "element"]
        s, m = elements[0] if elements else (-1, 0)
        base, step = (program.operands[s].map.base[m], program.operands[s].map.step[m]) if elements else (0, 0)
        return coefficient, lanes + [one] * (degree - len(lanes)), s, base, step

    blocks, named = [], {}
    if element_out:
        groups = -(-len(accumulators) // TCH)
        mpad = groups * TCH
        starts, ends = [], []
        for g in range(groups):
            per_row = [[t for t in terms if t[0] == g * TCH + r] for r in range(TCH)]
            starts.append(len(blocks))
            for k in range(max(len(ts) for ts in per_row)):
                blocks.append([ts[k] if k < len(ts) else None for ts in per_row])
            ends.append(len(blocks))
        named["BSTART"], named["BEND"] = starts, ends
    else:
        groups, mpad = 1, next_pow2(len(accumulators))
        owner = []
        for a in range(len(accumulators)):
            mine = [t for t in terms if t[0] == a]
            for k in range(0, len(mine), TCH):
                chunk = mine[k:k + TCH]
                blocks.append(chunk + [None] * (TCH - len(chunk)))
                owner.append(a)
        named["CA"] = owner
    slots = [slot(term) for block in blocks for term in block]
    coefficients = np.array([s[0] for s in slots] or [0.0], np.float64)
    for f in range(degree):
        named[f"LF{f}"] = [s[1][f] for s in slots]
    named["EO"], named["EB"], named["ES"] = ([s[i] for s in slots] for i in (2, 3, 4))
    operand_of = [s for s, _ in lane_factors] + [-1] * (lpad - one)
    named["LO"] = operand_of
    named["LB"] = [program.operands[s].map.base[m] for s, m in lane_factors] + [0] * (lpad - one)
    named["LS"] = [program.operands[s].map.step[m] for s, m in lane_factors] + [0] * (lpad - one)
    position = {j: i for i, j in enumerate(outputs)}
    padding = mpad - len(accumulators)
    named["AO"] = [position[j] for j, _ in accumulators] + [-1] * padding
    named["AB"] = [program.outputs[j].map.base[c] for j, c in accumulators] + [0] * padding
    named["AS"] = [program.outputs[j].map.step[c] for j, c in accumulators] + [0] * padding
    offsets, parts, total = {}, [], 0
    for name, values in named.items():
        offsets[name] = total
        parts.append(np.asarray(values, np.int64))
        total += len(values)
    ints = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if ints.size and np.abs(ints).max() >= 2**31:
        raise ValueError("a polynomial kernel's table does not fit 32-bit integers")
    sizes = dict(LPAD=lpad, MPAD=mpad, DEGREE=degree, NCH=len(blocks), GROUPS=groups, ELEMENT=element_out)
    lane_operands = tuple(sorted({s for s, _ in lane_factors}))
    element_operands = tuple(sorted({s for s in named["EO"] if s >= 0}))
    return Tables(ints.astype(np.int32), coefficients, offsets, sizes, lane_operands, element_operands, outputs)


def parameters(found: Tables) -> tuple:
    """``(pointer names, int names)``: ``T<s>`` per operand read, ``TAB``, ``COEF``, ``ORDER``, ``TABLE``, ``D<j>`` per
    output (its position in the kernel's outputs); ints ``S<s>``, ``SD<j>``, ``NT`` (tiles), ``R_BUCKET``."""
    operands = sorted(found.lane_operands + found.element_operands)
    outputs = range(len(found.outputs))
    pointers = [f"T{s}" for s in operands] + ["TAB", "COEF", "ORDER", "TABLE"] + [f"D{j}" for j in outputs]
    ints = [f"S{s}" for s in operands] + [f"SD{j}" for j in outputs] + ["NT", "R_BUCKET"]
    return pointers, ints


def kernel_source(name: str, found: Tables, channels: int, acc: str) -> tuple:
    """``(source, pointer names, int names)`` of the kernel ``name`` of the tables ``found``, accumulating in
    ``acc`` (``"tl.float32"`` or ``"tl.float64"``)."""
    pointers, ints = parameters(found)
    off, size = found.offsets, found.sizes
    element_out = size["ELEMENT"]
    width = "TCH" if element_out else "MPAD"
    # a local combine function and tl.full instead of tl.sum and tl.zeros: triton's own @jit helpers are
    # created once, when triton is imported, and would not run under an interpreter turned on after that
    lines = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def _add(a, b):",
             "    return a + b", "", "",
             f"# polynomial kernel: {size['NCH']} blocks of {TCH} terms, {channels} channels",
             f"def {name}({', '.join(pointers + ints)}, BLOCK_C: tl.constexpr):"]
    emit = lambda text, depth=1: lines.append("    " * depth + text)  # noqa: E731
    emit("t = tl.program_id(0)")
    emit("g = tl.program_id(1)")
    emit("ch = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)")
    emit(f"cmask = (ch < {channels})[:, None]")
    emit("element = tl.load(TABLE + t)")
    emit("start = tl.load(TABLE + NT + t)")
    emit("end = tl.load(TABLE + 2 * NT + t)")
    emit("col = tl.arange(0, LPAD)")
    emit(f"lo = tl.load(TAB + {off['LO']} + col)[None, :]")
    emit(f"lb = tl.load(TAB + {off['LB']} + col)[None, :]")
    emit(f"ls = tl.load(TAB + {off['LS']} + col)[None, :]")
    emit("ones = tl.where(lo == -1, 1.0, 0.0).to(%s) + tl.full([BLOCK_C, LPAD], 0, dtype=%s)" % (acc, acc))
    emit("slot = tl.arange(0, TCH)")
    if element_out:
        emit("rows = g * TCH + slot")
        emit(f"b0 = tl.load(TAB + {off['BSTART']} + g)")
        emit(f"b1 = tl.load(TAB + {off['BEND']} + g)")
    else:
        emit("rows = tl.arange(0, MPAD)")
    emit(f"ao = tl.load(TAB + {off['AO']} + rows)[None, :]")
    emit(f"ab = tl.load(TAB + {off['AB']} + rows)[None, :]")
    emit(f"ast = tl.load(TAB + {off['AS']} + rows)[None, :]")
    if element_out:
        emit(f"acc = tl.full([BLOCK_C, {width}], 0, dtype={acc})")
    emit("for p in range(start, end):")
    emit("node = tl.load(ORDER + p)", 2)
    emit("L = ones", 2)
    for s in found.lane_operands:
        emit(f"L += tl.load(T{s} + node * S{s} + lb + ch[:, None] * ls, mask=cmask & (lo == {s}), "
             f"other=0.0).to({acc})", 2)
    if element_out:
        emit("for k in range(b0, b1):", 2)
    else:
        emit(f"acc = tl.full([BLOCK_C, {width}], 0, dtype={acc})", 2)
        emit(f"for k in range({size['NCH']}):", 2)
    body = 3
    emit("base = k * TCH + slot", body)
    emit(f"prod = tl.load(COEF + base).to({acc})[None, :] + tl.full([BLOCK_C, TCH], 0, dtype={acc})", body)
    if found.element_operands:
        emit(f"eo = tl.load(TAB + {off['EO']} + base)[None, :]", body)
        emit(f"eb = tl.load(TAB + {off['EB']} + base)[None, :]", body)
        emit(f"es = tl.load(TAB + {off['ES']} + base)[None, :]", body)
        for s in found.element_operands:
            emit(f"prod *= tl.load(T{s} + element * S{s} + eb + ch[:, None] * es, mask=cmask & (eo == {s}), "
                 f"other=1.0).to({acc})", body)
    for f in range(size["DEGREE"]):
        emit(f"i{f} = tl.load(TAB + {off[f'LF{f}']} + base)[None, :] + tl.full([BLOCK_C, TCH], 0, dtype=tl.int32)",
             body)
        emit(f"prod *= tl.gather(L, i{f}, axis=1)", body)
    if element_out:
        emit("acc += prod", body)
        target, depth = "t", 1
    else:
        emit(f"owner = tl.load(TAB + {off['CA']} + k)", body)
        emit("acc += tl.where(rows[None, :] == owner, tl.reduce(prod, 1, _add)[:, None], 0.0)", body)
        target, depth = "node", 2
    for j in range(len(found.outputs)):
        emit(f"tl.store(D{j} + {target} * SD{j} + ab + ch[:, None] * ast, acc.to(D{j}.dtype.element_ty), "
             f"mask=cmask & (ao == {j}))", depth)
    source = "\n".join(lines) + "\n"
    for token, value in (("LPAD", size["LPAD"]), ("MPAD", size["MPAD"]), ("TCH", TCH)):
        source = re.sub(rf"\b{token}\b", str(value), source)
    return source, pointers, ints
