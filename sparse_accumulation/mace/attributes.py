"""MACE's node attributes ``y``, read once per tensor to choose how the contraction gathers its weights.

One-hot rows and integer element indices name each node's element: the polynomial kernels then visit the
nodes by element, in tiles of one element (:class:`sparse_accumulation.indices.Elements`). Rows with at most one
nonzero are scaled one-hot rows; any other rows (or a ``y`` that requires grad) weigh every element, and the
weights are then gathered per node (:class:`Attributes`, :func:`prepare`).
"""
from __future__ import annotations

import contextlib
import threading
from typing import List, NamedTuple, Optional

import torch

from .. import indices
from ..indices import Elements, Memory

_prepared = Memory(64)
#: per thread: the list :func:`hoisted` records into, or None
_hoisting = threading.local()


class Attributes(NamedTuple):
    """How a module reads node attributes ``y`` (made by :func:`prepare`).

    Attributes:
        elements: the :class:`Elements` the kernels walk the nodes by.
        scale: None, or ``[N, 1]`` factors of the output rows, ``y[n, elements[n]]`` (rows with at most one
            nonzero that are not all one-hot; a zero row gives 0), in ``y``'s dtype.
        per_node: None, or ``y`` itself where the weights are per node, ``y @ P`` (rows with several nonzeros,
            or a ``y`` that requires grad); ``elements`` is then one element for every node.
    """

    elements: Elements
    scale: Optional[torch.Tensor]
    per_node: Optional[torch.Tensor]


def _one_element(nodes: int, device) -> Elements:
    return Elements(torch.zeros(nodes, dtype=torch.int64, device=device), 1, check=False)


def _nonzero_columns(y: torch.Tensor) -> torch.Tensor:
    """The column of each row's nonzero (of its largest magnitude; 0 for a zero row)."""
    return y.abs().argmax(1)


def _classified(y: torch.Tensor, num_elements: int) -> tuple:
    """``(elements, scale, per node)`` of ``y``, read once: one-hot rows, rows with at most one nonzero, or
    anything else (remembered, so it holds no reference to ``y``)."""
    nonzero = (y != 0).sum(1)
    one_hot, single = torch.stack([((nonzero == 1) & (y == 1).any(1)).all(), (nonzero <= 1).all()]).tolist()
    if not single:
        return _one_element(y.shape[0], y.device), None, True
    columns = _nonzero_columns(y)
    return Elements(columns, num_elements, check=False), None if one_hot else y.gather(1, columns[:, None]), False


def _unread(y: torch.Tensor, num_elements: int, name: str) -> Attributes:
    """The :class:`Attributes` of ``y`` made without reading it (see :func:`prepare`)."""
    if y.dim() == 1:
        return Attributes(Elements(y, num_elements, check=False), None, None)
    torch._assert_async(((y != 0).sum(1) <= 1).all(),
                        f"{name} has rows with several nonzeros: such node attributes need eager mode, or a "
                        f"{name} that requires grad, under torch.compile and CUDA graphs")
    columns = _nonzero_columns(y)
    return Attributes(Elements(columns, num_elements, check=False), y.gather(1, columns[:, None]), None)


def prepare(y, num_elements: int, name: str = "y") -> Attributes:
    """The :class:`Attributes` of ``y``: integer element indices ``[N]`` or node attributes ``[N, num_elements]``
    of a floating dtype (MACE's ``node_attrs``; any values: the result is linear in each row). An
    :class:`Elements` or :class:`Attributes` is taken as it is.

    * Integer indices and one-hot rows: the nodes' :class:`Elements`, nothing else.
    * Rows with at most one nonzero (scaled one-hot rows, zero rows of padding nodes): the elements of the
      nonzeros and the ``scale`` of every row.
    * Any other rows (soft or mixed), and any 2-D ``y`` that requires grad: ``per_node`` (the caller gathers
      the weights as ``y @ P``, differentiable with respect to ``y``).

    In eager mode ``y`` is read (one synchronisation on CUDA) and checked on first use, and what is made is
    found again by the tensor's identity and version (:mod:`sparse_accumulation.indices`). While ``torch.compile`` traces or a
    CUDA graph is captured nothing may be read: integer indices are not checked, and a 2-D ``y`` that does not
    require grad takes the scaled reading, with a device-side assertion that no row holds several nonzeros.

    Raises:
        TypeError: ``y`` is not a tensor, a 1-D ``y`` of a floating dtype, a 2-D ``y`` of a dtype not floating.
        ValueError: a 2-D ``y`` whose second dimension is not ``num_elements``, a ``y`` neither 1-D nor 2-D, an
            :class:`Elements` of another number of elements.
        IndexError: an element index out of range.
        RuntimeError: (asynchronously, from the device) rows with several nonzeros in a compiled or captured
            call with a ``y`` that does not require grad.
    """
    if isinstance(y, (Attributes, Elements)):
        prepared = y if isinstance(y, Attributes) else Attributes(y, None, None)
        width = prepared.elements.num_elements if prepared.per_node is None else prepared.per_node.shape[1]
        if width != num_elements:
            raise ValueError(f"{name} was prepared for {width} elements, expected {num_elements}")
        return prepared
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(y).__name__}")
    if y.dtype.is_complex or y.dtype == torch.bool:
        raise TypeError(f"{name} must hold element indices or floating node attributes, got dtype {y.dtype}")
    if y.dim() == 2:
        if not y.dtype.is_floating_point:
            raise TypeError(f"a 2-D {name} must be floating node attributes (e.g. one-hot rows), got dtype "
                            f"{y.dtype}")
        if y.shape[1] != num_elements:
            raise ValueError(f"{name} must be [nodes, num_elements={num_elements}], got shape {tuple(y.shape)}")
        if y.requires_grad:
            return Attributes(_one_element(y.shape[0], y.device), None, y)
    elif y.dim() != 1 or y.dtype.is_floating_point:
        raise ValueError(f"{name} must be 1-D integer element indices or 2-D node attributes, got shape "
                         f"{tuple(y.shape)} of dtype {y.dtype}")
    if torch.compiler.is_compiling() or indices.capturing(y):
        record = getattr(_hoisting, "record", None)
        if record is not None and not torch.compiler.is_compiling():
            found = _prepared.find((y,), (num_elements,))  # an eager call's reading of this unchanged y
            if found is not None:
                elements, scale, per_node = found
                prepared = Attributes(elements, scale, y if per_node else None)
                if not any(taken.elements is elements for _, _, taken in record):  # each reading refreshed once
                    record.append((y, num_elements, prepared))
                return prepared
        # nothing may be read: made unchecked (found again within a capture scope, see indices.capture_scope)
        return _prepared.get((y,), (num_elements, "unchecked"), lambda: _unread(y, num_elements, name))

    def make():
        if y.dim() == 2:
            return _classified(y, num_elements)
        try:
            return Elements(y, num_elements), None, False
        except IndexError as error:
            raise IndexError(str(error).replace("elements contains", f"{name} contains", 1)) from None

    elements, scale, per_node = _prepared.get((y,), (num_elements,), make)
    return Attributes(elements, scale, y if per_node else None)


@contextlib.contextmanager
def hoisted(record: List[tuple]):
    """Within this context (this thread), a CUDA graph capture of :func:`prepare` takes what an eager call read
    of the same, unchanged ``y`` (its elements, their tile tables, the rows' scale) instead of recording a
    reading of its own: the graph reads those tensors, made once, rather than rebuilding them in every replay.
    Each reading taken is appended to ``record`` once as ``(y, num_elements, Attributes)``; whoever replays the
    graph must call :func:`refresh` with it whenever ``y``'s values change."""
    previous = getattr(_hoisting, "record", None)
    _hoisting.record = record
    try:
        yield record
    finally:
        _hoisting.record = previous


def refresh(record: List[tuple]) -> bool:
    """Bring the readings :func:`hoisted` recorded up to date with each ``y``'s current values: read again
    (eagerly; one synchronisation per reading) and copied into the recorded tensors in place. False, with nothing
    written, where a reading changed its kind (one-hot rows that became scaled ones, or the reverse; rows with
    several nonzeros): a graph captured on the old reading computes something else and must be captured again.

    Raises:
        IndexError: 1-D element indices out of range.
    """
    fresh = []
    for y, num_elements, prepared in record:
        if y.dim() == 1:
            elements, scale, per_node = Elements(y, num_elements), None, False
        else:
            elements, scale, per_node = _classified(y, num_elements)
        if per_node or prepared.per_node is not None or (scale is None) != (prepared.scale is None):
            return False
        fresh.append((elements, scale))
    for (_, _, prepared), (elements, scale) in zip(record, fresh):
        prepared.elements.copy_from(elements)
        if scale is not None:
            prepared.scale.copy_(scale)
    return True
