"""e3nn's "uvw" and "uuw" instructions of many paths, computed factored instead of path by path.

A "uvw" instruction ``in1[u, i] x in2[v, j] -> out[w, k]`` has ``mul1 mul2 mul_out`` paths; as terms of one
rule (:mod:`.layout`) it is ``mul1 mul2 mul_out`` times the 3j symbol's nonzeros long (22 million terms for the
fully connected product of ``64x0e + 64x1o + 64x2e``). Factored, it is

    out[z, w, k] = sum_uv W[u, v, w] sum_ij C[i, j, k] in1[z, u, i] in2[z, v, j]

computed in three contractions, the weights (``mul1 mul2 mul_out`` of them, the bulk of the arithmetic) in a
matrix product against the smallest of the three irreps' dimensions: with shared weights, against the pairs
``in1[u] in2[v]`` coupled to each output component (when ``2 l_out + 1`` is the smallest), else against ``in1``
per component ``i`` or ``in2`` per component ``j``, the rest coupled by the 3j symbol in a batched matrix
product; with per-row weights, against the coupled pairs, row by row. The intermediates (up to ``mul1 mul2``
or ``mul2 mul_out`` numbers per component and row: 82 kB a row for ``64x2e x 64x2e -> 64x2e`` in float32) are laid
out as the next product reads them.

Memory: where the intermediates of all rows would take more than a budget (:func:`default_budget`: 256 MiB on
the CPU, a quarter of a GPU's memory; ``SPARSE_ACCUMULATION_FACTORED_CHUNK_MB`` sets another), the rows are
computed in chunks that fit, and the backward computes each chunk's intermediates again instead of keeping them
(:class:`_Recomputed`): the peak memory of a forward+backward is then one chunk's intermediates beside the inputs
and outputs, instead of every row's (43 GB for 10^5 rows of the product above), for one more forward's arithmetic
in the backward. Smaller products keep their
intermediates for the backward, as torch does; on the CPU their rows still go in chunks of at most
:func:`cpu_chunk_bytes` of intermediates, kept for the backward, which stay in the caches. Under TorchScript the
chunks are computed one after another and kept as torch keeps them.
Written with torch operations (so every derivative and TorchScript come with them), on every device; on CUDA in
float32, shared-weight "uvw" instructions may run instead on the fused kernels of
:mod:`sparse_accumulation.kernels.triton.uvw`, which write no intermediates, as :data:`FUSED` says
(:class:`_Fused`: a double backward computes the chunks again on the torch operations).

A "uuw" instruction ``out[z, w, k] = sum_u W[u, w] sum_ij C[i, j, k] in1[z, u, i] in2[z, u, j]`` is computed as
e3nn computes it: each channel's pair coupled (one matrix product against the 3j symbol), then the channels
mixed by the weights (one matrix product); as terms of one rule it would take ``mul1 mul_out`` times the 3j
symbol's nonzeros per row.

:func:`factored_instructions` says which instructions run so (``"uvw"`` with at least
:data:`FACTORED_MIN_PATHS` paths, ``"uuw"`` with at least :data:`FACTORED_MIN_UUW_PATHS`); :func:`specs`
describes them as lists of ints, which :func:`factored_product` reads (also under TorchScript).
"""
from __future__ import annotations

import functools
import math
import os
from typing import Dict, List

import numpy as np
import torch

import cg

from .. import backends

#: "uvw" instructions of at least this many paths (``mul1 mul2 mul_out``) are computed factored
FACTORED_MIN_PATHS = 512
#: "uuw" instructions of at least this many paths (``mul1 mul_out``) are computed factored
FACTORED_MIN_UUW_PATHS = 256
#: the connection modes of :func:`specs`, by their number in a spec
MODES = ("uvw", "uuw")
#: the most bytes the intermediates of all rows may take before chunks are recomputed in the backward:
#: ``SPARSE_ACCUMULATION_FACTORED_CHUNK_MB`` megabytes (read at import), else 0: :func:`default_budget` of the
#: inputs' device
CHUNK_BYTES = int(float(os.environ.get("SPARSE_ACCUMULATION_FACTORED_CHUNK_MB", "0")) * 2**20)
#: "uvw" instructions with shared float32 weights on these devices may run on the fused kernels of
#: :mod:`sparse_accumulation.kernels.triton.uvw` (no ``[rows, u, v]`` intermediates), as :data:`FUSED` says
FUSED_DEVICES = ("cuda",)


def _fused_setting(value: str) -> str:
    """:data:`FUSED` of the environment variable's ``value``; ValueError for one it does not know."""
    setting = {"0": "off", "1": "always"}.get(value.strip().lower(), value.strip().lower())
    if setting not in ("auto", "always", "off"):
        raise ValueError(f"SPARSE_ACCUMULATION_FUSED_UVW must be auto, always, off, 0 or 1, not {value!r}")
    return setting


#: when the fused kernels run (``SPARSE_ACCUMULATION_FUSED_UVW``, read at import): ``"auto"`` (default) where no
#: gradient is asked for (1.4x faster than the torch operations on an H200) or where the intermediates would
#: not fit the chunk budget (faster than chunks, and in a fraction of their memory), the torch operations for
#: the rest (a forward and backward whose intermediates fit ran 1.2-1.5x faster on them); ``"always"``;
#: ``"off"`` (or ``0``)
FUSED = _fused_setting(os.environ.get("SPARSE_ACCUMULATION_FUSED_UVW", "auto"))


def default_budget(device: torch.device) -> int:
    """The chunk budget in bytes for tensors on ``device`` when none is set: 256 MiB on the CPU (where the rows go
    in chunks of :func:`cpu_chunk_bytes` anyway, for speed); on a GPU a quarter of its memory, at least 1 GiB (chunks
    recompute their forward in the backward, so a product that fits keeps its intermediates and runs faster);
    1 GiB under TorchScript and elsewhere."""
    if device.type == "cpu":
        return 256 * 1048576
    if device.type == "cuda" and not torch.jit.is_scripting():
        return max(1024 * 1048576, _quarter_of_gpu_memory(device))
    return 1024 * 1048576


def cpu_chunk_bytes() -> int:
    """The most bytes of intermediates of a chunk of rows on the CPU, 64 MiB, whether or not every row's fit the
    budget (:func:`default_budget`): chunks that are kept for the backward stay in the caches, and the allocator
    reuses their memory instead of mapping fresh pages for each (1.4-1.6x faster forward, 1.2-1.5x
    forward+backward on 2 cores at 10^3 and 10^4 rows of ``64x0e + 64x1o + 64x2e``, ``benchmarks/RESULTS.md``)."""
    return 64 * 1048576


@torch.jit.unused
def _quarter_of_gpu_memory(device: torch.device) -> int:
    return _gpu_memory(device.index if device.index is not None else torch.cuda.current_device()) // 4


@functools.lru_cache(maxsize=None)
def _gpu_memory(index: int) -> int:
    return torch.cuda.get_device_properties(index).total_memory


def factored_instructions(instructions, irreps_in1, irreps_in2, irreps_out) -> frozenset:
    """The indices of the instructions computed factored: "uvw" with :data:`FACTORED_MIN_PATHS` paths or more,
    "uuw" with :data:`FACTORED_MIN_UUW_PATHS` or more."""
    def factored(ins) -> bool:
        mul1, mul_out = irreps_in1[ins.i_in1].mul, irreps_out[ins.i_out].mul
        if ins.connection_mode == "uvw":
            return mul1 * irreps_in2[ins.i_in2].mul * mul_out >= FACTORED_MIN_PATHS
        return ins.connection_mode == "uuw" and mul1 * mul_out >= FACTORED_MIN_UUW_PATHS

    return frozenset(i for i, ins in enumerate(instructions) if factored(ins))


def _starts(irreps) -> list:
    starts, at = [], 0
    for mul, ir in irreps:
        starts.append(at)
        at += mul * ir.dim
    return starts


def specs(instructions, factored, irreps_in1, irreps_in2, irreps_out) -> tuple:
    """``(specs, coefficients)``: per factored instruction the ints ``[in1 start, mul1, 2 l1 + 1, in2 start, mul2,
    2 l2 + 1, out start, mul_out, 2 l_out + 1, weight start, coefficient start, mode]`` (columns of e3nn's layouts;
    the mode's place in :data:`MODES`), and
    the dense 3j symbols ``[2 l1 + 1, 2 l2 + 1, 2 l_out + 1]`` of them all, each times the instruction's
    ``path_weight``, flattened one after another (float64)."""
    in1_at, in2_at, out_at = _starts(irreps_in1), _starts(irreps_in2), _starts(irreps_out)
    rows, blocks, weight_at, coefficient_at = [], [], 0, 0
    for index, ins in enumerate(instructions):
        if index in factored:
            (mul1, ir1), (mul2, ir2), (mul_out, ir_out) = (irreps_in1[ins.i_in1], irreps_in2[ins.i_in2],
                                                           irreps_out[ins.i_out])
            a, b, c, C = cg.transformation_rule(ir1.l, ir2.l, ir_out.l, basis="e3nn")
            dense = np.zeros((ir1.dim, ir2.dim, ir_out.dim))
            np.add.at(dense, (a, b, c), C * (ins.path_weight / math.sqrt(ir_out.dim)))
            rows.append([in1_at[ins.i_in1], mul1, ir1.dim, in2_at[ins.i_in2], mul2, ir2.dim, out_at[ins.i_out],
                         mul_out, ir_out.dim, weight_at, coefficient_at, MODES.index(ins.connection_mode)])
            blocks.append(dense.ravel())
            coefficient_at += dense.size
        if ins.has_weight:
            weight_at += math.prod(ins.path_shape)
    return rows, (np.concatenate(blocks) if blocks else np.zeros(0))


def row_bytes(specs: List[List[int]], shared: bool, element_size: int) -> int:
    """Bytes of the largest instruction's intermediates per row, twice (their gradients in the backward)."""
    largest = 0
    for spec in specs:
        s1, mul1, d1, s2, mul2, d2, so, mul_out, d_out, sw, sc, mode = spec
        if mode == 1:  # uuw: the coupled pairs [mul1, d_out], then the output
            elements = mul1 * d1 * d2 + 2 * mul1 * d_out
        elif not shared:
            elements = d_out * mul1 * mul2 + d_out * d1 * mul2
        elif d_out <= d1 and d_out <= d2:
            elements = d_out * mul2 * d1 + d_out * mul2 * mul1
        elif d1 <= d2:
            elements = d1 * mul2 * mul_out + d1 * mul2 * d_out
        else:
            elements = d2 * mul1 * mul_out + d2 * mul1 * d_out
        largest = max(largest, elements + mul1 * d1 + mul2 * d2 + 2 * mul_out * d_out)
    return 2 * largest * element_size


def chunk_rows(specs: List[List[int]], shared: bool, rows: int, element_size: int, budget: int) -> int:
    """Rows per chunk: all of them where their intermediates fit in ``budget`` bytes, else as many as fit (at
    least one)."""
    per_row = row_bytes(specs, shared, element_size)
    if per_row * rows <= budget:
        return max(rows, 1)
    return max(1, budget // max(per_row, 1))


def _rows(t: torch.Tensor, start: int, stop: int, rows: int) -> torch.Tensor:
    """Rows ``start:stop`` of an operand of ``rows`` rows (one of a single row is shared by every chunk)."""
    return t[start:stop] if t.shape[0] == rows else t


def factored_product(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, shared: bool, specs: List[List[int]],
                     coefficients: torch.Tensor, dim_out: int, budget: int) -> torch.Tensor:
    """The factored instructions' part of the product, ``[rows, dim_out]``, in chunks of rows recomputed in the
    backward where the intermediates would exceed ``budget`` bytes, on the CPU in chunks of at most
    :func:`cpu_chunk_bytes` kept for the backward where they would not (see the module docstring).

    Args:
        x, y: ``[rows or 1, irreps_in1.dim]``, ``[rows or 1, irreps_in2.dim]`` (e3nn's layout), one dtype.
        weight: ``[weight_numel]`` (``shared``) or ``[rows or 1, weight_numel]``.
        specs, coefficients: as :func:`specs` makes them (the coefficients in the inputs' dtype and device).
        dim_out: ``irreps_out.dim``.
        budget: bytes the intermediates of a chunk may take; 0 or less: :func:`default_budget` of the inputs'
            device.
    """
    rows = max(x.shape[0], y.shape[0])
    if not shared:
        rows = max(rows, weight.shape[0])
    if budget <= 0:
        budget = default_budget(x.device)
    if shared and not torch.jit.is_scripting():
        fused = _fused(x, y, weight, specs, coefficients, dim_out, rows, budget)
        if fused is not None:
            return fused
    within_budget = chunk_rows(specs, shared, rows, x.element_size(), budget)
    step = within_budget
    if x.device.type == "cpu":
        step = min(step, chunk_rows(specs, shared, rows, x.element_size(), cpu_chunk_bytes()))
    if step >= rows:
        return _factored_rows(x, y, weight, shared, specs, coefficients, dim_out, rows)
    if within_budget < rows and not torch.jit.is_scripting():
        if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad or weight.requires_grad):
            return _recomputed(x, y, weight, shared, specs, coefficients, dim_out, rows, step)
    return _in_chunks(x, y, weight, shared, specs, coefficients, dim_out, rows, step)


def _in_chunks(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, shared: bool, specs: List[List[int]],
               coefficients: torch.Tensor, dim_out: int, rows: int, step: int) -> torch.Tensor:
    """The product computed ``step`` rows at a time."""
    parts: List[torch.Tensor] = []
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        w = weight if shared else _rows(weight, start, stop, rows)
        parts.append(_factored_rows(_rows(x, start, stop, rows), _rows(y, start, stop, rows), w, shared, specs,
                                    coefficients, dim_out, stop - start))
    return torch.cat(parts)


@torch.jit.unused
def _recomputed(x, y, weight, shared: bool, specs: List[List[int]], coefficients, dim_out: int, rows: int,
                step: int) -> torch.Tensor:
    return _Recomputed.apply(x, y, weight, coefficients, shared, specs, dim_out, rows, step)


class _Recomputed(torch.autograd.Function):
    """The product in chunks of ``step`` rows, whose backward computes each chunk's intermediates again (and
    differentiates them, so that every order of derivative runs), rather than keeping every chunk's."""

    @staticmethod
    def forward(ctx, x, y, weight, coefficients, shared, specs, dim_out, rows, step):
        ctx.save_for_backward(x, y, weight, coefficients)
        ctx.args = (shared, specs, dim_out, rows, step)
        return _in_chunks(x, y, weight, shared, specs, coefficients, dim_out, rows, step)

    @staticmethod
    def backward(ctx, grad):
        x, y, weight, coefficients = ctx.saved_tensors
        grads = _recomputed_grads(x, y, weight, coefficients, *ctx.args, grad, ctx.needs_input_grad[:3])
        return (*grads, None, None, None, None, None, None)


def _recomputed_grads(x, y, weight, coefficients, shared: bool, specs, dim_out: int, rows: int, step: int, grad,
                      wanted) -> list:
    """The gradients of ``x``, ``y`` and ``weight`` (None where not ``wanted``) for the output's gradient
    ``grad``, each chunk of ``step`` rows computed again and differentiated; differentiable themselves where
    grad mode is on (a double backward follows)."""
    create = torch.is_grad_enabled()
    chunked = [t.shape[0] == rows and not (shared and i == 2) for i, t in enumerate((x, y, weight))]
    parts = [[] for _ in range(3)]
    totals = [None] * 3
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        operands = [_rows(t, start, stop, rows) if c else t for t, c in zip((x, y, weight), chunked)]
        if not create:
            operands = [t.detach().requires_grad_(w) for t, w in zip(operands, wanted)]
        with torch.enable_grad():
            out = _factored_rows(*operands, shared, specs, coefficients, dim_out, stop - start)
            asked = [t for t, w in zip(operands, wanted) if w]
            found = iter(torch.autograd.grad(out, asked, grad[start:stop], create_graph=create, allow_unused=True))
        for i in range(3):
            if not wanted[i]:
                continue
            g = next(found)
            if g is None:
                g = torch.zeros_like(operands[i])
            if chunked[i]:
                parts[i].append(g)
            else:
                totals[i] = g if totals[i] is None else totals[i] + g
    return [torch.cat(parts[i]) if chunked[i] and wanted[i] else totals[i] for i in range(3)]


@torch.jit.unused
def _fused(x, y, weight, specs: List[List[int]], coefficients, dim_out: int, rows: int, budget: int):
    """The product with shared weights whose "uvw" instructions run on the fused kernels
    (:mod:`sparse_accumulation.kernels.triton.uvw`), or None where those do not apply: other dtypes than
    float32, devices not in :data:`FUSED_DEVICES`, no rows, ``torch.compile``'s tracing, no instruction the
    kernels take (:func:`~sparse_accumulation.kernels.triton.uvw.supported`: "uvw" of irreps up to l = 2),
    :data:`FUSED` ``"off"``, or ``"auto"`` with a gradient asked for and intermediates within ``budget``."""
    if (FUSED == "off" or rows == 0 or x.device.type not in FUSED_DEVICES
            or any(t.dtype != torch.float32 for t in (x, y, weight)) or torch.compiler.is_compiling()
            or not backends.is_available("triton", x.device)):
        return None
    uvw = _uvw_kernels()
    fused = [spec for spec in specs if uvw.supported(spec)]
    if not fused:
        return None
    step = chunk_rows(fused, True, rows, x.element_size(), budget)
    wants_gradient = torch.is_grad_enabled() and (x.requires_grad or y.requires_grad or weight.requires_grad)
    if FUSED == "auto" and wants_gradient and step >= rows:
        return None
    out = _Fused.apply(x, y, weight, coefficients, fused, dim_out, rows, step)
    rest = [spec for spec in specs if not uvw.supported(spec)]
    return out + factored_product(x, y, weight, True, rest, coefficients, dim_out, budget) if rest else out


def _uvw_kernels():
    return backends.kernel_module("uvw", "triton")


def _fused_forward(x, y, weight, coefficients, specs, dim_out: int, rows: int):
    """The product on the fused kernels; None where one is still compiling."""
    uvw = _uvw_kernels()
    out = x.new_zeros(rows, dim_out)
    for spec in specs:
        if not uvw.forward(x, y, weight, coefficients, out, spec):
            return None
    return out


def _fused_grads(x, y, weight, coefficients, specs, rows: int, grad, wanted):
    """The gradients of ``x``, ``y`` and ``weight`` (None where not ``wanted``) on the fused kernels; None
    where one is still compiling."""
    uvw = _uvw_kernels()
    grad = grad.contiguous()
    gx = x.new_zeros(rows, x.shape[1]) if wanted[0] else None
    gy = y.new_zeros(rows, y.shape[1]) if wanted[1] else None
    gw = torch.zeros_like(weight) if wanted[2] else None
    for spec in specs:
        if (wanted[0] or wanted[1]) and not uvw.grad_inputs(x, y, weight, coefficients, grad, gx, gy, spec):
            return None
        if wanted[2]:
            part = uvw.grad_weight(x, y, coefficients, grad, spec, rows)
            if part is None:
                return None
            gw[spec[9]:spec[9] + part.numel()] += part
    grads = [gx, gy, gw]
    for i, t in enumerate((x, y)):
        if grads[i] is not None and t.shape[0] != rows:  # one row shared by every row
            grads[i] = grads[i].sum(0, keepdim=True)
    return grads


class _Fused(torch.autograd.Function):
    """The "uvw" instructions with shared weights on the fused kernels, forward and backward (the chunks of
    :func:`_in_chunks` while the kernels compile); a backward that must be differentiable (a double backward
    follows) computes each chunk again on torch operations (:func:`_recomputed_grads`)."""

    @staticmethod
    def forward(ctx, x, y, weight, coefficients, specs, dim_out, rows, step):
        x, y = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, y))
        weight, coefficients = weight.contiguous(), coefficients.contiguous()
        ctx.save_for_backward(x, y, weight, coefficients)
        ctx.args = (specs, dim_out, rows, step)
        out = _fused_forward(x, y, weight, coefficients, specs, dim_out, rows)
        return out if out is not None else _in_chunks(x, y, weight, True, specs, coefficients, dim_out, rows, step)

    @staticmethod
    def backward(ctx, grad):
        x, y, weight, coefficients = ctx.saved_tensors
        specs, dim_out, rows, step = ctx.args
        wanted = ctx.needs_input_grad[:3]
        grads = None
        if not torch.is_grad_enabled():
            grads = _fused_grads(x, y, weight, coefficients, specs, rows, grad, wanted)
        if grads is None:
            grads = _recomputed_grads(x, y, weight, coefficients, True, specs, dim_out, rows, step, grad, wanted)
        return (*grads, None, None, None, None, None)


def _weight_pieces(weight: torch.Tensor, specs: List[List[int]]) -> Dict[int, torch.Tensor]:
    """Each instruction's weights (the last dimension's columns) by their start, cut from ``weight`` by one split:
    its backward assembles the weights' gradient once per chunk of rows, where a slice per instruction fills and
    adds a weight-sized gradient per instruction and chunk (7% of a forward+backward of 10^3 rows of
    ``64x0e + 64x1o + 64x2e`` on 2 cores)."""
    ends: Dict[int, int] = {}
    for spec in specs:
        mul1, mul2, mul_out, sw, mode = spec[1], spec[4], spec[7], spec[9], spec[11]
        ends[sw] = sw + (mul1 * mul_out if mode == 1 else mul1 * mul2 * mul_out)
    starts = list(ends.keys())
    starts.sort()
    sizes: List[int] = []
    at = 0
    for start in starts:
        if start > at:
            sizes.append(start - at)
        sizes.append(ends[start] - start)
        at = ends[start]
    if at < weight.shape[-1]:
        sizes.append(weight.shape[-1] - at)
    pieces: Dict[int, torch.Tensor] = {}
    at = 0
    for size, piece in zip(sizes, torch.split(weight, sizes, dim=-1)):
        if at in ends:
            pieces[at] = piece
        at += size
    return pieces


def _factored_rows(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, shared: bool, specs: List[List[int]],
                   coefficients: torch.Tensor, dim_out: int, rows: int) -> torch.Tensor:
    """The product of ``rows`` rows at once (arguments as :func:`factored_product`'s)."""
    weights = _weight_pieces(weight, specs)
    blocks: Dict[int, torch.Tensor] = {}  # by output column: the sum of the instructions writing there
    outer: Dict[str, torch.Tensor] = {}  # "uuw": the products in1[u, i] in2[u, j] of a pair of inputs
    for spec in specs:
        s1, mul1, d1, s2, mul2, d2, so, mul_out, d_out, sw, sc, mode = spec
        x1 = x[:, s1:s1 + mul1 * d1].reshape(-1, mul1, d1).expand(rows, mul1, d1)
        x2 = y[:, s2:s2 + mul2 * d2].reshape(-1, mul2, d2).expand(rows, mul2, d2)
        C = coefficients[sc:sc + d1 * d2 * d_out].view(d1, d2, d_out)
        if mode == 1:  # uuw: each channel's pair coupled, then the channels mixed by the weights
            key = str(s1) + "," + str(s2)  # instructions of one pair of inputs share its products
            if key not in outer:
                outer[key] = (x1[:, :, :, None] * x2[:, :, None, :]).reshape(rows * mul1, d1 * d2)
            pairs = torch.mm(outer[key], C.reshape(d1 * d2, d_out)).view(rows, mul1, d_out)
            if shared:
                W = weights[sw].view(mul1, mul_out)
                part = torch.mm(pairs.transpose(1, 2).reshape(rows * d_out, mul1), W).view(rows, d_out, mul_out)
            else:
                W = weights[sw].reshape(-1, mul1, mul_out).expand(rows, mul1, mul_out)
                part = torch.bmm(pairs.transpose(1, 2), W)
            part = part.transpose(1, 2)
        elif not shared:
            W = weights[sw].reshape(-1, mul1, mul2, mul_out).expand(rows, mul1, mul2, mul_out)
            pairs = torch.einsum("zui,zkiv->zkuv", x1, torch.einsum("zvj,ijk->zkiv", x2, C))
            part = torch.einsum("zkuv,zuvw->zwk", pairs, W)
        elif d_out <= d1 and d_out <= d2:  # the weights meet the pairs of channels, per output component
            right = torch.einsum("zvj,ijk->zkvi", x2, C).reshape(rows, d_out * mul2, d1)
            pairs = torch.bmm(right, x1.transpose(1, 2))  # [rows, (k, v), u]
            W = weights[sw].view(mul1, mul2, mul_out).transpose(0, 1).reshape(mul2 * mul1, mul_out)
            part = torch.mm(pairs.view(rows * d_out, mul2 * mul1), W).view(rows, d_out, mul_out).transpose(1, 2)
        elif d1 <= d2:  # the weights meet the first input, per its component
            W = weights[sw].view(mul1, mul2 * mul_out)
            first = torch.mm(x1.transpose(1, 2).reshape(rows * d1, mul1), W)  # [(rows, i), (v, w)]
            coupled = torch.einsum("zvj,ijk->zivk", x2, C).reshape(rows, d1 * mul2, d_out)
            part = torch.bmm(first.view(rows, d1 * mul2, mul_out).transpose(1, 2), coupled)
        else:  # the weights meet the second input, per its component
            W = weights[sw].view(mul1, mul2, mul_out).transpose(0, 1).reshape(mul2, mul1 * mul_out)
            second = torch.mm(x2.transpose(1, 2).reshape(rows * d2, mul2), W)  # [(rows, j), (u, w)]
            coupled = torch.einsum("zui,ijk->zjuk", x1, C).reshape(rows, d2 * mul1, d_out)
            part = torch.bmm(second.view(rows, d2 * mul1, mul_out).transpose(1, 2), coupled)
        part = part.reshape(rows, mul_out * d_out)
        blocks[so] = blocks[so] + part if so in blocks else part
    # concatenated, not added into slices of one output: each slice's backward (CopySlices) copies the whole
    # output gradient, once per instruction
    pieces: List[torch.Tensor] = []
    at = 0
    starts = list(blocks.keys())
    starts.sort()
    for start in starts:
        if start > at:
            pieces.append(x.new_zeros(rows, start - at))
        pieces.append(blocks[start])
        at = start + blocks[start].shape[1]
    if at < dim_out or len(pieces) == 0:
        pieces.append(x.new_zeros(rows, dim_out - at))
    return torch.cat(pieces, 1)
