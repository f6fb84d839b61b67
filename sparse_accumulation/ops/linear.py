"""An e3nn-layout :class:`~sparse_accumulation.e3nn.Linear` with shared weights as one Triton kernel per call and
direction (:mod:`sparse_accumulation.kernels.triton.linear`), for small row counts on CUDA, where torch's form
costs a launch per transposing copy, product and concatenation (``sparse_accumulation.e3nn.linear``'s
``FUSED_MAX_ROWS`` decides).

:class:`LinearTables` describes one module's map for the kernel: forward (output irreps from input irreps) and
transposed (the inputs' gradient from the outputs'). The inputs' gradient is the transposed map through the
same differentiable function, so every order of derivatives is available; the weights' and biases' gradients
are torch operations, computed only where the backward pass needs them (a forces call does not).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from .. import backends


class LinearTables:
    """The kernel's tables of one linear map of irreps.

    Args:
        paths: per path ``(input offset, input channels u, output offset, output channels w, dimension d,
            weight offset, path weight)``; the path's weights are the ``[u, w]`` block at the weight offset.
        outputs: per output irrep ``(offset, channels, dimension, bias offset or -1)``, in the output's order.
        inputs: per input irrep ``(offset, channels, dimension)``.
        dim_in, dim_out: the widths.
    """

    def __init__(self, paths: List[tuple], outputs: List[tuple], inputs: List[tuple], dim_in: int, dim_out: int):
        self.paths, self.dim_in, self.dim_out = paths, dim_in, dim_out
        forward, transposed = [], []
        for offset, channels, d, bias_at in outputs:
            into = [(i, u, k, w, 1, alpha) for i, u, o, w, _, k, alpha in paths if o == offset]
            forward.append((offset, channels, d, bias_at if d == 1 else -1, into))
        for offset, channels, d in inputs:
            out_of = [(o, w, k, 1, w, alpha) for i, u, o, w, _, k, alpha in paths if i == offset]
            transposed.append((offset, channels, d, -1, out_of))
        self._layouts = {False: forward, True: transposed}
        self._made: Dict[tuple, tuple] = {}

    def tensors(self, transposed: bool, biases: bool, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor,
                                                                                     torch.Tensor, int, int]:
        """``(segments, paths, alpha, max_channels, max_contracted)`` of one direction (the forward one with or
        without its biases) on ``device``, made once (the first call on a device must not be a CUDA graph
        capture: it copies the tables from the host)."""
        key = (transposed, biases, device)
        found = self._made.get(key)
        if found is None:
            segments, rows, alpha = [], [], []
            for offset, channels, d, bias_at, into in self._layouts[transposed]:
                for m in range(d):
                    segments.append([offset, channels, d, m, len(rows), len(into), bias_at if biases else -1])
                    for source, contracted, k, stride_k, stride_n, weight in into:
                        rows.append([source, contracted, k, stride_k, stride_n])
                        alpha.append(weight)
            kernels = backends.kernel_module("linear", "triton")
            found = (torch.tensor(segments, dtype=torch.int32, device=device).reshape(-1, kernels.SEGMENT_FIELDS),
                     torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, kernels.PATH_FIELDS),
                     torch.tensor(alpha, dtype=torch.float32, device=device),
                     max([s[1] for s in segments], default=1),
                     max([r[1] for r in rows], default=1))
            self._made[key] = found
        return found

    def weight_gradient(self, u_side: torch.Tensor, w_side: torch.Tensor) -> torch.Tensor:
        """The flat weights' gradient ``alpha sum_{r, m} u_side[r, i + u d + m] w_side[r, o + w d + m]`` per path
        (the input and the output gradient of the forward map, or the reverse for the transposed one)."""
        rows = u_side.shape[0]
        blocks = sorted(((k, alpha * torch.einsum("rud,rwd->uw", u_side[:, i:i + u * d].reshape(rows, u, d),
                                                  w_side[:, o:o + w * d].reshape(rows, w, d)).reshape(-1))
                         for i, u, o, w, d, k, alpha in self.paths), key=lambda block: block[0])
        return torch.cat([b for _, b in blocks]) if blocks else u_side.new_zeros(0)

    def biased(self) -> List[Tuple[int, int, int]]:
        """``(output offset, channels, bias offset)`` of each output irrep with biases, in the biases' order."""
        return sorted(((offset, channels, bias_at) for offset, channels, _, bias_at, _ in self._layouts[False]
                       if bias_at >= 0), key=lambda block: block[2])

    def bias_gradient(self, grad: torch.Tensor, bias_numel: int) -> torch.Tensor:
        """The flat biases' gradient from the output gradient ``grad``."""
        pieces = [grad[:, offset:offset + channels].sum(0) for offset, channels, _ in self.biased()]
        return torch.cat(pieces) if pieces else grad.new_zeros(bias_numel)


def available(x: torch.Tensor) -> bool:
    """Whether the kernel can compute a call on ``x``: float32 on a device whose implementation is Triton."""
    return (x.dtype == torch.float32 and x.device.type == "cuda"
            and backends.resolved(None, x.device) == "triton")


def _needed(ctx, index: int) -> bool:
    """Whether this backward pass uses the gradient of input ``index`` (``torch.autograd.grad`` of the forces
    asks for the positions' only: the weights' gradient would be computed and dropped). The engine answers for
    the nodes it runs, not for leaves inside ``torch.autograd.grad``: :func:`linear` passes the weights as a
    view (a node of their own); for a leaf it cannot answer for, yes."""
    node = ctx.next_functions[index][0]
    if node is None:
        return False
    ask = getattr(torch._C, "_will_engine_execute_node", None)  # torch's private API: absent, yes
    try:
        return ask is None or ask(node)
    except RuntimeError:
        return True


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, tables, transposed, bias_numel):
        ctx.save_for_backward(x, weight)
        ctx.tables, ctx.transposed, ctx.bias_numel = tables, transposed, bias_numel
        return _run(x, weight, bias, tables, transposed, bias_numel > 0)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        tables, transposed = ctx.tables, ctx.transposed
        grad = grad.contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0] and _needed(ctx, 0):
            grad_x = _Linear.apply(grad, weight, weight.detach(), tables, not transposed, 0)
        if ctx.needs_input_grad[1] and _needed(ctx, 1):
            grad_w = (tables.weight_gradient(grad, x) if transposed else tables.weight_gradient(x, grad))
            grad_w = grad_w.reshape(weight.shape)
        if ctx.needs_input_grad[2] and _needed(ctx, 2):
            grad_b = tables.bias_gradient(grad, ctx.bias_numel)
        return grad_x, grad_w, grad_b, None, None, None


def _run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tables: LinearTables, transposed: bool,
         biases: bool):
    segments, paths, alpha, max_channels, max_contracted = tables.tensors(transposed, biases, x.device)
    kernels = backends.kernel_module("linear", "triton")
    dim_out = tables.dim_in if transposed else tables.dim_out
    out = kernels.linear(x.contiguous(), weight.reshape(-1), alpha, bias.reshape(-1), segments, paths, dim_out,
                         max_channels, max_contracted)
    if out is None:  # the kernel is still compiling: the same map in torch operations meanwhile
        out = _portable(x, weight, bias, tables, transposed, biases)
    return out


def _portable(x, weight, bias, tables: LinearTables, transposed: bool, biases: bool) -> torch.Tensor:
    """The map of the tables in torch operations (while the kernel compiles)."""
    rows, w_flat = x.shape[0], weight.reshape(-1)
    out = x.new_zeros(rows, tables.dim_in if transposed else tables.dim_out)
    for i, u, o, w, d, k, alpha in tables.paths:
        block = w_flat[k:k + u * w].view(u, w) * alpha
        if transposed:
            out[:, i:i + u * d] += torch.einsum("uw,rwd->rud", block, x[:, o:o + w * d].reshape(rows, w, d)).reshape(
                rows, -1)
        else:
            out[:, o:o + w * d] += torch.einsum("uw,rud->rwd", block, x[:, i:i + u * d].reshape(rows, u, d)).reshape(
                rows, -1)
    if biases and not transposed:
        for offset, channels, bias_at in tables.biased():
            out[:, offset:offset + channels] += bias.reshape(-1)[bias_at:bias_at + channels]
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], tables: LinearTables) -> torch.Tensor:
    """The forward map of ``tables`` of ``x`` ``[rows, dim_in]`` with the flat shared ``weight`` and ``bias``
    (None where the module has none), differentiable to every order.

    Args:
        x: float32 ``[rows, dim_in]`` on CUDA (see :func:`available`).
        weight: ``[weight_numel]`` (or any shape of that many elements), x's dtype and device.
        bias: the flat biases, or None.
        tables: the module's :class:`LinearTables`.

    Returns:
        ``[rows, dim_out]``.
    """
    weight = weight.contiguous().view(-1)  # a node of its own where the weights are leaves (see _needed)
    if bias is None:
        return _Linear.apply(x, weight, weight.detach(), tables, False, 0)
    return _Linear.apply(x, weight, bias.view(-1), tables, False, bias.numel())
