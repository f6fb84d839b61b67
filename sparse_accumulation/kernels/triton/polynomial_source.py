"""Generation of the Triton source of polynomial kernels (plain Python: no triton import here).

A kernel computes some outputs of a :class:`~sparse_accumulation.descriptors.programs.Program`, all lane outputs or
all element outputs. Its terms are code: each factor a register, each term a few multiplies, so that a term costs
no load at all. Triton's compile time grows faster than the length of a kernel (a few thousand terms take
minutes), so a call's terms are split into *chunks* of at most :data:`MAX_TERMS` terms (:func:`chunks`), each its
own kernel; the chunks of a call compile in parallel, in seconds.

A program of a chunk handles one work item: a tile of at most ``ROWS`` nodes of one element (``TABLE``: the
tile's element and its ``[start, end)`` in ``ORDER``) and a block of ``BLOCK_C`` channels. It loads the element
factors its terms read once (the tile's element row of each, a ``[BLOCK_C]`` vector), then walks the tile's nodes
one at a time, loading the lane factors its terms read one node ahead (so that the loads' latency overlaps the
terms of the node before), and

* lane outputs: stores each accumulator's sum of terms for the node (or adds it to what an earlier chunk stored,
  where an accumulator's terms span chunks: that sum too is loaded one node ahead);
* element outputs: sums each accumulator over the tile's nodes in a register and stores the tile's row of a
  partial sum (summed afterwards over each element's tiles, in order: deterministic; an earlier chunk's row is
  added to where an accumulator spans chunks).

Terms with more than one element factor do not fit (:func:`fits`). Like the other generators, the code calls
only triton builtins (not ``tl.zeros``: triton's own ``@jit`` helpers do not run under an interpreter turned on
after triton's import).
"""
from __future__ import annotations

from typing import NamedTuple

from .codegen import Code, next_pow2

#: the most terms in one chunk (one kernel)
MAX_TERMS = 256
#: the most float32 registers a chunk holds across its nodes: element factors (lane outputs) or element factors
#: and accumulators (element outputs); half as many float64 ones (:func:`held_registers`)
MAX_HELD = 160


def held_registers(acc: str) -> int:
    """The most registers a chunk accumulating in ``acc`` (``"tl.float32"`` or ``"tl.float64"``) holds."""
    return MAX_HELD // 2 if acc == "tl.float64" else MAX_HELD


def block_channels(channels: int) -> int:
    """Channels a program handles (a power of two, at most 128: one per thread of four warps)."""
    return min(next_pow2(channels), 128)


def fits(program, outputs) -> bool:
    """Whether the kernels can compute ``outputs``: at most one element factor per term, and outputs of one
    kind."""
    kinds = {program.outputs[j].kind for j in outputs}
    if len(kinds) != 1:
        return False
    return all(sum(program.operands[s].kind == "element" for s, _ in factors) <= 1
               for j in outputs for _, _, factors in program.terms[j])


class Chunk(NamedTuple):
    """The terms of one kernel: ``accumulators``, each ``(position of its output among the call's outputs,
    component, adds, terms)``: ``adds`` where an earlier chunk wrote part of it, ``terms`` its
    ``(coefficient, factors)`` in this chunk (none: it writes zeros)."""

    accumulators: tuple
    element: bool


def chunks(program, outputs, held_limit: int) -> tuple:
    """The :class:`Chunk` s computing ``outputs`` (all lane or all element outputs) of ``program``: accumulators
    in order, each chunk at most :data:`MAX_TERMS` terms and ``held_limit`` held registers
    (:func:`held_registers`); an accumulator whose terms do not fit the rest of a chunk continues in the next
    one."""
    outputs = tuple(outputs)
    element_out = program.outputs[outputs[0]].kind == "element"
    element = lambda s: program.operands[s].kind == "element"  # noqa: E731
    found, current, held, count = [], [], set(), 0
    written = set()

    def close():
        nonlocal current, held, count
        if current:
            found.append(Chunk(tuple(current), element_out))
        current, held, count = [], set(), 0

    for position, j in enumerate(outputs):
        by_component = {}
        for c, coefficient, factors in program.terms[j]:
            by_component.setdefault(c, []).append((coefficient, tuple(factors)))
        for c in range(program.outputs[j].size):
            pending = by_component.get(c, [])
            while True:
                taken = []
                while pending and count + len(taken) < MAX_TERMS:
                    wanted = {f for f in pending[0][1] if element(f[0])} - held
                    if len(held) + len(wanted) + element_out * (len(current) + 1) > held_limit:
                        break
                    held |= wanted
                    taken.append(pending.pop(0))
                if taken or not pending:
                    current.append((position, c, (position, c) in written, tuple(taken)))
                    written.add((position, c))
                    count += len(taken)
                if not pending:
                    break
                close()
            if count >= MAX_TERMS or element_out and len(held) + len(current) >= held_limit:
                close()
    close()
    return tuple(found)


def parameters(program, chunk: Chunk) -> tuple:
    """``(pointer names, int names)`` of the kernel of ``chunk``: ``T<s>`` per operand read, ``ORDER``,
    ``TABLE``, ``D<i>`` per output written (``i`` its position among the call's outputs); ints ``S<s>``,
    ``SD<i>``, ``NT`` (tiles)."""
    operands = sorted({s for *_, terms in chunk.accumulators for _, factors in terms for s, _ in factors})
    outputs = sorted({position for position, *_ in chunk.accumulators})
    pointers = [f"T{s}" for s in operands] + ["ORDER", "TABLE"] + [f"D{i}" for i in outputs]
    ints = [f"S{s}" for s in operands] + [f"SD{i}" for i in outputs] + ["NT"]
    return pointers, ints


def kernel_source(name: str, program, outputs, chunk: Chunk, acc: str) -> tuple:
    """``(source, pointer names, int names)`` of the kernel ``name`` of ``chunk`` (of the call computing
    ``outputs`` of ``program``), accumulating in ``acc`` (``"tl.float32"`` or ``"tl.float64"``); constexpr
    ``BLOCK_C``."""
    pointers, ints = parameters(program, chunk)
    channels = program.channels
    element = lambda s: program.operands[s].kind == "element"  # noqa: E731
    factors = sorted({f for *_, terms in chunk.accumulators for _, fs in terms for f in fs})
    register = {f: f"e{i}" if element(f[0]) else f"x{i}" for i, f in enumerate(factors)}

    def address(s, m, row):
        slot = program.operands[s]
        return f"T{s} + {row} * S{s} + {slot.map.base[m]} + ch * {slot.map.step[m]}"

    def target(position, c, row):
        slot = program.outputs[outputs[position]]
        return f"D{position} + {row} * SD{position} + {slot.map.base[c]} + ch * {slot.map.step[c]}"

    def sum_of(terms):
        parts = []
        for coefficient, fs in terms:
            product = " * ".join(register[f] for f in fs)
            parts.append(product if coefficient == 1.0 else f"{product} * {coefficient!r}")
        return " + ".join(parts)

    blocks = f"(({channels} + BLOCK_C - 1) // BLOCK_C)"
    code = Code()
    code("pid = tl.program_id(0)")
    code(f"t = pid // {blocks}")
    code(f"ch = (pid % {blocks}) * BLOCK_C + tl.arange(0, BLOCK_C)")
    code(f"cmask = ch < {channels}")
    code("element = tl.load(TABLE + t)")
    code("start = tl.load(TABLE + NT + t)")
    code("end = tl.load(TABLE + 2 * NT + t)")
    code(f"zeros = tl.full([BLOCK_C], 0, dtype={acc})")
    for f in factors:
        if element(f[0]):
            code(f"{register[f]} = tl.load({address(*f, 'element')}, mask=cmask, other=0.0).to({acc})")
    if chunk.element:
        for i, (_, _, _, terms) in enumerate(chunk.accumulators):
            code(f"a{i} = zeros")
    # each node's lane factors (and, in a lane chunk, the sums earlier chunks stored for its continued
    # accumulators) are loaded one node ahead, carried by the loop: their latency overlaps the node before
    continued = [i for i, (_, _, adds, _) in enumerate(chunk.accumulators) if adds and not chunk.element]
    lane_factors = [f for f in factors if not element(f[0])]

    def load_lane(row, prefix, indent):
        for f in lane_factors:
            code(f"{prefix}{register[f]} = tl.load({address(*f, row)}, mask=cmask, other=0.0).to({acc})", indent)
        for i in continued:
            position, c = chunk.accumulators[i][:2]
            code(f"{prefix}p{i} = tl.load({target(position, c, row)}, mask=cmask, other=0.0).to({acc})", indent)

    code("ahead = tl.load(ORDER + tl.maximum(tl.minimum(start, end - 1), 0))")
    load_lane("ahead", "", 1)
    code("for s in range(start, end):")
    code("node = tl.load(ORDER + s)", 2)
    code("ahead = tl.load(ORDER + tl.minimum(s + 1, end - 1))", 2)
    load_lane("ahead", "next_", 2)
    for i, (position, c, adds, terms) in enumerate(chunk.accumulators):
        if chunk.element:
            if terms:
                code(f"a{i} += {sum_of(terms)}", 2)
            continue
        value = f"zeros + {sum_of(terms)}" if terms else "zeros"
        if adds:
            value = f"{value} + p{i}"
        code(f"tl.store({target(position, c, 'node')}, ({value}).to(D{position}.dtype.element_ty), mask=cmask)", 2)
    for carried in [register[f] for f in lane_factors] + [f"p{i}" for i in continued]:
        code(f"{carried} = next_{carried}", 2)
    if chunk.element:
        for i, (position, c, adds, _) in enumerate(chunk.accumulators):
            value = f"a{i}"
            if adds:
                value = f"{value} + tl.load({target(position, c, 't')}, mask=cmask, other=0.0).to({acc})"
            code(f"tl.store({target(position, c, 't')}, ({value}).to(D{position}.dtype.element_ty), mask=cmask)")
    terms = sum(len(t) for *_, t in chunk.accumulators)
    header = ["import triton", "import triton.language as tl", "", "",
              f"# polynomial kernel: {terms} terms into {len(chunk.accumulators)} accumulators, {channels} channels",
              f"def {name}({', '.join(pointers + ints)}, BLOCK_C: tl.constexpr):"]
    return "\n".join(header) + "\n" + code.text(), pointers, ints
