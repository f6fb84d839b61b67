"""How an e3nn tensor product maps onto ONE weighted sparse accumulation: operand layouts and the rule.

Used by :mod:`sparse_accumulation.e3nn`; plain torch and numpy (irreps are read as ``(mul, ir)`` pairs with
``ir.l`` and ``ir.dim``, instructions as :class:`sparse_accumulation.e3nn.Instruction`).

Channels
--------
The multiplicity index ``u`` that modes "uuu" and "uvu" share between the first input and the output can be
split between the rows and the components of the accumulation. A :class:`Plan` with ``U`` channels (``U``
dividing the multiplicity ``mul`` of every irrep the instructions use) makes multiplicity ``u`` channel
``u // q``, sub-block ``u % q`` (``q = mul / U``): e3nn's irrep slice ``[..., mul (2l + 1)]`` is then
``[..., U, q (2l + 1)]`` without a copy, and an operand ``[..., U, D]`` concatenates the per-channel blocks
of the irreps (:class:`Layout`).

* ``U = 1``: the rows are e3nn's rows and every operand is e3nn's tensor itself (``x[..., None, :]``), no
  copy at all; the rule repeats each CG nonzero for every multiplicity. The CPU kernels run this best.
* ``U`` = the greatest common divisor of the multiplicities: the rule is that of one channel (short, as the
  generated GPU kernels need it); the inputs and the output are copied once into and out of the channel
  layout (:func:`gather`, :func:`scatter`, each the other's gradient).

The second input of "uvu" (``v`` summed) is read by every channel as it is (``y[..., None, :]``,
broadcast); with "uuu" instructions (and ``U > 1``) it is split into channels like the first, an irrep also
used by "uvu" then being repeated for every channel (a "shared" segment).

Weights become ``W[..., U, K]``: for weighted instruction ``i``, ``K_i`` columns per channel (``q * mul2``
for "uvu", ``q`` for "uuu") in instruction order, then a column of ones read by the instructions without
weights (when there are both). When every ``K_i`` is 1 (one ``v``, ``q = 1``: spherical harmonics and equal
multiplicities) that is e3nn's ``weight`` ``[..., instructions, U]`` transposed, a view; with ``U = 1`` and
no column of ones it is ``weight[..., None, :]``.

Instructions on an irrep of multiplicity 0 are not computed, as in e3nn (:func:`computed`); their weights
keep their place in e3nn's ``weight`` and are not read (their gradient is zero).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import numpy as np
import torch

import cg

from ..descriptors.channel_rules import ONE, ChannelRule, ColumnMap
from ..descriptors.rules import Rule


class Segment(NamedTuple):
    """Block ``index`` of an e3nn-layout tensor in a channel operand: the e3nn slice
    ``[start, start + mul * dim)`` and the operand's columns from ``offset`` on. Unshared: each channel holds
    its ``mul / U`` blocks (``mul / U * dim`` columns); ``shared``: every channel reads the whole block
    (``mul * dim`` columns)."""

    index: int
    start: int
    mul: int
    dim: int
    offset: int
    shared: bool = False

    def width(self, channels: int) -> int:
        return self.mul * self.dim if self.shared else self.mul // channels * self.dim


class Layout(NamedTuple):
    """An e3nn-layout tensor ``[..., size]`` (blocks ``pieces = ((mul, dim), ...)`` starting at ``starts``)
    as a channel operand ``[..., channels, width]`` made of ``segments``. Plain ints only: calls (and
    ``torch.compile``) read nothing else."""

    pieces: tuple
    starts: tuple
    segments: tuple
    channels: int
    width: int

    @property
    def size(self) -> int:
        return sum(mul * dim for mul, dim in self.pieces)

    @property
    def identity(self) -> bool:
        """One channel holding every block in e3nn's order: the operand is the tensor itself."""
        return self.channels == 1 and self.width == self.size and all(
            s.start == s.offset for s in self.segments) and len(self.segments) == len(self.pieces)

    @property
    def single_view(self) -> Optional[Segment]:
        """The segment when the operand is one unshared segment (a view of the tensor), else None."""
        if len(self.segments) == 1 and not self.segments[0].shared:
            return self.segments[0]
        return None


def _starts(pieces) -> tuple:
    starts, total = [], 0
    for mul, dim in pieces:
        starts.append(total)
        total += mul * dim
    return tuple(starts)


def make_layout(pieces, wanted, channels: int) -> Layout:
    """The layout of the blocks ``wanted`` (``{(block index, shared)}``) of an e3nn tensor, in block order."""
    starts = _starts(pieces)
    segments, offset = [], 0
    for index, shared in sorted(wanted):
        mul, dim = pieces[index]
        segment = Segment(index, starts[index], mul, dim, offset, shared)
        segments.append(segment)
        offset += segment.width(channels)
    return Layout(tuple(pieces), starts, tuple(segments), channels, offset)


@functools.lru_cache(maxsize=None)
def _permutation(layout: Layout, device: torch.device, to_e3nn: bool) -> Optional[torch.Tensor]:
    """For a layout that holds every column of the tensor exactly once (no shared segment, every block once):
    the column of the source read by each column of the result, as an index tensor on ``device``
    (flattened channel operand <- e3nn tensor, or back with ``to_e3nn``); None for other layouts."""
    if any(s.shared for s in layout.segments) or sorted(s.index for s in layout.segments) != list(
            range(len(layout.pieces))):
        return None
    U, width = layout.channels, layout.width
    source = np.empty(U * width, dtype=np.int64)  # source[channel column] = e3nn column
    for s in layout.segments:
        w = s.width(U)
        columns = s.start + np.arange(U * w)
        source[(np.arange(U)[:, None] * width + s.offset + np.arange(w)).ravel()] = columns
    index = np.argsort(source) if to_e3nn else source
    return torch.as_tensor(index, device=device)


def _indexed_copy(t: torch.Tensor, layout: Layout, to_e3nn: bool) -> Optional[torch.Tensor]:
    """The relayout as ONE indexed copy (one kernel instead of one strided copy per block), in eager mode and
    where :func:`_permutation` applies; None otherwise. (Compiled graphs fuse the per-block copies.)"""
    if torch.compiler.is_compiling():
        return None
    index = _permutation(layout, t.device, to_e3nn)
    if index is None:
        return None
    # index_select: 1.5x faster than advanced indexing on an H200 (0.91 against 1.34 ms for [10^6, 288] fp32)
    if to_e3nn:
        return t.flatten(-2).index_select(-1, index)
    return t.index_select(-1, index).unflatten(-1, (layout.channels, layout.width))


def _gather_copy(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    copied = _indexed_copy(t, layout, False)
    if copied is not None:
        return copied
    lead, U = t.shape[:-1], layout.channels
    out = t.new_empty(*lead, U, layout.width)
    for s in layout.segments:
        piece = t.narrow(-1, s.start, s.mul * s.dim)
        piece = piece.unsqueeze(-2) if s.shared else piece.unflatten(-1, (U, s.width(U)))
        out.narrow(-1, s.offset, s.width(U)).copy_(piece)
    return out


def _scatter_copy(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The adjoint of :func:`_gather_copy`: blocks no segment reads get zeros, shared segments are summed
    over the channels, a block read by several segments gets their sum."""
    copied = _indexed_copy(t, layout, True)
    if copied is not None:
        return copied
    lead, U = t.shape[:-2], layout.channels
    out = t.new_empty(*lead, layout.size)
    written = set()
    for s in layout.segments:
        piece = t.narrow(-1, s.offset, s.width(U))
        target = out.narrow(-1, s.start, s.mul * s.dim)
        if s.shared:
            piece = piece.sum(-2)
        else:
            target = target.unflatten(-1, (U, s.width(U)))
        if s.index in written:
            target.add_(piece)
        else:
            target.copy_(piece)
            written.add(s.index)
    for index, (start, (mul, dim)) in enumerate(zip(layout.starts, layout.pieces)):
        if index not in written:
            out.narrow(-1, start, mul * dim).zero_()
    return out


class _Relayout(torch.autograd.Function):
    """e3nn layout -> channel layout (``to_e3nn`` False) or back; each the other's gradient, so that the
    gradients of a copy are one copy (not a zero-filled tensor per block), to any order."""

    @staticmethod
    def forward(ctx, t, layout, to_e3nn):
        ctx.layout, ctx.to_e3nn = layout, to_e3nn
        return _scatter_copy(t, layout) if to_e3nn else _gather_copy(t, layout)

    @staticmethod
    def backward(ctx, grad):
        return _Relayout.apply(grad, ctx.layout, not ctx.to_e3nn), None, None


def gather(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """e3nn-layout ``t[..., size]`` -> the channel operand ``[..., channels, width]`` (a view where possible)."""
    if layout.identity:
        return t.unsqueeze(-2)
    s = layout.single_view
    if s is not None:
        return t.narrow(-1, s.start, s.mul * s.dim).unflatten(-1, (layout.channels, s.width(layout.channels)))
    return _Relayout.apply(t, layout, False)


def scatter(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """A channel operand ``[..., channels, width]`` -> e3nn's layout ``[..., size]`` (a view where possible)."""
    if layout.identity:
        return t.squeeze(-2)
    s = layout.single_view
    if s is not None and len(layout.pieces) == 1:
        return t.flatten(-2)
    return _Relayout.apply(t, layout, True)


class WeightLayout(NamedTuple):
    """Weights ``[..., weight_numel]`` as ``W[..., channels, size]``: ``layout`` places the weighted
    instructions' blocks (``columns[i]``: first column of instruction ``i``), ``ones`` is the column of ones
    (or None); ``uniform``: every block has ``count`` columns and tiles the weights (a transposed view)."""

    layout: Layout
    columns: dict
    ones: Optional[int]
    uniform: Optional[int]

    @property
    def size(self) -> int:
        return self.layout.width + (self.ones is not None)


def gather_weights(weight: torch.Tensor, weights: WeightLayout) -> torch.Tensor:
    """e3nn's ``weight[..., weight_numel]`` -> ``W[..., channels, size]``."""
    U = weights.layout.channels
    if weights.uniform is not None and weights.ones is None:
        n = len(weights.columns)
        # [..., n, U, count] -> [..., U, n, count] -> [..., U, n * count]: a view when count == 1 (or U == 1)
        return weight.unflatten(-1, (n, U, weights.uniform)).transpose(-3, -2).flatten(-2)
    W = gather(weight, weights.layout)
    if weights.ones is not None:
        W = torch.cat([W, W.new_ones(1).expand(*W.shape[:-1], 1)], dim=-1)
    return W


class Plan(NamedTuple):
    """The operands and the rule of a tensor product with ``channels`` channels.

    ``x``, ``out``: layouts of the first input and the output; ``y``: of the second input, or None when
    every channel reads ``y`` as it is (``y[..., None, :]``); ``weights``: a :class:`WeightLayout` or None
    (unweighted rule); ``rule`` (None when nothing is computed) and its ``coefficients`` (float64 numpy).
    """

    channels: int
    x: Layout
    y: Optional[Layout]
    out: Layout
    weights: Optional[WeightLayout]
    rule: Optional[Rule]
    coefficients: np.ndarray


def _pieces(irreps) -> tuple:
    return tuple((mul, ir.dim) for mul, ir in irreps)


def computed(ins, irreps_in1, irreps_in2, irreps_out) -> bool:
    """Whether e3nn computes an instruction: not when one of its three irreps has multiplicity 0. Such an
    instruction writes nothing, and its weights (``prod(path_shape)``: nonzero for "uvu" into a ``0x`` output
    and "uuu" with a ``0x`` second input or output) are still counted in ``weight_numel`` but never read."""
    return 0 not in (irreps_in1[ins.i_in1].mul, irreps_in2[ins.i_in2].mul, irreps_out[ins.i_out].mul)


#: the modes whose multiplicity ``u`` can be split into channels (the others run on one channel)
CHANNEL_MODES = ("uuu", "uvu")
#: most nonzeros the instructions in other modes may expand to: each of their paths is a term of the rule
#: (a "uvw" instruction: mul1 * mul2 * mul_out paths), which the kernels walk one by one
MAX_EXPANDED_TERMS = 3_000_000


def divisor_of_multiplicities(irreps_in1, irreps_in2, irreps_out, instructions, skip=frozenset()) -> int:
    """The greatest common divisor of the multiplicities the computed instructions use (1 without any, and 1 when
    one of them is in a mode other than :data:`CHANNEL_MODES`); instructions numbered in ``skip`` are not
    counted (they are computed elsewhere)."""
    used = [ins for i, ins in enumerate(instructions)
            if i not in skip and computed(ins, irreps_in1, irreps_in2, irreps_out)]
    if any(ins.connection_mode not in CHANNEL_MODES for ins in used):
        return 1
    muls = [irreps_in1[ins.i_in1].mul for ins in used]
    return math.gcd(*muls) if muls else 1


def _weight_layout(instructions, computes, channels: int) -> Optional[WeightLayout]:
    """The weight layout of the instructions (``computes[i]``: whether instruction ``i`` is computed), None when
    no computed instruction has weights. The weights of instructions not computed are blocks no segment reads."""
    pieces, wanted, columns, counts, column, unread = [], set(), {}, set(), 0, 0
    for index, (ins, use) in enumerate(zip(instructions, computes)):
        if not ins.has_weight:
            continue
        size = math.prod(ins.path_shape)
        if use:
            count = size // channels
            pieces.append((channels, count))
            wanted.add((len(pieces) - 1, False))
            columns[index] = column
            counts.add(count)
            column += count
        else:
            pieces.append((1, size))
            unread += size
    if not columns:
        return None
    ones = column if len(columns) < sum(computes) else None
    # the transposed view needs weights made of the read blocks only
    uniform = counts.pop() if len(counts) == 1 and not unread else None
    return WeightLayout(make_layout(pieces, wanted, channels), columns, ones, uniform)


def make_plan(irreps_in1, irreps_in2, irreps_out, instructions, channels: int, skip=frozenset()) -> Plan:
    """The :class:`Plan` of instructions (with their ``path_weight`` = e3nn's ``sqrt(alpha)``) on ``channels``;
    the instructions numbered in ``skip`` are left out (computed elsewhere; their weights keep their place).

    Raises:
        ValueError: ``channels`` does not divide the multiplicity of an irrep the instructions use.
    """
    computes = [i not in skip and computed(ins, irreps_in1, irreps_in2, irreps_out)
                for i, ins in enumerate(instructions)]
    used = [ins for ins, use in zip(instructions, computes) if use]
    for ins in used:
        if channels > 1 and ins.connection_mode not in CHANNEL_MODES:
            raise ValueError(f"channels={channels}: mode {ins.connection_mode!r} runs on one channel only")
        if irreps_in1[ins.i_in1].mul % channels:
            raise ValueError(f"channels={channels} does not divide the multiplicity {irreps_in1[ins.i_in1].mul} of "
                             f"in1[{ins.i_in1}]")
    every = channels == 1  # one channel: the operands are e3nn's tensors, unused irreps included
    x = make_layout(_pieces(irreps_in1), {(i, False) for i in range(len(irreps_in1))} if every
                    else {(ins.i_in1, False) for ins in used}, channels)
    out = make_layout(_pieces(irreps_out), {(i, False) for i in range(len(irreps_out))} if every
                      else {(ins.i_out, False) for ins in used}, channels)
    y = None
    if not every and any(ins.connection_mode == "uuu" for ins in used):
        y = make_layout(_pieces(irreps_in2), {(ins.i_in2, ins.connection_mode == "uvu") for ins in used}, channels)
    weights = _weight_layout(instructions, computes, channels)
    if not used:
        return Plan(channels, x, y, out, weights, None, np.zeros(0))
    m1, m2, mu, w, C = _rule_arrays(instructions, computes, irreps_in1, irreps_in2, irreps_out, channels, x, y, out,
                                    weights)
    extra = {} if weights is None else {"w": w, "weight_size": weights.size}
    rule = Rule(m1, m2, mu, out.width, input_sizes=(x.width, irreps_in2.dim if y is None else y.width), **extra)
    return Plan(channels, x, y, out, weights, rule, C)


def _offsets(layout: Layout) -> dict:
    """``{(block index, shared): first column}`` of a layout's segments."""
    return {(s.index, s.shared): s.offset for s in layout.segments}


def _rule_arrays(instructions, computes, irreps_in1, irreps_in2, irreps_out, channels, x, y, out, weights) -> list:
    """``[m1, m2, mu, w, C]`` (``w`` None without weights) of every computed instruction (``computes[i]``),
    concatenated."""
    x_at, out_at = _offsets(x), _offsets(out)
    y_at = _offsets(y) if y is not None else {(i, True): s for i, s in enumerate(_starts(_pieces(irreps_in2)))}
    pieces = []
    expanded = 0
    for index, (ins, use) in enumerate(zip(instructions, computes)):
        if not use:
            continue
        (mul1, ir1), (mul2, ir2), (_, ir_out) = (irreps_in1[ins.i_in1], irreps_in2[ins.i_in2],
                                                 irreps_out[ins.i_out])
        a, b, c, C = cg.transformation_rule(ir1.l, ir2.l, ir_out.l, basis="e3nn")
        C = C * (ins.path_weight / math.sqrt(ir_out.dim))  # e3nn's 3j symbol times sqrt(alpha)
        if ins.connection_mode not in CHANNEL_MODES:  # one channel: e3nn's tensors, every path listed
            u, v, o, k = mode_paths(ins.connection_mode, mul1, mul2, irreps_out[ins.i_out].mul)
            expanded += len(u) * len(C)
            if expanded > MAX_EXPANDED_TERMS:
                raise NotImplementedError(
                    f"the instructions in modes other than {CHANNEL_MODES} expand to more than "
                    f"{MAX_EXPANDED_TERMS} terms (instruction {index}, mode {ins.connection_mode!r}, multiplicities "
                    f"{mul1}, {mul2}, {irreps_out[ins.i_out].mul}): these modes run every path as a term of one "
                    f"rule, which is for small multiplicities; use e3nn's module for this product")
            if weights is None:
                k = None
            elif ins.has_weight:
                k = weights.columns[index] + k
            else:
                k = np.full_like(u, weights.ones)
            shape = (len(u), len(C))
            arrays = [x_at[(ins.i_in1, False)] + u[:, None] * ir1.dim + a,
                      y_at[(ins.i_in2, True)] + v[:, None] * ir2.dim + b,
                      out_at[(ins.i_out, False)] + o[:, None] * ir_out.dim + c, k if k is None else k[:, None], C]
            pieces.append([None if t is None else np.broadcast_to(t, shape).ravel() for t in arrays])
            continue
        q = mul1 // channels
        uvu = ins.connection_mode == "uvu"
        j = np.arange(q)[:, None, None]  # sub-block within the channel
        v = np.arange(mul2 if uvu else 1)[None, :, None]
        shape = (q, v.shape[1], len(C))
        m1 = x_at[(ins.i_in1, False)] + j * ir1.dim + a
        if uvu or y is None:  # y read whole: every v ("uvu"), or u = sub-block j with one channel ("uuu")
            m2 = y_at[(ins.i_in2, True)] + (v if uvu else j) * ir2.dim + b
        else:
            m2 = y_at[(ins.i_in2, False)] + j * ir2.dim + b
        mu = out_at[(ins.i_out, False)] + j * ir_out.dim + c
        if weights is None:
            w = None
        elif ins.has_weight:
            w = weights.columns[index] + (j * mul2 + v if uvu else j)
        else:
            w = np.full(shape, weights.ones)
        arrays = [np.broadcast_to(t, shape).ravel() for t in (m1, m2, mu)]
        arrays.append(None if w is None else np.broadcast_to(w, shape).ravel())
        arrays.append(np.broadcast_to(C, shape).ravel())
        pieces.append(arrays)
    return [None if parts[0] is None else np.concatenate(parts) for parts in zip(*pieces)]


def mode_paths(mode: str, mul1: int, mul2: int, mul_out: int) -> tuple:
    """The paths of an instruction in ``mode``: four int64 arrays, one entry per path, of the multiplicity read
    in the first and second input, the multiplicity of the output written and the path's weight (its index in
    the instruction's weights, row-major over e3nn's ``path_shape``). Pairs ``u < v`` ("uvu<v", "u<vw") are numbered as ``torch.triu_indices``."""
    u, v, w = np.arange(mul1), np.arange(mul2), np.arange(mul_out)
    if mode in ("uvu<v", "u<vw"):
        u, v = np.triu_indices(mul1, 1)
        q = np.arange(len(u))
        if mode == "uvu<v":
            return u, v, q, q
        return np.repeat(u, mul_out), np.repeat(v, mul_out), np.tile(w, len(q)), np.arange(len(q) * mul_out)
    if mode == "uuu":
        return u, u, u, u
    if mode == "uuw":
        return np.repeat(u, mul_out), np.repeat(u, mul_out), np.tile(w, mul1), np.arange(mul1 * mul_out)
    if mode == "uvw":
        uu, vv, ww = (t.ravel() for t in np.meshgrid(u, v, w, indexing="ij"))
        return uu, vv, ww, np.arange(len(uu))
    uu, vv = (t.ravel() for t in np.meshgrid(u, v, indexing="ij"))
    out = {"uvu": uu, "uvv": vv, "uvuv": uu * mul2 + vv}[mode]
    return uu, vv, out, np.arange(len(uu))


def _column_map(layout: Layout) -> ColumnMap:
    """Where each column of a channel operand lies in the e3nn-layout tensor: column ``offset + j`` of a
    segment at ``start + j`` of channel 0, one channel further on ``width(U)`` columns (0 when shared)."""
    base, step = [], []
    for s in layout.segments:
        w = s.width(layout.channels)
        base += [s.start + j for j in range(w)]
        step += [0 if s.shared else w] * w
    return ColumnMap(tuple(base), tuple(step), layout.size)


def _weight_map(weights: WeightLayout) -> ColumnMap:
    """The weight operand's map into e3nn's ``weight[..., weight_numel]`` (the column of ones reads 1)."""
    column_map = _column_map(weights.layout)
    if weights.ones is None:
        return column_map
    return ColumnMap(column_map.base + (ONE,), column_map.step + (0,), column_map.width)


def channel_rule(plan: Plan, in2_dim: int) -> Optional[ChannelRule]:
    """The :class:`~sparse_accumulation.descriptors.channel_rules.ChannelRule` of a plan: its rule on ``plan.channels``
    channels, reading and writing e3nn's tensors in place (``x``, ``y`` of ``in2_dim`` columns, the weights,
    the output), with the plan's coefficients as constants; None when the plan computes nothing."""
    if plan.rule is None:
        return None
    y = (ColumnMap(tuple(range(in2_dim)), (0,) * in2_dim, in2_dim) if plan.y is None else _column_map(plan.y))
    weights = None if plan.weights is None else _weight_map(plan.weights)
    return ChannelRule(plan.rule, plan.channels, (_column_map(plan.x), y, weights, _column_map(plan.out)),
                       plan.coefficients)
