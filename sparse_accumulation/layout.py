"""Broadcasting of the leading dimensions: ``[..., M]`` operands as the kernels' 3-D ``[A, B, M]`` views.

The leading dimensions of the operands broadcast as in torch. The broadcast shape is folded into at most
two dimensions ``(A, B)`` (adjacent dimensions merge where every operand can be addressed with one stride
over both), and each operand becomes a view ``[A_i, B_i, M]`` of its own storage with ``A_i``
either ``A`` or 1 (likewise ``B_i``): a shared operand is read in place, never expanded into memory. The
kernels then produce the output ``[A, B, O]`` and gradients of each operand's own ``[A_i, B_i, M]`` shape,
summed over what it broadcasts.

Patterns that do not fold into two dimensions (for example ``[A, 1, C]`` against ``[A, B, C]``) fall back to
expanding the operands that broadcast, which costs memory but stays correct.
"""
from __future__ import annotations

import math

import torch


def broadcast_shape(names, tensors) -> tuple:
    """The broadcast of the operands' leading shapes (all but the last dimension).

    Raises:
        ValueError: the leading shapes do not broadcast; the message names the operands and their shapes.
    """
    shapes = [tuple(t.shape[:-1]) for t in tensors]
    first = shapes[0]
    if all(s == first for s in shapes[1:]):
        return first
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        described = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, tensors))
        raise ValueError(f"the leading dimensions (all but the last) of {described} do not broadcast") from None


def _aligned(t: torch.Tensor, shape: tuple) -> tuple:
    """Sizes and strides of ``t``'s leading dimensions, right-aligned to ``shape``; 0 where ``t`` broadcasts."""
    lead = t.dim() - 1
    missing = len(shape) - lead
    sizes, strides = [1] * missing, [0] * missing
    for d in range(lead):
        size = t.shape[d]
        sizes.append(size)
        strides.append(t.stride(d) if size != 1 else 0)
    return sizes, strides


def _fold(shape: tuple, operands: list):
    """Merge adjacent dimensions of ``shape`` where every operand allows it; returns ``(sizes, per operand
    [(size, stride)])`` over the merged dimensions (dimensions of size 1 dropped), or None beyond two."""
    dims = [d for d, n in enumerate(shape) if n != 1]
    groups = []  # [size, [(size_i, stride_i) per operand]]
    for d in dims:
        entry = [(sizes[d], strides[d]) for sizes, strides in operands]
        if groups:
            size, last = groups[-1]
            mergeable = all((s == 1 and ls == 1) or (s != 1 and ls != 1 and lt == t * shape[d])
                            for (s, t), (ls, lt) in zip(entry, last))
            if mergeable:
                groups[-1] = [size * shape[d], [(ls if ls == 1 else ls * s, t) for (s, t), (ls, lt) in
                                                zip(entry, last)]]
                continue
        groups.append([shape[d], entry])
    if len(groups) > 2:
        return None
    while len(groups) < 2:  # a single dimension is the outer one: B = 1 needs no division in the kernels
        groups.append([1, [(1, 0)] * len(operands)])
    return groups


def as_rows(tensors, names) -> tuple:
    """``(views, lead)``: the operands as ``[A_i, B_i, M]`` views and the broadcast leading shape.

    Args:
        tensors: operands ``[..., M_i]`` (at least one dimension each) whose leading dimensions broadcast.
        names: their names, for error messages.

    Raises:
        ValueError: the leading dimensions do not broadcast.
    """
    lead = broadcast_shape(names, tensors)
    if all(t.dim() == 2 and t.shape[0] == lead[0] for t in tensors) and len(lead) == 1:
        return tuple(t.unsqueeze(1) for t in tensors), lead
    if math.prod(lead) == 0:  # nothing to compute; expanding costs nothing and keeps autograd's view of it
        return tuple(t.expand(*lead, t.shape[-1]).reshape(0, 1, t.shape[-1]) for t in tensors), lead
    groups = _fold(lead, [_aligned(t, lead) for t in tensors])
    if groups is None:  # no two-dimensional addressing: expand what broadcasts, then fold again
        tensors = [t.expand(*lead, t.shape[-1]).contiguous() if t.shape[:-1] != lead else t for t in tensors]
        groups = _fold(lead, [_aligned(t, lead) for t in tensors])
        if groups is None:
            tensors = [t.reshape(*lead, t.shape[-1]).contiguous() for t in tensors]
            groups = _fold(lead, [_aligned(t, lead) for t in tensors])
    (_, outer), (_, inner) = groups
    # reshape is a view here (the folding above checked the strides) and keeps autograd's view tracking
    views = tuple(t.reshape(outer[i][0], inner[i][0], t.shape[-1]) for i, t in enumerate(tensors))
    return views, lead


def gradient_like(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A kernel's gradient ``[A_i, B_i, M]`` (contiguous) as a tensor of ``like``'s shape."""
    return grad.reshape(like.shape)
