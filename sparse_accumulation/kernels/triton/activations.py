"""SiLU's second derivatives in one Triton kernel (CUDA; CPU tensors under ``TRITON_INTERPRET=1``): reads
``x``, ``g`` and ``gg`` once and writes both gradients, where torch's formula makes a dozen passes over
tensors of the same size (the radial networks' activations over every edge in a training step with forces).
"""
from __future__ import annotations

import torch

from .. import accumulation_dtype

try:  # triton is optional (sparse_accumulation.backends.is_available says whether it runs)
    import triton

    from . import build, launch
except Exception:  # pragma: no cover - depends on the environment
    triton = None

_INT32_LIMIT = 2**31 - 1
BLOCK = 1024

_SOURCE = '''
import triton
import triton.language as tl


def {name}(X, G, GG, DX, DG, N, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < N
    x = tl.load(X + offsets, mask=mask, other=0).to({acc})
    g = tl.load(G + offsets, mask=mask, other=0).to({acc})
    gg = tl.load(GG + offsets, mask=mask, other=0).to({acc})
    s = 1 / (1 + tl.exp(-x))
    one_minus_s = 1 - s
    first = s * (1 + x * one_minus_s)
    second = s * one_minus_s * (2 + x * (1 - 2 * s))
    tl.store(DX + offsets, (gg * g * second).to(DX.dtype.element_ty), mask=mask)
    tl.store(DG + offsets, (gg * first).to(DG.dtype.element_ty), mask=mask)
'''


def _kernel(acc: str):
    def make():
        name = build.kernel_name("silu_second_order", acc)
        return build.fixed_kernel(_SOURCE.format(name=name, acc=acc), name, ["N"], {"BLOCK": BLOCK}, 4)

    return build.cached(("silu_second_order", acc), make)


def silu_second_order(x: torch.Tensor, g: torch.Tensor, gg: torch.Tensor):
    """``(gg * g * silu''(x), gg * silu'(x))`` (see :func:`..torch.activations.silu_second_order`) for three
    tensors of one shape, dtype and device, or None where an eager call's kernel is still compiling
    (:func:`.launch.ready`): the caller computes them otherwise meanwhile."""
    x, g, gg = (t.contiguous() for t in (x, g, gg))
    dx, dg = torch.empty_like(x), torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return dx, dg
    acc = "tl.float64" if accumulation_dtype(x.dtype) == torch.float64 else "tl.float32"
    kernel = _kernel(acc)
    pointers, ints = [x, g, gg, dx, dg], [n]

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK"]),)

    if not launch.ready(kernel, grid, pointers, ints):
        return None
    launch.launch(kernel, grid, pointers, ints, device=x.device, small=n <= _INT32_LIMIT)
    return dx, dg
