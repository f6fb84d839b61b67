"""Message passing: sparse accumulation with gathered operand rows and summed output rows, fused.

For edges ``e`` (a graph's ``(src, dst)`` pairs), the op computes per channel ``b``::

    out[indices_out[e], mu[k], b] += X1[indices_1[e], m1[k], b] * X2[indices_2[e], m2[k], b]
                                     * W[indices_w[e], w[k], b] * C[k]

where a missing index means the edge's own row (``e``) and a missing ``indices_out`` one output row per edge.
Nothing per edge is materialised: the kernels gather the rows they read and sum the rows they write
(the graph kernels of :mod:`sparse_accumulation.kernels`). Output rows are summed in segments (the edges sorted by their
output row, in a fixed order: deterministic) or, with ``reduction="atomic"`` on CUDA, by atomic adds.

An :class:`~sparse_accumulation.indices.Index` is a row index prepared once: its values checked, and the permutation that sorts it with its
segment offsets made once, so calls read nothing and never synchronise. Index tensors given directly are
turned into an :class:`~sparse_accumulation.indices.Index` on their first use in eager mode (one read of their values: a synchronisation
on CUDA) and found again by identity; under ``torch.compile`` they are used as they are (values unchecked,
segments computed on the device in the graph; out-of-range rows are skipped by the kernels, never accessed).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ... import backends
from ...descriptors.channel_rules import ChannelRule
from ...indices import Index, check_index_tensor, check_size, prepared_index
from ...kernels import SEGMENT
from ..dispatch import eager_applies
from . import eager, registered

__all__ = ["accumulate_graph", "message_indices", "checked_reduction", "REDUCTIONS"]

REDUCTIONS = registered.REDUCTIONS
_SLOT_NAMES = ("indices_1", "indices_2", "indices_w", "indices_out")
_OPERAND_NAMES = ("X1", "X2", "W")
_FLOAT_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def _index(name: str, value, size: int, device, edges: Optional[int]):
    """An :class:`Index` (eager) or an int64 tensor (while compiling) for an index argument; checks what can
    be checked without reading values."""
    if isinstance(value, Index):
        if value.size != size:
            raise ValueError(f"{name} was prepared for {value.size} rows but addresses {size}")
        tensor = value.tensor
    else:
        check_index_tensor(name, value)
        tensor = value
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device} but the operands are on {device}")
    if edges is not None and tensor.shape[0] != edges:
        raise ValueError(f"{name} has {tensor.shape[0]} entries but other indices have {edges}")
    if isinstance(value, Index):
        value.check_unchanged(name)
        return value
    if torch.compiler.is_compiling() or not isinstance(size, int) or torch._C._len_torch_dispatch_stack():
        # traced (torch.compile, make_fx, a dispatch mode): the values may be symbolic, none is read
        return tensor.to(torch.int64)
    return prepared_index(name, tensor, size)


def checked_reduction(reduction: Optional[str]) -> str:
    """``reduction`` (None: ``"segment"``), or ``ValueError`` for a name not in :data:`REDUCTIONS`."""
    reduction = SEGMENT if reduction is None else reduction
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def _check_operand(name: str, t, width: int, like, like_name: str):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must have a floating dtype (float16, bfloat16, float32 or float64), got {t.dtype}")
    if like is not None and t.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but {like_name} has dtype {like.dtype}; they must match")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but {like_name} is on {like.device}; all tensors must be on one "
                         "device")
    if t.dim() != 2 or t.shape[1] != width:
        raise ValueError(f"{name} must be [rows, {width}], got shape {tuple(t.shape)}")


def _check_coefficients(C, nnz: int, like) -> None:
    if not isinstance(C, torch.Tensor):
        raise TypeError(f"C must be a torch.Tensor, got {type(C).__name__}")
    if C.dtype != like.dtype or C.device != like.device:
        raise TypeError(f"C must have the dtype and device of X1 ({like.dtype}, {like.device}), "
                        f"got {C.dtype} on {C.device}")
    if C.dim() != 1 or C.shape[0] != nnz:
        raise ValueError(f"C must be 1-D with one coefficient per nonzero ({nnz}), got shape {tuple(C.shape)}")


def _edge_count(given, operands) -> int:
    """The number of edges: the common length of the indices (checked here, by name), else the rows of the
    operands."""
    lengths = []
    for name, value in zip(_SLOT_NAMES, given):
        if isinstance(value, Index):
            lengths.append((name, len(value)))
        elif value is not None:
            check_index_tensor(name, value)
            lengths.append((name, value.shape[0]))
    for name, n in lengths[1:]:
        if n != lengths[0][1]:
            raise ValueError(f"{name} has {n} entries but {lengths[0][0]} has {lengths[0][1]}; every index has "
                             "one entry per edge")
    if lengths:
        return lengths[0][1]
    return max((t.shape[0] for t in operands if t is not None), default=0)


def _graph_arguments(operands, given, size_out, names=_OPERAND_NAMES) -> tuple:
    """``(edges, rows, prepared)`` of a message-passing call: the edge count, the row count of every slot (X1,
    X2, W, out), and each given index prepared (an :class:`~sparse_accumulation.indices.Index`, or an int64
    tensor while compiling); every check that needs no index value, in the caller's argument names (``names``:
    the operands')."""
    indices_out = given[3]
    if indices_out is not None and size_out is None:
        raise ValueError("size_out is required with indices_out")
    edges = _edge_count(given, operands)
    for s, t in enumerate(operands):
        if t is not None and given[s] is None and t.shape[0] not in (edges, 1):
            raise ValueError(f"{names[s]} has {t.shape[0]} rows but there are {edges} edges "
                             f"(an operand without index has one row per edge, or one row)")
    if indices_out is None:
        if size_out is not None and size_out != edges:
            raise ValueError(f"without indices_out the output has one row per edge ({edges}), got size_out={size_out}")
        size_out = edges
    size_out = check_size("size_out", size_out)
    device = operands[0].device
    rows = [t.shape[0] if t is not None else 0 for t in operands] + [size_out]
    prepared = [None if value is None else _index(_SLOT_NAMES[s], value, rows[s], device, edges)
                for s, value in enumerate(given)]
    return edges, rows, prepared


def message_indices(x, y, indices_1, indices_2, indices_out, size_out, reduction=None) -> tuple:
    """The checked row indices (int64 tensors, or None where not given) of a message-passing call of two 2-D
    operands ``x`` and ``y`` that gathers rows and sums them by ``indices_out`` outside the kernels: the checks
    and errors of :func:`accumulate_graph` (``reduction`` checked too, though such a sum has one way only).

    Raises:
        TypeError, ValueError, IndexError: as :func:`accumulate_graph`.
    """
    checked_reduction(reduction)
    for name, t in (("x", x), ("y", y)):
        if t.dim() != 2:
            raise ValueError(f"with indices, {name} must be 2-D [rows, dim], got shape {tuple(t.shape)}")
    _, _, prepared = _graph_arguments([x, y, None], (indices_1, indices_2, None, indices_out), size_out,
                                      ("x", "y", "weight"))
    found = [p.tensor if isinstance(p, Index) else p for p in prepared]
    return found[0], found[1], found[3]


@torch.compiler.assume_constant_result
def _facts(key: str) -> tuple:
    """``(weighted, nnz, widths of X1, X2, W, out)`` of the channel rule of ``key`` (a constant while
    ``torch.compile`` traces: the rule itself is never traced)."""
    crule = ChannelRule.from_key(key)
    return crule.weighted, crule.rule.nnz, tuple(m.width if m is not None else 0 for m in crule.maps)


def accumulate_graph(crule, X1, X2, C, W=None, *, indices_1=None, indices_2=None, indices_w=None,
                     indices_out=None, size_out: Optional[int] = None, implementation=None,
                     reduction: Optional[str] = None, names: Tuple[str, str, str] = _OPERAND_NAMES) -> torch.Tensor:
    """Message passing under a channel rule: ``out[indices_out[e]] += rule(X1[indices_1[e]], X2[indices_2[e]],
    W[indices_w[e]])`` for every edge, fused (nothing per edge is materialised).

    Args:
        crule: the :class:`~sparse_accumulation.descriptors.channel_rules.ChannelRule` (rule, channels, column maps), or
            its key.
        X1, X2, W: ``[rows, width]`` floating tensors of one dtype and device (W for weighted rules only), widths
            as the rule's maps say; an operand without index has one row per edge, or one row that every edge
            reads.
        C: coefficients, one per nonzero of the rule, of the operands' dtype.
        indices_1, indices_2, indices_w: the row of X1 / X2 / W each edge reads (1-D integer tensors of one
            length, the number of edges, or :class:`Index` objects), None: the edge's own row.
        indices_out: the output row each edge adds to (or None: one output row per edge).
        size_out: number of output rows (required with ``indices_out``).
        implementation: as for :func:`sparse_accumulation.accumulate_rule`.
        reduction: ``"segment"`` (default: deterministic) or ``"atomic"`` (CUDA; atomic adds, no sorting): how
            rows that several edges add to are summed, in the output and in the gradients of gathered
            operands.
        names: what errors call X1, X2 and W (a layer's own argument names).

    Returns:
        ``[size_out (or edges), width of the output map]`` tensor of the operands' dtype; differentiable with
        respect to X1, X2, W and C to any order.

    Raises:
        TypeError: non-tensor or non-floating data, dtypes that differ, non-integer indices.
        ValueError: shapes or lengths that do not fit, devices that differ, ``size_out`` missing or wrong,
            W given for a rule without weights or missing for a weighted one, unknown reduction.
        IndexError: an index value out of range (eager mode; read once per index tensor).
    """
    if isinstance(crule, ChannelRule):
        crule = crule.key
    if not isinstance(crule, str):
        raise TypeError(f"crule must be a ChannelRule or its key, got {type(crule).__name__}")
    weighted, nnz, widths = _facts(crule)
    reduction = checked_reduction(reduction)
    if weighted != (W is not None):
        raise ValueError(f"{names[2]} is required for a weighted rule" if weighted else
                         f"{names[2]} was given but the rule has no weights")
    operands = [X1, X2, W]
    for s, name in enumerate(names):
        if operands[s] is not None:
            _check_operand(name, operands[s], widths[s], X1 if s else None, names[0])
    _check_coefficients(C, nnz, X1)
    given = (indices_1, indices_2, indices_w, indices_out)
    edges, rows, prepared = _graph_arguments(operands, given, size_out, names)
    device = X1.device
    indices = [p.tensor if isinstance(p, Index) else p for p in prepared]
    offsets, orders = [None] * 4, [None] * 4
    for s, p in enumerate(prepared):
        wanted = s == 3 or (operands[s] is not None and operands[s].requires_grad and torch.is_grad_enabled())
        if isinstance(p, Index) and reduction == SEGMENT and wanted:
            offsets[s], orders[s] = p.segments()
    tensors = [t if t is None or t.stride(1) == 1 else t.contiguous() for t in operands]
    C = C if C.is_contiguous() else C.contiguous()
    requested = backends.get_default_implementation() if implementation is None else implementation
    name = backends.resolved(requested, device)  # unknown or unavailable names raise here
    if eager_applies(*tensors, C):
        return eager.accumulate(*tensors, None, C, indices, offsets, orders, crule, [3], rows, edges, name,
                                reduction)[0]
    # the op resolves the requested name where it runs: an exported graph then holds "auto", not a kernel
    return registered.graph_accumulate(*tensors, None, C, indices, offsets, orders, crule, [3], rows, edges,
                                       requested, reduction)[0]
