"""The registered graph ops ``torch.ops.sparse_accumulation.graph_accumulate`` and ``graph_coefficient_sums``.

``graph_accumulate(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges, implementation,
reduction) -> [outputs]`` computes outputs of a :class:`~sparse_accumulation.descriptors.channel_rules.ChannelRule` (named
by its key ``crule``) over ``edges`` edges, as the graph kernel contract (:mod:`sparse_accumulation.kernels`) describes: per slot
(X1, X2, W, out: ``T``) an input tensor or None, the index of its rows (None: row ``e`` of edge ``e``), and for an
output gathered by an index, its segments (``offsets``, ``orders``: see :func:`sparse_accumulation.indices.segments`) or None; ``outputs``
lists the output slots, ``rows`` the row count of every slot. An output slot without index gets one row per
edge (or, if ``rows`` says 1, the sum over the edges); one with an index is summed into its rows through its
segments, made here when not given (``reduction="segment"``: deterministic) or, on CUDA, with atomic adds
(``reduction="atomic"``; on the CPU it sums by segments too).

``graph_coefficient_sums(X1, X2, W, T, indices, crule, edges, implementation) -> [nnz]``: the sum over edges and
channels of the product of all four slots, per nonzero (the gradient of C).

The two ops are closed under differentiation: the gradient of output ``j`` with respect to the tensor of slot
``s`` is ``graph_accumulate`` with the output gradient in slot ``j`` and output slot ``s``; with respect to C,
``graph_coefficient_sums`` with the gradient in slot ``j``; the gradient of ``graph_coefficient_sums`` is
``graph_accumulate`` with its output gradient as coefficients. Every order of derivative runs on the kernels.
``graph_accumulate`` is a ``torch.library.triton_op``: with the Triton implementation on CUDA,
``torch.compile`` sees its kernel launches.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from ... import backends
from ...descriptors.channel_rules import ChannelRule
from ...indices import segments
from ...kernels import ATOMIC, EDGE, SEGMENT
from . import derivatives

_NAMESPACE = "sparse_accumulation"
REDUCTIONS = (SEGMENT, ATOMIC)


def _kernel_operand(t: Optional[Tensor], direct: bool, edges: int) -> Optional[Tensor]:
    """An operand as the kernels read it: unit column stride, and a slot without index with one row per edge
    (a single row, or rows that are all one row, read with row stride 0)."""
    if t is None:
        return None
    if direct and (t.shape[0] != edges or t.stride(0) == 0) and t.shape[0] >= 1:
        return t[:1].contiguous().expand(edges, -1)
    return t if t.stride(-1) == 1 else t.contiguous()


def _grid_slots(crule, tensors, indices, offsets, outputs) -> tuple:
    """The slots whose index gives the grid's segments (empty: the grid is the edges).

    A grid by an index sums the outputs it gathers in segments and reads the operands it gathers once per row;
    an output gathered by another index is written per edge and summed afterwards (:func:`segment_sum` of the
    kernels: twice its width moved per edge). The index that saves the most per edge is chosen, among those
    of the outputs and those whose segments are at hand."""
    groups = {}
    for s in range(4):
        if indices[s] is not None and (s in outputs or tensors[s] is not None):
            groups.setdefault(id(indices[s]), []).append(s)
    gathered_outputs = [s for s in outputs if indices[s] is not None]
    best, best_score = (), None
    for slots in groups.values():
        if not any(s in gathered_outputs for s in slots) and offsets[slots[0]] is None:
            continue
        score = sum(crule.maps[s].width for s in slots)
        score -= sum(2 * crule.maps[s].width for s in gathered_outputs if s not in slots)
        if best_score is None or score > best_score:
            best, best_score = tuple(slots), score
    return best


def run(kernels, tensors, C, indices, offsets, orders, crule, outputs, rows, edges, reduction, traceable):
    """One kernel call (and, for outputs gathered by another index than the grid's, a segment sum each)."""
    crule = ChannelRule.from_key(crule)
    tensors = [_kernel_operand(t, indices[s] is None, edges) for s, t in enumerate(tensors)]
    atomic = reduction == ATOMIC and C.device.type == "cuda"
    grid = () if atomic else _grid_slots(crule, tensors, indices, offsets, outputs)
    segment_data = None
    if grid:
        first = grid[0]
        segment_data = ((offsets[first], orders[first]) if offsets[first] is not None
                        else segments(indices[first], rows[first]))
    plan, summed = [], []
    for slot in outputs:
        if indices[slot] is None:
            plan.append((slot, EDGE, edges))
        elif atomic:
            plan.append((slot, ATOMIC, rows[slot]))
        elif slot in grid:
            plan.append((slot, SEGMENT, rows[slot]))
        else:
            plan.append((slot, EDGE, edges))
            summed.append(slot)
    hoisted = tuple(s for s in grid if s not in outputs)
    produced = kernels.run(crule, tensors, indices, tuple(plan), C, edges=edges, segments=segment_data,
                           hoisted=hoisted, traceable=traceable)
    results = dict(zip(outputs, produced))
    for slot in summed:
        own = ((offsets[slot], orders[slot]) if offsets[slot] is not None else segments(indices[slot], rows[slot]))
        results[slot] = kernels.segment_sum(results[slot], own, rows[slot], traceable=traceable)
    out = []
    for slot in outputs:
        t = results[slot]
        if indices[slot] is None and rows[slot] != edges:  # one row shared by every edge: its summed gradient
            t = t.sum(0, keepdim=True)
        out.append(t)
    return out


def fake_outputs(tensors, C, crule, outputs, rows):
    """Uninitialised tensors of the shapes, dtype and device of :func:`run`'s outputs."""
    crule = ChannelRule.from_key(crule)
    like = next((t for t in tensors if t is not None), C)
    return [like.new_empty((rows[s], crule.maps[s].width)) for s in outputs]


# opaque kernel op: every implementation but Triton-on-CUDA, inside the triton_op
_library = torch.library.Library(_NAMESPACE, "FRAGMENT")
_library.define("kernel_graph_accumulate(Tensor? X1, Tensor? X2, Tensor? W, Tensor? T, Tensor C, "
                "Tensor?[] indices, Tensor?[] offsets, Tensor?[] orders, str crule, SymInt[] outputs, "
                "SymInt[] rows, SymInt edges, str implementation, str reduction) -> Tensor[]")


def _kernel_graph_accumulate(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges,
                             implementation, reduction):
    """The outputs, with the kernels of ``implementation`` (one the graph op resolved stays itself)."""
    return run(backends.kernel_module("graph", backends.resolved(implementation, C.device)), [X1, X2, W, T], C,
               indices, offsets, orders, crule, outputs, rows, edges, reduction, False)


_library.impl("kernel_graph_accumulate", _kernel_graph_accumulate, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{_NAMESPACE}::kernel_graph_accumulate", lib=_library)
def _(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges, implementation, reduction):
    return fake_outputs([X1, X2, W, T], C, crule, outputs, rows)


_kernel_graph_accumulate_op = torch.ops.sparse_accumulation.kernel_graph_accumulate.default


@torch.library.triton_op(f"{_NAMESPACE}::graph_accumulate", mutates_args=())
def graph_accumulate(X1: Optional[Tensor], X2: Optional[Tensor], W: Optional[Tensor], T: Optional[Tensor],
                     C: Tensor, indices: List[Optional[Tensor]], offsets: List[Optional[Tensor]],
                     orders: List[Optional[Tensor]], crule: str, outputs: List[int], rows: List[int], edges: int,
                     implementation: str, reduction: str) -> List[Tensor]:
    """Outputs ``outputs`` of the channel rule of key ``crule`` with the tensors of slots X1, X2, W and out
    (``T``); see the module docstring."""
    name = backends.resolved(implementation, C.device)
    if name == "triton" and C.device.type == "cuda":
        return run(backends.kernel_module("graph", "triton"), [X1, X2, W, T], C, indices, offsets, orders, crule,
                   outputs, rows, edges, reduction, True)
    return _kernel_graph_accumulate_op(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges,
                                       name, reduction)


@torch.library.custom_op(f"{_NAMESPACE}::graph_coefficient_sums", mutates_args=())
def graph_coefficient_sums(X1: Optional[Tensor], X2: Optional[Tensor], W: Optional[Tensor], T: Tensor,
                           indices: List[Optional[Tensor]], crule: str, edges: int, implementation: str) -> Tensor:
    """Per nonzero, the sum over edges and channels of the product of the four slots (see the module)."""
    return coefficient_sums(X1, X2, W, T, indices, crule, edges)


def coefficient_sums(X1, X2, W, T, indices, crule, edges):
    """The coefficient sums (the gradient of C) on the portable torch kernels, for every implementation."""
    tensors = [_kernel_operand(t, indices[s] is None, edges) for s, t in enumerate((X1, X2, W, T))]
    return backends.kernel_module("graph", "torch").coefficient_sums(ChannelRule.from_key(crule), tensors, indices,
                                                                      edges=edges)


@graph_coefficient_sums.register_fake
def _(X1, X2, W, T, indices, crule, edges, implementation):
    return T.new_empty((ChannelRule.from_key(crule).rule.nnz,))


def _setup_accumulate(ctx, inputs, output):
    X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges, implementation, reduction = inputs
    ctx.set_materialize_grads(False)  # an output nothing depends on gets no gradient (not a tensor of zeros)
    derivatives.save(ctx, (X1, X2, W, T), C, indices, offsets, orders)
    ctx.args = (crule, list(outputs), list(rows), edges, implementation, reduction)


def _accumulate_grad(ctx, grads):
    return (derivatives.accumulate_gradients(ctx, grads, graph_accumulate, graph_coefficient_sums)
            + derivatives.list_gradients(ctx) + (None,) * 6)


graph_accumulate.register_autograd(_accumulate_grad, setup_context=_setup_accumulate)


def _setup_sums(ctx, inputs, output):
    X1, X2, W, T, indices, crule, edges, implementation = inputs
    derivatives.save(ctx, (X1, X2, W, T), None, indices, [None] * 4, [None] * 4)
    ctx.args = (crule, edges, implementation)


def _sums_grad(ctx, grad):
    return (*derivatives.sum_gradients(ctx, grad, graph_accumulate), derivatives.list_gradients(ctx)[0]) + (None,) * 3


graph_coefficient_sums.register_autograd(_sums_grad, setup_context=_setup_sums)
