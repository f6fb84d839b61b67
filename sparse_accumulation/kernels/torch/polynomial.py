"""Polynomial kernels in plain torch (any device): the contract of :mod:`sparse_accumulation.kernels` for
the polynomial operation.
"""
from __future__ import annotations

import torch

from .. import accumulation_dtype

#: elements of the per-node products held at once
CHUNK_ELEMENTS = 1 << 22


def _columns(slot, channels: int, device) -> torch.Tensor:
    return torch.as_tensor(slot.map.columns(channels), device=device)


def _factor_table(program, terms):
    """``(component, coefficient, factor columns [T, F])`` of terms; factors index the stacked operand values,
    padded with the last row (a row of ones)."""
    offsets, total = [], 0
    for slot in program.operands:
        offsets.append(total)
        total += slot.size
    degree = max((len(f) for _, _, f in terms), default=1)
    rows = [[offsets[s] + m for s, m in f] + [total] * (degree - len(f)) for _, _, f in terms]
    return ([c for c, _, _ in terms], [v for _, v, _ in terms], rows, total)


def run(program, tensors, elements, outputs) -> tuple:
    """See the module docstring. Materialises per-node products in chunks: for validation and as the
    portable fallback, not for speed."""
    operand = next(t for t in tensors if t is not None)
    device, dtype = operand.device, accumulation_dtype(operand.dtype)
    B, N, E = program.channels, len(elements), elements.num_elements
    node_element = elements.tensor
    results = []
    values = []
    for slot, t in zip(program.operands, tensors):
        cols = _columns(slot, B, device)
        values.append(None if t is None else t.to(dtype)[:, cols])  # [rows, size, B]
    for j in outputs:
        slot = program.outputs[j]
        terms = program.terms[j]
        rows_out = N if slot.kind == "lane" else E
        total = torch.zeros(rows_out, slot.size, B, dtype=dtype, device=device)
        if terms and N:
            component, coefficient, table, ones = _factor_table(program, terms)
            component = torch.as_tensor(component, device=device)
            coefficient = torch.as_tensor(coefficient, dtype=dtype, device=device)
            table = torch.as_tensor(table, device=device)
            step = max(1, CHUNK_ELEMENTS // max(1, table.numel() * B))
            for start in range(0, N, step):
                nodes = slice(start, min(start + step, N))
                own = node_element[nodes]
                parts = []
                for slot_s, v in zip(program.operands, values):
                    if v is None:
                        parts.append(torch.zeros(own.shape[0], slot_s.size, B, dtype=dtype, device=device))
                    else:
                        parts.append(v[nodes] if slot_s.kind == "lane" else v[own])
                parts.append(torch.ones(own.shape[0], 1, B, dtype=dtype, device=device))
                stacked = torch.cat(parts, 1)
                products = stacked[:, table, :].prod(2) * coefficient[None, :, None]  # [n, T, B]
                per_node = torch.zeros(own.shape[0], slot.size, B, dtype=dtype, device=device)
                per_node.index_add_(1, component, products)
                if slot.kind == "lane":
                    total[nodes] = per_node
                else:
                    total.index_add_(0, own, per_node)
        out = torch.zeros(rows_out, slot.width, dtype=dtype, device=device)
        out[:, _columns(slot, B, device)] = total
        results.append(out.to(operand.dtype))
    return tuple(results)
