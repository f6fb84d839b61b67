"""Graph kernels in plain torch (any device): the contract of :mod:`sparse_accumulation.kernels` for the
graph operation, computed over bounded chunks of edges.
"""
from __future__ import annotations

import torch

from ...descriptors.channel_rules import ONE
from .. import EDGE, accumulation_dtype

_INDEX_NAMES = ("m1", "m2", "w", "mu")
#: elements of the per-edge products held at once
CHUNK_ELEMENTS = 1 << 22


def _edge_values(crule, slot, tensor, index, chunk, dtype):
    """``[n, M, B]`` values of a slot's components and channels for the edges of ``chunk``."""
    column_map = crule.maps[slot]
    cols = torch.as_tensor(column_map.columns(crule.channels), device=tensor.device)
    n = chunk.stop - chunk.start
    if index is None:
        rows, valid = tensor[chunk], None
    else:
        rows_index = index[chunk]
        valid = (rows_index >= 0) & (rows_index < tensor.shape[0])
        rows = tensor[rows_index.clamp(0, max(tensor.shape[0] - 1, 0))] if tensor.shape[0] else \
            tensor.new_zeros(n, tensor.shape[1])
    rows = rows.to(dtype)
    if valid is not None:
        rows = rows * valid[:, None].to(dtype)
    values = rows[:, cols.clamp(min=0)]
    return torch.where(cols == ONE, torch.ones((), dtype=dtype, device=rows.device), values)


def _chunks(edges: int, nnz: int, channels: int):
    if not isinstance(edges, int):  # a symbolic size (a trace for dynamic shapes): one chunk of every edge
        return [slice(0, edges)]
    step = max(1, CHUNK_ELEMENTS // max(nnz * channels, 1))
    return [slice(start, min(start + step, edges)) for start in range(0, edges, step)]


def _products(crule, values, skip, coefficients):
    """``[n, nnz, B]``: per nonzero, ``C[k]`` times every slot's value but ``skip``'s."""
    rule = crule.rule
    result = coefficients[None, :, None]
    for slot, v in values.items():
        if slot != skip:
            result = result * v[:, rule.tensor(_INDEX_NAMES[slot], v.device), :]
    return result


def _rows_of(crule, slot, products, dtype):
    """``[n, width]`` rows of an output slot from the per-nonzero products ``[n, nnz, B]``."""
    column_map = crule.maps[slot]
    device = products.device
    targets = crule.rule.tensor(_INDEX_NAMES[slot], device)
    cols = torch.as_tensor(column_map.columns(crule.channels), device=device)[targets].reshape(-1)  # [nnz * B]
    kept = cols != ONE  # a constant column has no gradient
    out = torch.zeros(products.shape[0], column_map.width, dtype=dtype, device=device)
    return out.index_add_(1, cols[kept], products.reshape(products.shape[0], -1)[:, kept])


def run(crule, tensors, indices, outputs, C, *, edges: int, segments=None, hoisted=(), traceable: bool = False):
    """See the module docstring. Materialises the per-edge products in chunks: for validation and as the
    portable fallback, not for speed."""
    del segments, hoisted, traceable  # the index itself says where each edge goes
    operand = next(t for t in tensors if t is not None)
    dtype = accumulation_dtype(operand.dtype)
    results = [torch.zeros(rows, crule.maps[slot].width, dtype=dtype, device=operand.device)
               for slot, _, rows in outputs]
    coefficients = C.to(dtype)
    needed = {s for s in range(4) if tensors[s] is not None and any(j != s for j, _, _ in outputs)}
    for chunk in _chunks(edges, crule.rule.nnz, crule.channels):
        values = {s: _edge_values(crule, s, tensors[s], indices[s], chunk, dtype) for s in needed}
        for (slot, mode, rows), result in zip(outputs, results):
            edge_rows = _rows_of(crule, slot, _products(crule, values, slot, coefficients), dtype)
            if mode == EDGE:
                result[chunk] = edge_rows
                continue
            target = indices[slot][chunk]
            valid = (target >= 0) & (target < rows)
            result.index_add_(0, target[valid], edge_rows[valid])
    return tuple(r.to(operand.dtype) for r in results)


def segment_sum(Z, segments, rows: int, traceable: bool = False):
    """See the module docstring."""
    offsets, order = segments
    counts = offsets[1:] - offsets[:-1]
    target = torch.repeat_interleave(torch.arange(rows, device=Z.device), counts)
    first = offsets[0]
    edges = torch.arange(Z.shape[0], device=Z.device)[first:first + target.shape[0]] if order is None else \
        order[first:first + target.shape[0]]
    out = torch.zeros(rows, Z.shape[1], dtype=accumulation_dtype(Z.dtype), device=Z.device)
    return out.index_add_(0, target, Z[edges].to(out.dtype)).to(Z.dtype)


def coefficient_sums(crule, tensors, indices, *, edges: int):
    """See the module docstring (``tensors`` holds every slot of the rule)."""
    operand = next(t for t in tensors if t is not None)
    dtype = accumulation_dtype(operand.dtype)
    total = torch.zeros(crule.rule.nnz, dtype=dtype, device=operand.device)
    ones = torch.ones(crule.rule.nnz, dtype=dtype, device=operand.device)
    slots = [s for s in range(4) if crule.maps[s] is not None]
    for chunk in _chunks(edges, crule.rule.nnz, crule.channels):
        values = {s: _edge_values(crule, s, tensors[s], indices[s], chunk, dtype) for s in slots}
        total += _products(crule, values, None, ones).sum((0, 2))
    return total.to(operand.dtype)
