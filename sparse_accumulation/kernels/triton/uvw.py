"""Fused "uvw" kernels (CUDA; CPU tensors under ``TRITON_INTERPRET=1``): one e3nn "uvw" instruction with shared
float32 weights, forward and gradients, without ``[rows, u, v]`` intermediates (:mod:`.uvw_source`).

Each function adds into targets the caller made (instructions share outputs and inputs) and returns False
without launching anything where one of its kernels is still compiling (:func:`.launch.ready`): the caller then
computes the call otherwise.

An instruction is described by the ints of :func:`sparse_accumulation.ops.factored.specs`
``[in1 start, mul1, d1, in2 start, mul2, d2, out start, mul_out, d_out, weight start, coefficient start, mode]``;
its coefficients ``C[i1, i2, k]`` are the block of ``d1 d2 d_out`` values at ``coefficient start``, nonzero where
e3nn's 3j symbol of the three dimensions is. The input with fewer components is the kernels' ``q`` (the one
multiplied by the weights on the tensor cores), the other ``p``.
"""
from __future__ import annotations

import functools

import torch

import cg

try:  # triton is optional (sparse_accumulation.backends.is_available says whether it runs)
    import triton

    from . import build, launch
    from .uvw_source import Shape, kernel_source, parameters, sizes
except Exception:  # pragma: no cover - depends on the environment
    triton = None

_WARPS = 4
#: programs of the weights' gradient per streaming multiprocessor (the splits of the rows follow from it)
_WEIGHT_PROGRAMS_PER_SM = 8


@functools.lru_cache(maxsize=None)
def _nonzeros(d1: int, d2: int, d_out: int, swapped: bool) -> tuple:
    """``(i, j, k, offset)`` of the 3j symbol's nonzeros (``i`` of ``p``, ``j`` of ``q``), offsets within the
    block ``C[i1, i2, k]``."""
    a, b, c, _ = cg.transformation_rule((d1 - 1) // 2, (d2 - 1) // 2, (d_out - 1) // 2, basis="e3nn")
    found = sorted({(int(i1), int(i2), int(k)) for i1, i2, k in zip(a, b, c)})
    return tuple(((i2, i1, k) if swapped else (i1, i2, k)) + ((i1 * d2 + i2) * d_out + k,) for i1, i2, k in found)


#: the largest irrep dimension and the most channels of ``q`` that :func:`supported` takes (the register tiles
#: of larger ones were not measured on a GPU)
LARGEST_DIMENSION, MOST_Q_CHANNELS = 5, 64


def supported(spec) -> bool:
    """Whether the kernels take the instruction ``spec`` (module docstring): irreps up to l = 2 and ``q`` (the
    input of fewer components) of at most 64 channels."""
    _, mul1, d1, _, mul2, d2, _, _, d_out, _, _, mode = spec
    return (mode == 0 and max(d1, d2, d_out) <= LARGEST_DIMENSION
            and (mul1 if d1 < d2 else mul2) <= MOST_Q_CHANNELS)


def precision() -> str:
    """``tl.dot``'s input precision for float32: three TF32 products (``"tf32x3"``: as accurate as a float32
    matrix product, measured against float64) by default, one (``"tf32"``) where
    ``torch.set_float32_matmul_precision`` allows TF32 ("high" or "medium"), as torch's matrix products then do."""
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


class _Roles:
    """An instruction's operands as the kernels see them (module docstring)."""

    def __init__(self, spec, x1, x2):
        s1, mul1, d1, s2, mul2, d2, so, mul_out, d_out, sw, sc, _ = spec
        self.swapped = d1 < d2
        if self.swapped:  # q is the first input: W[u, v, w] read as W[l = v, d = u, w]
            self.p, self.q = x2[:, s2:], x1[:, s1:]
            self.L, self.I, self.D, self.J = mul2, d2, mul1, d1
            self.WL, self.WD = mul_out, mul2 * mul_out
        else:
            self.p, self.q = x1[:, s1:], x2[:, s2:]
            self.L, self.I, self.D, self.J = mul1, d1, mul2, d2
            self.WL, self.WD = mul2 * mul_out, mul_out
        self.p_start, self.q_start = (s2, s1) if self.swapped else (s1, s2)
        self.shape = Shape(self.L, self.I, self.D, self.J, mul_out, d_out,
                           _nonzeros(d1, d2, d_out, self.swapped), precision())

    def sizes(self, kind: str) -> dict:
        return sizes(self.shape, kind)


def _kernel(kind: str, shape: Shape):
    tiles = tuple(sorted(sizes(shape, kind).items()))

    def make():
        name = build.kernel_name("uvw", (kind, shape, tiles))
        warps = 1 if build.interpreting() else _WARPS
        return build.autotuned(kernel_source(kind, name, shape), name, parameters(kind)[1],
                               [triton.Config({}, num_warps=warps, num_stages=1)], key=())

    return build.cached(("uvw", kind, shape, tiles), make)


def _row_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else 0


def _launches_ready(launches) -> bool:
    return all(launch.ready(kernel, lambda meta: (1,), pointers, ints) for kernel, _, pointers, ints in launches)


def _run(launches, device) -> bool:
    if not _launches_ready(launches):
        return False
    for kernel, grid, pointers, ints in launches:
        launch.launch(kernel, lambda meta, grid=grid: grid, pointers, ints, device=device,
                      small=max(t.numel() for t in pointers) < 2**31 - 1)
    return True


def forward(x1, x2, weight, coefficients, out, spec) -> bool:
    """``out[:, instruction's columns] += the instruction's product``.

    Args:
        x1, x2: ``[rows or 1, irreps.dim]`` float32 (e3nn's layout, unit column stride).
        weight: ``[weight_numel]`` float32, contiguous; coefficients: float32, as
            :func:`~sparse_accumulation.ops.factored.specs` makes them; out: ``[rows, irreps_out.dim]``
            float32, contiguous.
        spec: the instruction's ints (module docstring).
    """
    r = _Roles(spec, x1, x2)
    rows = out.shape[0]
    so, sw, sc = spec[6], spec[9], spec[10]
    pointers = [r.p, r.q, weight[sw:], coefficients[sc:], out[:, so:]]
    ints = [rows, _row_stride(r.p), _row_stride(r.q), out.stride(0), out.stride(0), r.WL, r.WD]
    s = r.sizes("forward")
    grid = (triton.cdiv(rows, s["BZ"]), s["NW"])
    return _run([(_kernel("forward", r.shape), grid, pointers, ints)], out.device)


def grad_inputs(x1, x2, weight, coefficients, grad, gx1, gx2, spec) -> bool:
    """``gx1``, ``gx2`` (``[rows, irreps.dim]`` float32, contiguous; either may be None) ``+=`` the instruction's
    part of the gradients of the inputs for the output's gradient ``grad`` (``[rows, irreps_out.dim]``,
    contiguous). Other arguments as for :func:`forward`."""
    r = _Roles(spec, x1, x2)
    rows = grad.shape[0]
    so, sw, sc = spec[6], spec[9], spec[10]
    gp, gq = (gx2, gx1) if r.swapped else (gx1, gx2)
    launches = []
    for kind, target, start in (("grad_p", gp, r.p_start), ("grad_q", gq, r.q_start)):
        if target is not None:
            grid = (triton.cdiv(rows, r.sizes(kind)["BZ"]),)
            pointers = [r.p, r.q, weight[sw:], coefficients[sc:], grad[:, so:], target[:, start:]]
            ints = [rows, _row_stride(r.p), _row_stride(r.q), grad.stride(0), target.stride(0), r.WL, r.WD]
            launches.append((_kernel(kind, r.shape), grid, pointers, ints))
    return _run(launches, grad.device)


def grad_weight(x1, x2, coefficients, grad, spec, rows: int):
    """The instruction's part of the weights' gradient, ``[mul1 * mul2 * mul_out]`` (``u, v, w``), for the
    output's gradient ``grad``; None where the kernel is still compiling. Arguments as for :func:`forward`."""
    r = _Roles(spec, x1, x2)
    so, sc, mul_out = spec[6], spec[10], spec[7]
    s = r.sizes("grad_w")
    blocks = triton.cdiv(rows, s["BZ"])
    sms = (torch.cuda.get_device_properties(grad.device).multi_processor_count if grad.is_cuda else 1)
    splits = max(1, min(blocks, triton.cdiv(_WEIGHT_PROGRAMS_PER_SM * sms, r.L * s["NW"])))
    partial = grad.new_empty(splits, r.L, r.D, mul_out)
    pointers = [r.p, r.q, grad, coefficients[sc:], grad[:, so:], partial]  # no weights read: W is a placeholder
    ints = [rows, _row_stride(r.p), _row_stride(r.q), grad.stride(0), 0, 0, 0, splits]
    grid = (r.L, splits, s["NW"])
    if not _run([(_kernel("grad_w", r.shape), grid, pointers, ints)], grad.device):
        return None
    total = partial.sum(0)  # [l, d, w]
    return (total.transpose(0, 1) if r.swapped else total).reshape(-1)
