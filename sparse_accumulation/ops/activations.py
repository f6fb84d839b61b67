"""SiLU with its second derivative in one kernel: :func:`silu`.

torch's ``silu`` differentiates its backward (``silu_backward``) by a formula of about a dozen elementwise
operations, each a pass over a tensor of the activation's size; a training step on forces runs it for every
activation of the radial networks, over every edge. Here the first derivative is torch's own fused kernel and
the second is one Triton kernel on CUDA (torch's formula elsewhere, while the kernel compiles, and wherever a
third derivative is asked for, so that every order stays differentiable). Not a registered op: while
``torch.compile`` or ``torch.export`` trace, :func:`silu` is ``torch.nn.functional.silu`` (inductor fuses its
derivatives itself).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import backends


def silu_second_order(x: torch.Tensor, g: torch.Tensor, gg: torch.Tensor):
    """``(d/dx, d/dg)`` of ``g * silu'(x)`` for its output gradient ``gg``, differentiable where grad mode is on."""
    portable = backends.kernel_module("activations", "torch")
    if not torch.is_grad_enabled() and x.shape == g.shape == gg.shape and x.dtype == g.dtype == gg.dtype:
        kernels = backends.kernel_module("activations", backends.resolved(None, x.device))
        if kernels is not portable:
            result = kernels.silu_second_order(x, g, gg)
            if result is not None:  # None: the kernel is still compiling
                return result
    return portable.silu_second_order(x, g, gg)


class _SiLUBackward(torch.autograd.Function):
    """``g * silu'(x)``, whose own gradients are :func:`silu_second_order`."""

    @staticmethod
    def forward(ctx, g, x):
        ctx.save_for_backward(g, x)
        return torch.ops.aten.silu_backward(g, x)

    @staticmethod
    def backward(ctx, gg):
        g, x = ctx.saved_tensors
        dx, dg = silu_second_order(x, g, gg)
        return dg, dx


class _SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.silu(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return _SiLUBackward.apply(g, x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.silu(x)`` (``x * sigmoid(x)``, elementwise), with gradients of every order; the
    second derivative runs in one pass on CUDA.

    Args:
        x: a floating tensor of any shape and device.

    Returns:
        A new tensor of ``x``'s shape, dtype and device.
    """
    if torch.compiler.is_compiling() or not (torch.is_grad_enabled() and x.requires_grad):
        return F.silu(x)
    return _SiLU.apply(x)
