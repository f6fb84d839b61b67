"""An e3nn-layout linear map of irreps (:class:`sparse_accumulation.e3nn.Linear`) in one Triton kernel (CUDA;
CPU tensors under ``TRITON_INTERPRET=1``).

Each program computes one block of rows of one output segment (one component ``m`` of one output irrep, a tile
of its channels): ``out[r, o + w * d + m] = bias[w] + sum over the segment's paths p of alpha_p sum_k
x[r, i_p + k * d + m] * W[w_p + k * a_p + w * b_p]``, the inputs of a path read where they lie (channel stride
``d``), the weights where they lie (strides ``a_p``, ``b_p``: a block or its transpose). torch's form of the same
map takes, per output irrep, a transposing copy of the input, a matrix product, a transposing copy of the result
and a concatenation of the outputs; a small system's captured MD step pays a launch for each.
"""
from __future__ import annotations

import torch

try:  # triton is optional (sparse_accumulation.backends.is_available says whether it runs)
    import triton

    from . import build, launch
except Exception:  # pragma: no cover - depends on the environment
    triton = None

#: a segment's row in the ``segments`` table: output offset, channels, dimension, component, first path, paths,
#: bias offset (-1: none)
SEGMENT_FIELDS = 7
#: a path's row in the ``paths`` table: input offset, contracted channels, weight offset, its two strides
PATH_FIELDS = 5

_SOURCE = '''
import triton
import triton.language as tl


def {name}(X, W, ALPHA, BIAS, SEGMENTS, PATHS, OUT, rows, dim_in, dim_out,
           BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    segment = SEGMENTS + tl.program_id(1) * {segment_fields}
    out_at = tl.load(segment)
    channels = tl.load(segment + 1)
    d = tl.load(segment + 2)
    m = tl.load(segment + 3)
    first = tl.load(segment + 4)
    count = tl.load(segment + 5)
    bias_at = tl.load(segment + 6)
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = r < rows
    n_ok = n < channels
    acc = tl.full([BLOCK_R, BLOCK_N], 0, dtype=tl.float32)
    for p in range(first, first + count):
        path = PATHS + p * {path_fields}
        in_at = tl.load(path)
        contracted = tl.load(path + 1)
        w_at = tl.load(path + 2)
        stride_k = tl.load(path + 3)
        stride_n = tl.load(path + 4)
        alpha = tl.load(ALPHA + p).to(tl.float32)
        for k0 in range(0, contracted, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < contracted
            x = tl.load(X + r[:, None] * dim_in + in_at + k[None, :] * d + m,
                        mask=row_ok[:, None] & k_ok[None, :], other=0).to(tl.float32)
            w = tl.load(W + w_at + k[:, None] * stride_k + n[None, :] * stride_n,
                        mask=k_ok[:, None] & n_ok[None, :], other=0).to(tl.float32)
            acc += tl.dot(x, w * alpha, input_precision="ieee")
    if bias_at >= 0:
        acc += tl.load(BIAS + bias_at + n, mask=n_ok, other=0).to(tl.float32)[None, :]
    tl.store(OUT + r[:, None] * dim_out + out_at + n[None, :] * d + m, acc.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & n_ok[None, :])
'''


def _block(size: int, low: int, high: int) -> int:
    """The power of two at least ``size``, within ``[low, high]`` (``tl.dot`` takes dimensions of 16 or more)."""
    block = low
    while block < size and block < high:
        block *= 2
    return block


def _kernel(block_r: int, block_k: int, block_n: int):
    def make():
        name = build.kernel_name("linear", (block_r, block_k, block_n))
        source = _SOURCE.format(name=name, segment_fields=SEGMENT_FIELDS, path_fields=PATH_FIELDS)
        return build.fixed_kernel(source, name, ["rows", "dim_in", "dim_out"],
                                  {"BLOCK_R": block_r, "BLOCK_K": block_k, "BLOCK_N": block_n}, 4)

    return build.cached(("linear", block_r, block_k, block_n), make)


def linear(x: torch.Tensor, weight: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor, segments: torch.Tensor,
           paths: torch.Tensor, dim_out: int, max_channels: int, max_contracted: int):
    """The map described by the tables (see the module docstring) of ``x`` ``[rows, dim_in]``.

    Args:
        x: ``[rows, dim_in]``, float32, contiguous (the products in full float32 precision, not TF32).
        weight: the flat weights (``x``'s dtype and device), read at the paths' offsets and strides.
        alpha: ``[paths]`` each path's factor (``x``'s dtype).
        bias: the flat biases, read at the segments' bias offsets (any tensor of ``x``'s dtype where none is).
        segments: ``[segments, SEGMENT_FIELDS]`` int32, every column of the output in exactly one segment's
            channels; a segment's paths are ``first .. first + paths - 1`` of ``paths``.
        paths: ``[paths, PATH_FIELDS]`` int32.
        dim_out: the output's width.
        max_channels, max_contracted: the largest channel count of a segment and contracted count of a path.

    Returns:
        ``[rows, dim_out]`` float32, or None where an eager call's kernel is still compiling
        (:func:`.launch.ready`): the caller computes it otherwise meanwhile.
    """
    rows = x.shape[0]
    out = torch.empty(rows, dim_out, dtype=x.dtype, device=x.device)
    if rows == 0 or segments.shape[0] == 0:
        return out.zero_()
    block_r = _block(rows, 16, 32)
    block_k, block_n = _block(max_contracted, 16, 32), _block(max_channels, 16, 64)
    kernel = _kernel(block_r, block_k, block_n)
    pointers, ints = [x, weight, alpha, bias, segments, paths, out], [rows, x.shape[1], dim_out]
    tiles = triton.cdiv(max_channels, block_n)

    def grid(meta):
        return (triton.cdiv(rows, meta["BLOCK_R"]), segments.shape[0], tiles)

    if not launch.ready(kernel, grid, pointers, ints):
        return None
    launch.launch(kernel, grid, pointers, ints, device=x.device, small=rows * max(x.shape[1], dim_out) < 2**31)
    return out
