"""Generation of the Triton source of polynomial kernels (plain Python: no triton import here).

A kernel computes some outputs of a :class:`~sparse_accumulation.polynomials.Program`, split into groups
(:func:`..polynomial_schedule.split_outputs`). Program ``(t, g, c)`` does group ``g`` for the nodes of tile
``t`` (``TABLE``: the tile's element and its ``[start, end)`` in ``ORDER``, the nodes sorted by element) and
channels ``c * BLOCK_C ..``. It loops over the tile's nodes ``BLOCK_R`` at a time: loads the node components
the group reads as ``[BLOCK_R, BLOCK_C]`` tiles and the element's weight components as ``[1, BLOCK_C]`` rows,
runs the group's steps (products and multiply-adds, :mod:`..polynomial_schedule`) and stores its lane outputs;
element outputs are summed over the loop and stored once per tile, into the tile's row of a partial sum.

Element loads sit inside the loop at an address that depends on it (``ZERO == 0`` at run time), so the compiler
keeps them there instead of holding every weight in registers across the loop. Like the other generators,
the code calls only triton builtins and a combine function defined next to it.
"""
from __future__ import annotations

from .source import next_pow2


def parameters(program, groups) -> tuple:
    """``(pointer names, int names)``: ``T<s>`` per operand read, ``ORDER``, ``TABLE``, ``D<j>`` per output of
    the groups; ints ``S<s>``, ``SD<j>``, ``NT`` (tiles), ``ZERO`` and ``R_BUCKET`` (the tuning key)."""
    operands = sorted({s for g in groups for s, _ in g.factors})
    outputs = sorted({j for g in groups for j, _ in g.accumulators})
    pointers = [f"T{s}" for s in operands] + ["ORDER", "TABLE"] + [f"D{j}" for j in outputs]
    ints = [f"S{s}" for s in operands] + [f"SD{j}" for j in outputs] + ["NT", "ZERO", "R_BUCKET"]
    return pointers, ints


def _literal(value: float) -> str:
    return repr(float(value))


def _group_body(program, chosen, acc: str, indent: str) -> list:
    lines = []
    emit = lambda text, extra=0: lines.append(indent + "    " * extra + text)  # noqa: E731
    lane_out = all(program.outputs[j].kind == "lane" for j, _ in chosen.accumulators)
    accs = [f"a{i}" for i in range(len(chosen.accumulators))]
    if not lane_out:
        for name in accs:
            emit(f"{name} = tl.full([BLOCK_R, BLOCK_C], 0, dtype={acc})")
    emit("for r0 in range(start, end, BLOCK_R):")
    body = 1
    emit("p = r0 + tl.arange(0, BLOCK_R)[:, None]", body)
    emit("rmask = p < end", body)
    emit("node = tl.load(ORDER + p, mask=rmask, other=0)", body)
    emit("m = rmask & cmask", body)
    emit("z = r0 * ZERO", body)
    operands = sorted({s for s, _ in chosen.factors})
    for s in operands:
        if program.operands[s].kind == "lane":
            emit(f"t{s} = T{s} + node * S{s}", body)
        else:
            emit(f"t{s} = T{s} + element * S{s} + z", body)
    names = {}
    for s, c in chosen.factors:
        if program.operands[s].kind == "lane":
            column_map = program.operands[s].map
            name = f"v{s}_{c}"
            emit(f"{name} = tl.load(t{s} + ({column_map.base[c]} + ch * {column_map.step[c]}), mask=m, "
                 f"other=0.0).to({acc})", body)
            names[(s, c)] = name
    if lane_out:
        for name in accs:
            emit(f"{name} = tl.full([BLOCK_R, BLOCK_C], 0, dtype={acc})", body)
    current, version = {}, [0]

    def ref(r) -> str:
        if r[0] == "1":
            return "1.0"
        if r[0] == "t":
            return current[r[1]]
        factor = r[1:]
        if factor not in names:  # an element component: loaded where first used
            s, c = factor
            column_map = program.operands[s].map
            name = f"w{s}_{c}"
            emit(f"{name} = tl.load(t{s} + ({column_map.base[c]} + ch * {column_map.step[c]}), mask=cmask, "
                 f"other=0.0).to({acc})", body)
            names[factor] = name
        return names[factor]

    for step in chosen.steps:
        u, v = ref(step.a), ref(step.b)
        if step.op == "mul":
            version[0] += 1
            name = f"q{step.target}_{version[0]}"
            emit(f"{name} = {u} * {v}", body)
            current[step.target] = name
        else:
            product = f"{u} * {v}" if step.coefficient == 1.0 else f"{u} * {v} * {_literal(step.coefficient)}"
            emit(f"{accs[step.target]} += {product}", body)
    for i, (j, c) in enumerate(chosen.accumulators):
        column_map = program.outputs[j].map
        column = f"({column_map.base[c]} + ch * {column_map.step[c]})"
        if lane_out:
            emit(f"tl.store(D{j} + node * SD{j} + {column}, {accs[i]}.to(D{j}.dtype.element_ty), mask=m)", body)
        else:
            emit(f"tl.store(D{j} + t * SD{j} + {column}, tl.reduce({accs[i]}, 0, _add, keep_dims=True)"
                 f".to(D{j}.dtype.element_ty), mask=cmask)")
    return lines


def kernel_source(name: str, program, groups, acc: str) -> tuple:
    """``(source, pointer names, int names)`` of the kernel ``name`` computing ``groups`` (a list of
    :class:`..polynomial_schedule.Group`) of ``program``, accumulating in ``acc`` (``"tl.float32"`` or
    ``"tl.float64"``)."""
    pointers, ints = parameters(program, groups)
    B = program.channels
    lines = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def _add(a, b):",
             "    return a + b", "", ""]
    lines.append(f"# polynomial kernel: {len(groups)} groups, {sum(len(g.steps) for g in groups)} steps, "
                 f"{B} channels")
    lines.append(f"def {name}({', '.join(pointers + ints)}, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):")
    emit = lambda text: lines.append("    " + text)  # noqa: E731
    emit("t = tl.program_id(0)")
    emit("g = tl.program_id(1)")
    emit("ch = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]")
    emit(f"cmask = ch < {B}")
    emit("element = tl.load(TABLE + t)")
    emit("start = tl.load(TABLE + NT + t)")
    emit("end = tl.load(TABLE + 2 * NT + t)")
    for i, chosen in enumerate(groups):
        emit(f"if g == {i}:")
        lines.extend(_group_body(program, chosen, acc, "        "))
    return "\n".join(lines) + "\n", pointers, ints


def block_channels(channels: int) -> int:
    """Channels a program handles (a power of two, at most 128)."""
    return min(next_pow2(channels), 128)
