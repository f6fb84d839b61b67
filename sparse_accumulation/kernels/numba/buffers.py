"""Reuse of large CPU output buffers, so that a training loop does not page-fault its outputs in every step.

A fresh multi-megabyte allocation is handed out by the C library as new pages, which the kernel zeroes on
first touch: for the 2x2->2 product on 200k rows that costs as much as the product itself. :func:`empty` keeps
large buffers after use and hands one out again once nothing references it any more (its reference count
says so: a tensor made with ``torch.from_numpy`` keeps its array alive, as does every view of it), so a
buffer is never shared between two live results. At most :data:`MAX_BYTES` are kept; the least recently used
free buffers go first. :func:`release` drops every kept buffer.
"""
from __future__ import annotations

import math
import sys
import threading
from collections import OrderedDict

import numpy as np
import torch

#: buffers smaller than this come from numpy directly (the C library reuses small blocks without new pages)
MIN_BYTES = 1 << 20
#: most bytes kept in buffers (free or in use)
MAX_BYTES = 1 << 30
#: the numpy dtype of each torch dtype that kernels compute in
NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}

_lock = threading.Lock()
_kept: "OrderedDict[int, np.ndarray]" = OrderedDict()  # id -> 1-D byte buffer, least recently used first


def _free(key: int) -> bool:
    """Whether nothing but ``_kept`` references the buffer (the other reference is getrefcount's argument)."""
    return sys.getrefcount(_kept[key]) == 2


def _kept_bytes() -> int:
    return sum(buffer.nbytes for buffer in _kept.values())


def empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and numpy ``dtype``, backed by a kept buffer where
    one is free and at most a quarter larger than needed."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype=dtype)
    dtype = np.dtype(dtype)
    with _lock:
        for key in list(_kept):
            if nbytes <= _kept[key].nbytes <= nbytes + nbytes // 4 and _free(key):
                _kept.move_to_end(key)
                return _kept[key][:nbytes].view(dtype).reshape(shape)
        for key in list(_kept):  # make room: drop free buffers, least recently used first
            if _kept_bytes() + nbytes <= MAX_BYTES:
                break
            if _free(key):
                del _kept[key]
        buffer = np.empty(nbytes, dtype=np.uint8)
        if _kept_bytes() + nbytes <= MAX_BYTES:
            _kept[id(buffer)] = buffer
    return buffer.view(dtype).reshape(shape)


def release() -> None:
    """Forget every kept buffer (those still in use stay alive with their results)."""
    with _lock:
        _kept.clear()


def tensor(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor: from a kept buffer (:func:`empty`) from :data:`MIN_BYTES` up,
    a plain ``torch.empty`` below."""
    if math.prod(shape) * dtype.itemsize < MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(empty(shape, NUMPY_DTYPES[dtype]))
