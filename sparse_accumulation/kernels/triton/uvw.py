"""Fused "uvw" kernels (CUDA; CPU tensors under ``TRITON_INTERPRET=1``): one e3nn "uvw" instruction with shared
weights as a matrix product whose left operand is made tile by tile on chip (:mod:`.uvw_source`), so that no
``[rows, u, v]`` intermediate is written; its gradients with respect to both inputs and to the weights.

Each function launches into targets the caller made and adds to them (several instructions share outputs and
inputs), and returns False without launching where an eager call's kernel is still compiling
(:func:`.launch.ready`): the caller then computes the call otherwise.

An instruction is described by the ints of :func:`sparse_accumulation.e3nn.factored.specs`
``[in1 start, mul1, d1, in2 start, mul2, d2, out start, mul_out, d_out, weight start, coefficient start]``; its
coefficients ``C[i, j, k]`` are the block of ``d1 d2 d_out`` values at ``coefficient start`` of a tensor, whose
nonzero positions are those of e3nn's 3j symbol of the three dimensions.
"""
from __future__ import annotations

import functools

import torch

import cg

try:  # triton is optional: is_available() reports whether this backend can run
    import triton

    from . import build, launch, uvw_source
    from .uvw_source import Shape, kernel_source, parameters, sizes
except Exception:  # pragma: no cover - depends on the environment
    triton = None

#: row blocks each program of the weights' gradient sums (the rest of the rows go to more programs)
_BLOCKS_PER_WEIGHT_PROGRAM = 16
_WARPS = 4
_STAGES = 1


@functools.lru_cache(maxsize=None)
def _nonzeros(d1: int, d2: int, d_out: int, swapped: bool) -> tuple:
    """``(i, j, k, offset)`` of the 3j symbol's nonzeros (``i`` of the tiled operand), offsets within the block
    ``C[i1, i2, k]`` of the instruction (``i1`` of the first input)."""
    a, b, c, _ = cg.transformation_rule((d1 - 1) // 2, (d2 - 1) // 2, (d_out - 1) // 2, basis="e3nn")
    found = {(int(i), int(j), int(k)) for i, j, k in zip(a, b, c)}
    return tuple(sorted(((j, i, k) if swapped else (i, j, k)) + ((i * d2 + j) * d_out + k,) for i, j, k in found))


def precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision for ``dtype``: float64 and float32 in full precision ("ieee"), float32 with
    ``torch.set_float32_matmul_precision("high")`` on three TF32 products ("tf32x3", about float32's accuracy),
    with ``"medium"`` on one ("tf32")."""
    if dtype != torch.float32:
        return "ieee"
    return {"high": "tf32x3", "medium": "tf32"}.get(torch.get_float32_matmul_precision(), "ieee")


def _kernel(kind: str, spec: tuple, swapped: bool, acc: str, dot: str):
    def make():
        _, mul1, d1, _, mul2, d2, _, mul_out, d_out, _, _ = spec
        dims = (mul2, d2, mul1, d1) if swapped else (mul1, d1, mul2, d2)
        shape = Shape(*dims, mul_out, d_out, _nonzeros(d1, d2, d_out, swapped), dot)
        name = build.kernel_name("uvw", (kind, shape, acc))
        source = kernel_source(kind, name, shape, acc)
        warps = 1 if build.interpreting() else _WARPS
        kernel = build.autotuned(source, name, parameters(kind)[1],
                                 [triton.Config({}, num_warps=warps, num_stages=_STAGES)], key=())
        return kernel, sizes(shape)

    tiles = (uvw_source.TILE_ROWS, uvw_source.TILE_COLUMNS, _WARPS, _STAGES)
    return build.cached(("uvw", kind, tuple(spec[1:9]), swapped, acc, dot, tiles), make)


def _acc(dtype: torch.dtype) -> str:
    return "tl.float64" if dtype == torch.float64 else "tl.float32"


def _row_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else 0


def _run(kernel, grid, pointers, ints, device) -> bool:
    if not launch.ready(kernel, grid, pointers, ints):
        return False
    launch.launch(kernel, grid, pointers, ints, device=device,
                  small=max(t.numel() for t in pointers) < 2**31 - 1)
    return True


def forward(x1, x2, weight, coefficients, out, spec) -> bool:
    """``out[:, instruction's columns] += the instruction's product``.

    Args:
        x1, x2: ``[rows or 1, irreps.dim]`` (e3nn's layout, last dimension contiguous), one floating dtype.
        weight: ``[weight_numel]``, contiguous; coefficients: as :func:`~sparse_accumulation.e3nn.factored.specs`
            makes them; out: ``[rows, irreps_out.dim]``, contiguous.
        spec: the instruction's ints (module docstring).
    """
    s1, mul1, d1, s2, mul2, d2, so, mul_out, d_out, sw, sc = spec
    kernel, s = _kernel("forward", tuple(spec), False, _acc(out.dtype), precision(out.dtype))
    rows = out.shape[0]
    pointers = [x1[:, s1:], x2[:, s2:], coefficients[sc:], weight[sw:], out[:, so:]]
    ints = [rows, _row_stride(x1), _row_stride(x2), out.stride(0), mul2 * mul_out, mul_out]
    grid = (triton.cdiv(rows, s["BZ"]),)
    return _run(kernel, lambda meta: grid, pointers, ints, out.device)


def grad_inputs(x1, x2, weight, coefficients, grad, gx1, gx2, spec) -> bool:
    """``gx1``, ``gx2`` (``[rows, irreps.dim]``, contiguous; either may be None) ``+=`` the instruction's part of
    the gradients of the inputs for the output's gradient ``grad`` (``[rows, irreps_out.dim]``, contiguous).
    Other arguments as for :func:`forward`."""
    s1, mul1, d1, s2, mul2, d2, so, mul_out, d_out, sw, sc = spec
    acc, dot = _acc(grad.dtype), precision(grad.dtype)
    rows = grad.shape[0]
    launches = []
    if gx1 is not None:
        kernel, s = _kernel("grad_p", tuple(spec), False, acc, dot)
        launches.append((kernel, s, [x1[:, s1:], x2[:, s2:], coefficients[sc:], weight[sw:], grad[:, so:],
                                     gx1[:, s1:]],
                         [rows, _row_stride(x1), _row_stride(x2), grad.stride(0), gx1.stride(0), mul2 * mul_out,
                          mul_out]))
    if gx2 is not None:
        kernel, s = _kernel("grad_p", tuple(spec), True, acc, dot)
        launches.append((kernel, s, [x2[:, s2:], x1[:, s1:], coefficients[sc:], weight[sw:], grad[:, so:],
                                     gx2[:, s2:]],
                         [rows, _row_stride(x2), _row_stride(x1), grad.stride(0), gx2.stride(0), mul_out,
                          mul2 * mul_out]))
    for kernel, s, pointers, ints in launches:
        if not launch.ready(kernel, lambda meta: (1,), pointers, ints):
            return False
    for kernel, s, pointers, ints in launches:
        grid = (triton.cdiv(rows, s["BZ"]),)
        _run(kernel, lambda meta: grid, pointers, ints, grad.device)
    return True


def grad_weight(x1, x2, coefficients, grad, spec, rows: int):
    """The instruction's part of the weights' gradient, ``[mul1 * mul2 * mul_out]`` (``u, v, w``), for the
    output's gradient ``grad``; None where the kernel is still compiling. Arguments as for :func:`forward`."""
    s1, mul1, d1, s2, mul2, d2, so, mul_out, d_out, sw, sc = spec
    kernel, s = _kernel("grad_w", tuple(spec), False, _acc(grad.dtype), precision(grad.dtype))
    blocks = triton.cdiv(rows, s["BZ"])
    splits = max(1, triton.cdiv(blocks, _BLOCKS_PER_WEIGHT_PROGRAM))
    size = mul1 * mul2 * mul_out
    partial = grad.new_empty(splits, size)
    pointers = [x1[:, s1:], x2[:, s2:], coefficients[sc:], grad[:, so:], partial]
    ints = [rows, _row_stride(x1), _row_stride(x2), grad.stride(0), splits]
    grid = (triton.cdiv(mul1, s["BU"]), splits)
    if not _run(kernel, lambda meta: grid, pointers, ints, grad.device):
        return None
    return partial.sum(0)


def is_available() -> bool:
    """Whether these kernels can run: triton importable and CUDA available (or the interpreter on)."""
    if triton is None:
        return False
    return build.interpreting() or torch.cuda.is_available()
