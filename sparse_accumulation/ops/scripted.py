"""Checks that the modules' TorchScript paths make before they call the registered ops.

The registered ops trust their operands' widths, dtypes and devices (the public functions check them in
Python, which TorchScript cannot call), so a scripted forward checks them with these functions, which
TorchScript compiles. Index values are not read (as under ``torch.compile``): the kernels skip rows out of
range, and torch's own indexing raises.
"""
from __future__ import annotations

from typing import List, Optional

import torch


def check_width(name: str, t: torch.Tensor, width: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``t`` has a last dimension of ``width`` (``layout`` describes the expected
    shape in the message)."""
    if t.dim() < 1 or t.shape[-1] != width:
        raise ValueError(f"{name} must be {layout}, got shape {t.shape}")


def check_like(name: str, t: torch.Tensor, like_name: str, like: torch.Tensor,
               dtype: Optional[torch.dtype] = None) -> None:
    """Raise ``TypeError`` unless ``t`` has the dtype of ``like`` (or ``dtype``), ``ValueError`` unless it is on
    ``like``'s device."""
    if dtype is None and t.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {dtype_name(t.dtype)} but {like_name} has dtype {dtype_name(like.dtype)}; "
                        "they must match")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype_name(dtype)} with {like_name} of dtype "
                        f"{dtype_name(like.dtype)}, got {dtype_name(t.dtype)}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but {like_name} is on {like.device}; all tensors must be on one "
                         "device")


def dtype_name(dtype: torch.dtype) -> str:
    """``str(dtype)`` of the dtypes the modules take (TorchScript formats a dtype as its number)."""
    for known, name in ((torch.float64, "torch.float64"), (torch.float32, "torch.float32"),
                        (torch.float16, "torch.float16"), (torch.bfloat16, "torch.bfloat16"),
                        (torch.complex128, "torch.complex128"), (torch.complex64, "torch.complex64")):
        if dtype == known:
            return name
    return f"number {dtype} (not a floating dtype)"


def check_index(name: str, index: Optional[torch.Tensor]) -> None:
    """Raise ``TypeError`` / ``ValueError`` unless ``index`` is None or a 1-D integer tensor."""
    if index is not None:
        if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
            raise TypeError(f"{name} must have an integer dtype, got {dtype_name(index.dtype)}")
        if index.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {index.shape}")


def broadcast_shapes(a: List[int], b: List[int]) -> List[int]:
    """The broadcast of two shapes, for TorchScript (``torch.broadcast_shapes`` does not script before torch
    2.13); ``ValueError`` where they do not broadcast."""
    n = max(len(a), len(b))
    out: List[int] = []
    for i in range(n):
        da = a[i - n + len(a)] if i - n + len(a) >= 0 else 1
        db = b[i - n + len(b)] if i - n + len(b) >= 0 else 1
        if da != db and da != 1 and db != 1:
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(db if da == 1 else da)
    return out
