"""Generation of the Triton source of graph kernels (plain Python: no triton import here).

A graph kernel computes, for the edges ``e`` of a call and the channels ``b`` of a
:class:`~sparse_accumulation.descriptors.channel_rules.ChannelRule`, one or more outputs of the rule's slots (X1, X2, W,
out): an output slot ``j`` receives, at its column of ``index_j[k]`` and channel ``b``, ``C[k]`` times the
values of every other slot at theirs (``index`` the rule's arrays ``m1, m2, w, mu``). The forward is the output
slot "out" from X1, X2 and W; the gradient of X1 is the output slot "X1" from the output gradient (in slot
"out"), X2 and W; and so on. Each slot's rows are the edge's own (row ``e``) or gathered (row ``I[e]``).

A program handles a ``[BLOCK_R, BLOCK_B]`` tile: ``BLOCK_R`` grid rows and every channel (``BLOCK_B`` the
channel count rounded up to a power of two). Grid rows are

* edges: each output is written per edge (``"edge"``) or added atomically at its row ``I[e]`` (``"atomic"``);
* segments: the rows of one index (the grid index), whose edges are ``OFFSETS[r] .. OFFSETS[r + 1]`` in the
  order ``ORDER`` (the edges sorted by that index; absent when already sorted). A program loops over the edges
  of its rows in that fixed order. Outputs gathered by the grid index (``"segment"``) are summed in registers
  and each row written once: deterministic, no atomics; outputs per edge ride along; operands gathered by the
  grid index (``hoisted``) are read once per row, before the loop. With ``split`` S > 1, S programs share each
  segment (program ``(r, j)`` walks the ``j``-th of S runs of its edges: shorter loops and more programs where
  there are few segments of many edges), and the segment outputs are S partial sums per row, which the caller
  adds up in order.

Columns are loaded one at a time (component ``m`` of channel ``b`` at ``base[m] + b * step[m]`` of the row, a
``[BLOCK_R, 1]`` load when every channel shares it), and every output column is summed in registers with the
factored sums of :func:`.source.factored_sum`; an output column shared by the channels is summed over them.
Gathered rows outside ``[0, N)`` read as zeros and atomics outside are dropped: no access leaves a tensor.
Like :mod:`.accumulate_source`, the code calls only triton builtins and local combine functions.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...descriptors.channel_rules import ONE, SLOTS
from .. import ATOMIC, EDGE, SEGMENT
from .codegen import Code, factored_sum, next_pow2

#: output modes
_INDEX_NAMES = ("m1", "m2", "w", "mu")


class Spec(NamedTuple):
    """What a generated graph kernel is made for (its identity, with the channel rule and the dtypes).

    ``gathered``: per slot (X1, X2, W, out), whether its rows are gathered through an index array (for an
    output in mode "atomic": the rows it adds to); ``outputs``: ``(slot, mode)`` pairs; ``segmented``: the grid
    rows are segments; ``hoisted``: per slot, whether its rows are the grid rows (gathered by the grid index);
    ``ordered``: segment edges are visited through ``ORDER``; ``idx64``: offsets need 64 bits; ``acc``: the
    accumulation dtype (``"tl.float32"`` or ``"tl.float64"``); ``split``: the programs each segment's edges
    are shared by (1: one), whose segment outputs are then partial sums (row ``r`` of program ``(r, j)`` at
    ``r + j * R``)."""

    gathered: tuple
    outputs: tuple
    segmented: bool
    hoisted: tuple
    ordered: bool
    idx64: bool
    acc: str
    split: int = 1

    @property
    def output_slots(self) -> tuple:
        return tuple(slot for slot, _ in self.outputs)


def present_slots(crule) -> tuple:
    """The slots of the rule: X1, X2, W (weighted rules only) and out."""
    return tuple(s for s in range(4) if crule.maps[s] is not None)


def operand_slots(crule, spec: Spec) -> tuple:
    """The slots a kernel reads: those some output multiplies by (an output's factors are every other slot)."""
    return tuple(s for s in present_slots(crule) if any(j != s for j in spec.output_slots))


def index_slots(crule, spec: Spec) -> tuple:
    """Slots whose index array is a kernel parameter: gathered operands (but hoisted ones) and atomic outputs."""
    atomic = {slot for slot, mode in spec.outputs if mode == ATOMIC}
    operands = [s for s in operand_slots(crule, spec) if not spec.hoisted[s]]
    return tuple(s for s in range(4) if spec.gathered[s] and (s in operands or s in atomic))


def parameters(crule, spec: Spec) -> tuple:
    """``(pointer names, int names)`` of the kernel, in order (then the constexpr ``BLOCK_R``).

    Pointers: ``T<slot>`` per operand, ``I<slot>`` per index array, ``OFFSETS`` (and ``ORDER``) with segment
    outputs, ``C``, ``D<slot>`` per output. Ints: ``R`` (grid rows), ``S<slot>`` (row stride) per operand,
    ``SD<slot>`` per output, ``N<slot>`` (row count) per index array, ``CZ`` (0, see :func:`_coefficients`),
    ``R_BUCKET`` (the autotuning key)."""
    operands = operand_slots(crule, spec)
    indices = index_slots(crule, spec)
    pointers = [f"T{s}" for s in operands] + [f"I{s}" for s in indices]
    if spec.segmented:
        pointers += ["OFFSETS"] + (["ORDER"] if spec.ordered else [])
    pointers += ["C"] + [f"D{s}" for s in spec.output_slots]
    ints = ["R"] + [f"S{s}" for s in operands] + [f"SD{s}" for s in spec.output_slots] + [f"N{s}" for s in indices]
    return pointers, ints + ["CZ", "R_BUCKET"]


def _terms(crule, output_slot: int) -> dict:
    """``{output component: [(k, ((slot, component), ...))]}``: the terms of an output slot, whose factors are
    every other slot of the rule (components read as the constant 1 have no output)."""
    rule = crule.rule
    factor_slots = [s for s in present_slots(crule) if s != output_slot]
    arrays = {s: getattr(rule, _INDEX_NAMES[s]) for s in present_slots(crule)}
    groups = {}
    for k in range(rule.nnz):
        if crule.maps[output_slot].base[arrays[output_slot][k]] == ONE:
            continue
        factors = tuple((s, arrays[s][k]) for s in factor_slots)
        groups.setdefault(arrays[output_slot][k], []).append((k, factors))
    return groups


def _emit_row_bases(code: Code, crule, spec: Spec, operands, edge: str, mask: str, cast: str) -> dict:
    """Row pointers and masks of the operands for edge vector ``edge`` (for hoisted operands: of the grid
    rows); returns ``{slot: mask name}``."""
    masks = {}
    for s in operands:
        if spec.hoisted[s]:
            code(f"t{s} = T{s} + rows * S{s}")
            masks[s] = "rmask"
        elif spec.gathered[s]:
            code(f"r{s} = tl.load(I{s} + {edge}, mask={mask}, other=0){cast}")
            code(f"m{s} = {mask} & (r{s} >= 0) & (r{s} < N{s})")
            code(f"t{s} = T{s} + r{s} * S{s}")
            masks[s] = f"m{s}"
        else:
            code(f"t{s} = T{s} + {edge}{cast} * S{s}")
            masks[s] = mask
    return masks


class Column(NamedTuple):
    """A loaded operand column: the expression that names it, and whether every channel shares it (a
    ``[BLOCK_R, 1]`` value or the constant 1, else ``[BLOCK_R, BLOCK_B]``)."""

    name: str
    shared: bool


def _needed(terms_by_output, slots) -> list:
    """The ``(slot, component)`` columns of ``slots`` that some output's terms read."""
    return sorted({f for groups in terms_by_output for terms in groups.values() for _, fs in terms for f in fs
                   if f[0] in slots})


def _emit_loads(code: Code, crule, needed, masks, acc: str) -> dict:
    """Load the ``needed`` columns; returns ``{(slot, component): Column}``."""
    columns = {}
    for s, m in needed:
        column_map = crule.maps[s]
        base, step = column_map.base[m], column_map.step[m]
        var = f"v{s}_{m}"
        if base == ONE:
            columns[(s, m)] = Column("one", True)
        elif step == 0:
            code(f"{var} = tl.load(t{s} + {base}, mask={masks[s]}, other=0.0).to({acc})")
            columns[(s, m)] = Column(var, True)
        else:
            code(f"{var} = tl.load(t{s} + ({base} + ch * {step}), mask={masks[s]} & cmask, other=0.0).to({acc})")
            columns[(s, m)] = Column(var, False)
    return columns


def _sum_expression(terms, columns, acc: str, full: bool, coefficient) -> str:
    """The sum of an output column's terms; ``full``: as a ``[BLOCK_R, BLOCK_B]`` tile even where every
    factor is shared by the channels (a ``[BLOCK_R, 1]`` value otherwise)."""
    named = [(k, tuple(columns[f].name for f in factors)) for k, factors in terms]
    expression = factored_sum(named, acc, coefficient)
    shared = all(columns[f].shared for _, factors in terms for f in factors)
    return f"({expression}) + zero" if full and shared else expression


def _emit_store(code: Code, target: str, value: str, step: int, base: int, mask: str, out_ty: str,
                atomic: bool, padded: bool) -> None:
    """Store (or atomically add) a ``[BLOCK_R, BLOCK_B]`` column value; a shared output column (step 0) gets
    its sum over the channels."""
    if step == 0:
        value = f"tl.where(cmask, {value}, 0.0)" if padded else value
        value = f"tl.reduce({value}, 1, _add, keep_dims=True)"
        address, full_mask = f"{target} + {base}", mask
    else:
        address, full_mask = f"{target} + ({base} + ch * {step})", f"{mask} & cmask"
    if atomic:
        code(f"tl.atomic_add({address}, ({value}).to({out_ty}), mask={full_mask})")
    else:
        code(f"tl.store({address}, ({value}).to({out_ty}), mask={full_mask})")


def _coefficients(crule, acc: str):
    """``k -> expression of C[k]``: the constant coefficients compiled in (float32 kernels of a rule that has
    them), else a load from ``C`` at ``k + cz``, which in the segment loop is ``t * CZ`` with ``CZ = 0`` at
    run time: the address depends on the loop, so the compiler keeps the loads in it instead of holding every
    coefficient in a register across it."""
    if crule.coefficients is not None and acc == "tl.float32":
        return lambda k: repr(float(np.float32(crule.coefficients[k])))
    return lambda k: f"tl.load(C + ({k} + cz)).to({acc})"


def kernel_source(name: str, crule, spec: Spec) -> tuple:
    """``(source, pointer names, int names)`` of the graph kernel ``name`` for ``crule`` and ``spec``."""
    operands = operand_slots(crule, spec)
    pointers, ints = parameters(crule, spec)
    B = crule.channels
    BB = next_pow2(B)
    acc = spec.acc
    cast = ".to(tl.int64)" if spec.idx64 else ""
    groups = {slot: _terms(crule, slot) for slot in spec.output_slots}

    code = Code()
    code.lines = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def _add(a, b):",
                  "    return a + b", "", "", "@triton.jit", "def _max(a, b):", "    return tl.maximum(a, b)",
                  "", ""]
    slots = ", ".join(f"{SLOTS[s]}:{mode}" for s, mode in spec.outputs)
    code(f"# graph kernel of a channel rule with nnz={crule.rule.nnz}, {B} channels; outputs {slots}; "
         f"gathered {spec.gathered}", 0)
    code(f"def {name}({', '.join(pointers + ints)}, BLOCK_R: tl.constexpr):", 0)
    # every per-row value is a [BLOCK_R, 1] tile, so that row and channel tiles share one layout (triton 3.6
    # fails to convert between a 1-D row vector's layouts inside the segment loop)
    code("pid = tl.program_id(0)")
    code(f"rows = pid{cast} * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
    code("rmask = rows < R")
    code(f"ch = tl.arange(0, {BB})[None, :]")
    code(f"cmask = ch < {B}")
    code(f"zero = tl.full([BLOCK_R, {BB}], 0, dtype={acc})")
    code("one = 1.0")

    hoisted = [s for s in operands if spec.hoisted[s]]
    per_edge = [s for s in operands if not spec.hoisted[s]]
    terms = [groups[s] for s in spec.output_slots]
    coefficient = _coefficients(crule, acc)

    def emit_edge_body(body: Code, edge: str, mask: str, columns: dict) -> None:
        masks = _emit_row_bases(body, crule, spec, per_edge, edge, mask, cast)
        columns = {**columns, **_emit_loads(body, crule, _needed(terms, per_edge), masks, acc)}
        for slot, mode in spec.outputs:
            out_map = crule.maps[slot]
            out_ty = f"D{slot}.dtype.element_ty"
            if mode == SEGMENT:
                for m, group in sorted(groups[slot].items()):
                    body(f"a{slot}_{m} += {_sum_expression(group, columns, acc, False, coefficient)}")
                continue
            if mode == EDGE:
                body(f"d{slot} = D{slot} + {edge}{cast} * SD{slot}")
                out_mask = mask
            else:
                body(f"o{slot} = tl.load(I{slot} + {edge}, mask={mask}, other=-1){cast}")
                body(f"d{slot} = D{slot} + o{slot} * SD{slot}")
                body(f"w{slot} = {mask} & (o{slot} >= 0) & (o{slot} < N{slot})")
                out_mask = f"w{slot}"
            for m, group in sorted(groups[slot].items()):
                _emit_store(body, f"d{slot}", _sum_expression(group, columns, acc, True, coefficient), out_map.step[m],
                            out_map.base[m], out_mask, out_ty, mode == ATOMIC, BB != B)

    if not spec.segmented:
        code("cz = 0")
        emit_edge_body(code, "rows", "rmask", {})
        return code.text(), pointers, ints

    code("start = tl.load(OFFSETS + rows, mask=rmask, other=0)")
    code("count = tl.load(OFFSETS + rows + 1, mask=rmask, other=0) - start")
    if spec.split > 1:  # this program's run of the segment: the j-th of split runs of ceil(count / split) edges
        S = spec.split
        code("piece = tl.program_id(1)")
        code(f"run = (count + {S - 1}) // {S}")
        code("start = start + piece * run")
        code("count = tl.maximum(tl.minimum(run, count - piece * run), 0)")
    code("steps = tl.reduce(tl.reduce(count, 1, _max), 0, _max)")
    hoisted_columns = _emit_loads(code, crule, _needed(terms, hoisted),
                                  _emit_row_bases(code, crule, spec, hoisted, "rows", "rmask", cast), acc)
    segment_slots = [slot for slot, mode in spec.outputs if mode == SEGMENT]
    for slot in segment_slots:
        for m in sorted(groups[slot]):
            code(f"a{slot}_{m} = zero")
    code("for t in range(0, steps):")
    body = Code(base=2)
    body("emask = rmask & (t < count)")
    body("cz = t * CZ")
    if spec.ordered:
        body(f"edge = tl.load(ORDER + start + t, mask=emask, other=0){cast}")
    else:
        body(f"edge = (start + t){cast}")
    emit_edge_body(body, "edge", "emask", hoisted_columns)
    code.extend(body)
    for slot in segment_slots:
        out_map = crule.maps[slot]
        row = f"(rows + piece{cast} * R)" if spec.split > 1 else "rows"
        code(f"d{slot} = D{slot} + {row} * SD{slot}")
        for m in sorted(groups[slot]):
            _emit_store(code, f"d{slot}", f"a{slot}_{m}", out_map.step[m], out_map.base[m], "rmask",
                        f"D{slot}.dtype.element_ty", False, BB != B)
    return code.text(), pointers, ints


def segment_sum_source(name: str, acc: str, ordered: bool) -> str:
    """Source of a kernel that sums rows: ``OUT[r, :] = sum of Z[e, :]`` over the edges ``e`` of segment ``r``
    (``ORDER[OFFSETS[r] .. OFFSETS[r + 1]]``, or those positions themselves without ``ORDER``), in that order;
    program ``(r, c)`` does columns ``c * BLOCK_C ..`` of row ``r``."""
    edge = "tl.load(ORDER + p)" if ordered else "p"
    order = " ORDER," if ordered else ""
    return f"""import triton
import triton.language as tl


def {name}(Z, OFFSETS,{order} OUT, WIDTH, SZ, SO, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < WIDTH
    start = tl.load(OFFSETS + row)
    end = tl.load(OFFSETS + row + 1)
    total = tl.full([BLOCK_C], 0, dtype={acc})
    for p in range(start, end):
        e = {edge}
        total += tl.load(Z + e * SZ + cols, mask=cmask, other=0.0).to({acc})
    tl.store(OUT + row.to(tl.int64) * SO + cols, total.to(OUT.dtype.element_ty), mask=cmask)
"""
