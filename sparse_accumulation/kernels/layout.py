"""Broadcasting of the leading dimensions: how the kernels address ``[..., M]`` operands, without copies.

The operands' leading dimensions (all but the last) broadcast as in torch. Their broadcast shape ``lead`` is
folded into at most two dimensions ``(A, B)``: adjacent dimensions merge where every operand can be addressed
with one stride over both. Row ``r = a * B + b`` of operand ``i`` then starts at element
``a * s_a + b * s_b`` of its storage (from its data pointer), with ``s_a = 0`` or ``s_b = 0`` where it
broadcasts, and its component ``m`` at ``m * stride(-1)``. A :class:`Rows` holds this plan; it is plain
integers, computed from shapes and strides (no tensor is made), so the kernels read a shared operand in place.

Outputs are contiguous ``[*lead, M]``, which is the ``[A, B, M]`` row order; a gradient has the shape of its
operand, contiguous, which is its ``[A_i, B_i, M]`` row order (``A_i`` is ``A`` or 1, likewise ``B_i``).

Patterns that do not fold into two dimensions (for example ``[A, 1, C]`` against ``[A, B, C]``) need the
operands that broadcast expanded into memory first (:func:`plan` does it and says so), which costs memory but
stays correct.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Rows(NamedTuple):
    """The row space of a call and how each operand is addressed in it: ``lead``, the broadcast leading shape
    (the output is ``[*lead, M]``); ``A, B``, the folded row space of ``A * B`` rows; ``split``, the number of
    leading dimensions folded into ``A`` (``lead[split:]`` fold into ``B``); ``operands``, per operand
    ``(A_i, B_i, s_a, s_b)``: its extent in each folded dimension (``A`` or 1, ``B`` or 1) and its strides
    along them (0 where its extent is 1)."""

    lead: tuple
    A: int
    B: int
    split: int
    operands: tuple

    @property
    def count(self) -> int:
        """Number of rows, ``A * B``."""
        return self.A * self.B

    def strides_of(self, t: torch.Tensor):
        """``(s_a, s_b)`` of a tensor of shape ``[*lead, M]`` in this row space, or None where its strides
        do not fold the same way (then a contiguous copy folds)."""
        folded = _fold_one(t, self.lead, self.split)
        return None if folded is None else folded[2:]


def broadcast_shape(names, tensors) -> tuple:
    """The broadcast of the operands' leading shapes (all but the last dimension).

    Raises:
        ValueError: the leading shapes do not broadcast; the message names the operands and their shapes.
    """
    first = tensors[0].shape[:-1]
    if all(t.shape[:-1] == first for t in tensors[1:]):
        return tuple(first)
    try:
        return tuple(torch.broadcast_shapes(*(t.shape[:-1] for t in tensors)))
    except RuntimeError:
        described = ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, tensors))
        raise ValueError(f"the leading dimensions (all but the last) of {described} do not broadcast") from None


def _group(sizes, strides, first: int, last: int):
    """``(extent, stride)`` of dimensions ``first:last`` folded into one, or None where they do not fold.

    Dimensions of size 1 are skipped; an operand of size 1 in every dimension has extent 1 and stride 0."""
    extent, stride = 1, 0
    for d in range(first, last):
        size = sizes[d]
        if size == 1:
            continue
        if extent != 1 and stride != strides[d] * size:
            return None
        extent, stride = extent * size, strides[d]
    return extent, stride


def _aligned(t: torch.Tensor, n: int) -> tuple:
    """Sizes and strides of ``t``'s leading dimensions, right-aligned to ``n`` dimensions."""
    missing = n - (t.dim() - 1)
    return (1,) * missing + tuple(t.shape[:-1]), (0,) * missing + tuple(t.stride()[:-1])


def _fold_one(t: torch.Tensor, lead: tuple, split: int):
    """``(A_i, B_i, s_a, s_b)`` of ``t`` for the folding at ``split``, or None."""
    sizes, strides = _aligned(t, len(lead))
    outer = _group(sizes, strides, 0, split)
    inner = _group(sizes, strides, split, len(lead))
    if outer is None or inner is None:
        return None
    return outer[0], inner[0], outer[1], inner[1]


def _extent(sizes) -> int:
    total = 1
    for n in sizes:
        total *= n
    return total


def _find(tensors, lead: tuple):
    """The :class:`Rows` of the first folding that every operand fits, or None. Foldings are tried best
    first: everything outer (``B == 1``, the kernels need no division), then each boundary between leading
    dimensions. An operand fits if it folds there and covers each folded dimension entirely or not at all."""
    for split in [len(lead)] + list(range(len(lead) - 1, 0, -1)):
        A, B = _extent(lead[:split]), _extent(lead[split:])
        folded = []
        for t in tensors:
            f = _fold_one(t, lead, split)
            if f is None or f[0] not in (1, A) or f[1] not in (1, B):
                break
            folded.append(f)
        else:
            return Rows(lead, A, B, split, tuple(folded))
    return None


def _same_contiguous(tensors):
    """The plan of contiguous operands of one leading shape (the common case, decided with few calls)."""
    lead = tuple(tensors[0].shape)[:-1]
    A = 1
    for size in lead:
        A *= size
    if A < 2:
        return None
    folded = []
    for t in tensors:
        shape = tuple(t.shape)
        if shape[:-1] != lead or not t.is_contiguous():
            return None
        folded.append((A, 1, shape[-1], 0))
    return Rows(lead, A, 1, len(lead), tuple(folded))


def plan(tensors, names) -> tuple:
    """``(tensors, rows)``: the :class:`Rows` of operands ``[..., M_i]`` whose leading dimensions broadcast.

    ``tensors`` comes back unchanged, except in the rare patterns that fold into no two dimensions, where the
    operands that broadcast are replaced by expanded copies.

    Raises:
        ValueError: the leading dimensions do not broadcast.
    """
    rows = _same_contiguous(tensors)
    if rows is not None:
        return tensors, rows
    lead = broadcast_shape(names, tensors)
    if 0 in lead:  # no rows: nothing is read, outputs are empty and gradients zero
        return tuple(tensors), Rows(lead, 0, 1, len(lead), ((0, 1, 0, 0),) * len(tensors))
    rows = _find(tensors, lead)
    if rows is None:
        tensors = tuple(t if tuple(t.shape[:-1]) == lead else t.expand(*lead, t.shape[-1]).contiguous()
                        for t in tensors)
        rows = _find(tensors, lead)
        if rows is None:
            tensors = tuple(t.contiguous() for t in tensors)
            rows = _find(tensors, lead)
    return tuple(tensors), rows


def output_rows(t: torch.Tensor, rows: Rows) -> tuple:
    """``(t, (A, B, s_a, s_b))`` for a full ``[*lead, M]`` tensor (an output gradient) in the row space:
    ``t`` itself where its strides fold like the plan's, else a contiguous copy."""
    if t.is_contiguous():  # the common case, without folding the strides
        M = t.shape[-1]
        return t, (rows.A, rows.B, M * rows.B if rows.A != 1 else 0, M if rows.B != 1 else 0)
    strides = rows.strides_of(t)
    if strides is None:
        t = t.contiguous()
        strides = rows.strides_of(t)
    return t, (rows.A, rows.B) + tuple(strides)


def view3(t: torch.Tensor, folded) -> torch.Tensor:
    """The ``[A_i, B_i, M]`` view of an operand described by ``folded = (A_i, B_i, s_a, s_b)``."""
    A_i, B_i, s_a, s_b = folded
    return t.as_strided((A_i, B_i, t.shape[-1]), (s_a, s_b, t.stride(-1)), t.storage_offset())
