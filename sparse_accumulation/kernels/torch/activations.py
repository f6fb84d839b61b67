"""SiLU's second derivatives in plain torch operations (any device; differentiable, so also the third order)."""
from __future__ import annotations

import torch


def silu_second_order(x: torch.Tensor, g: torch.Tensor, gg: torch.Tensor):
    """The gradients of ``silu_backward(g, x) = g * silu'(x)`` for its output gradient ``gg``:
    ``(d/dx, d/dg) = (gg * g * silu''(x), gg * silu'(x))``, tensors of ``x``'s shape and dtype.

    ``silu'(x) = s (1 + x (1 - s))`` and ``silu''(x) = s (1 - s) (2 + x (1 - 2 s))`` with ``s = sigmoid(x)``.
    """
    s = torch.sigmoid(x)
    one_minus_s = 1 - s
    first = s * (1 + x * one_minus_s)
    second = s * one_minus_s * (2 + x * (1 - 2 * s))
    return gg * g * second, gg * first
