"""Triton polynomial kernels (CUDA; CPU tensors under ``TRITON_INTERPRET=1``): the polynomial contract of
:mod:`sparse_accumulation.kernels`, on kernels generated per program (:mod:`.polynomial_source`) whose terms are
code, split into chunks of kernels that compile in parallel, in seconds.

A call launches the chunks of its lane outputs (tiles of :func:`lane_tile_rows` nodes) and those of its element
outputs (tiles of :func:`element_tile_rows`), one program per tile and block of channels. The element outputs'
per-tile partial sums are then summed over each element's tiles in order (:func:`.triton_graph.segment_sum`):
deterministic, no atomics. Outputs whose terms have more than one element factor (no program of this library makes
them) run on the plain torch kernels, as do eager calls while their kernels compile (:func:`.launch.ready`).
"""
from __future__ import annotations

import torch

from .. import accumulation_dtype
from ..torch import polynomial as torch_polynomial

try:  # triton is optional (backends.is_available says whether this backend can run)
    import triton

    from . import build, launch, polynomial_source
    from .polynomial_source import block_channels, chunks, fits, kernel_source
    from .graph import segment_sum
except Exception:  # pragma: no cover - depends on the environment
    triton = None

_INT32_LIMIT = 2**31 - 1
#: most nodes per tile of an element-output kernel: many where there are many nodes, so that the per-tile partial
#: sums stay small (at 10^4 nodes of MACE's contraction, 41 MB peak forward+backward against 151 MB with tiles of
#: 16 nodes, up to 20% slower)
ELEMENT_TILE_ROWS = 128
#: (chunk kernels, dtype) whose compiles were started together (:func:`.build.compile_together`)
_compiled_together = set()


def _prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def lane_tile_rows(nodes: int) -> int:
    """Nodes per tile of a lane-output kernel: each tile loads its element factors once, and its threads walk
    its nodes one after the other: one node per tile below 2048 nodes (a program per node: the chains of terms
    stay short where there are too few nodes to fill the GPU), then 4 up to 32 from 2^16 nodes."""
    return 1 if nodes < 2048 else max(4, min(32, _prev_pow2(nodes // 2048)))


def element_tile_rows(nodes: int) -> int:
    """Nodes per tile of an element-output kernel: 4 below 512 nodes, then growing with the nodes (about 64
    tiles), up to :data:`ELEMENT_TILE_ROWS` from 8192 nodes (enough programs for small systems, small partial sums
    for large ones)."""
    return max(4, min(ELEMENT_TILE_ROWS, _prev_pow2(nodes // 64)))


def _kernels(program, outputs: tuple, acc: str) -> tuple:
    """The ``(kernel, pointer names, int names)`` of every chunk of ``outputs``, and the channels per block."""
    def make():
        block_c = block_channels(program.channels)
        warps = 1 if build.interpreting() else max(1, min(4, block_c // 32))
        made = []
        for i, chunk in enumerate(chunks(program, outputs, polynomial_source.held_registers(acc))):
            name = build.kernel_name("polynomial", (program.key, outputs, acc, i))
            source, pointers, ints = kernel_source(name, program, outputs, chunk, acc)
            made.append((build.fixed_kernel(source, name, ints, {"BLOCK_C": block_c}, warps), pointers, ints))
        return tuple(made), block_c

    limits = (polynomial_source.MAX_TERMS, polynomial_source.held_registers(acc))
    return build.cached(("polynomial", program.key, outputs, acc, limits), make)


def _launch(program, tensors, elements, outputs: tuple, targets: dict, rows: int, traceable: bool) -> bool:
    """Launch the chunks of ``outputs`` into ``targets`` (``D<i>``: the output at position ``i`` of
    ``outputs``); False (nothing launched) where an eager call's kernels are still compiling
    (:func:`.launch.ready`)."""
    operand = tensors[0]
    acc = "tl.float64" if accumulation_dtype(operand.dtype) == torch.float64 else "tl.float32"
    kernels, block_c = _kernels(program, outputs, acc)
    table, _ = elements.tiles(rows)
    tiles = table.shape[1]
    available = {f"T{s}": t for s, t in enumerate(tensors)}
    available.update({f"D{i}": targets[j] for i, j in enumerate(outputs)})
    available.update(ORDER=elements.order, TABLE=table)
    values = {f"S{s}": t.stride(0) if t.shape[0] > 1 else 0 for s, t in enumerate(tensors)}
    values.update({f"SD{i}": targets[j].stride(0) for i, j in enumerate(outputs)})
    values.update(NT=tiles)
    largest = max([t.numel() for t in tensors] + [t.numel() for t in targets.values()])
    grid_size = tiles * triton.cdiv(program.channels, block_c)

    def grid(meta):
        return (grid_size,)

    calls = [(kernel, [available[n] for n in pointer_names], [values[n] for n in int_names])
             for kernel, pointer_names, int_names in kernels]
    # every chunk asked first, so that all of them start compiling at once
    if not traceable:
        if not all([launch.ready(kernel, grid, pointers, ints) for kernel, pointers, ints in calls]):
            return False
        if (id(kernels), operand.dtype) not in _compiled_together and not launch.compiling_only():
            # where launches wait for their compiles (launch.waiting), the chunks compile in parallel first
            build.compile_together([(kernel, pointers + ints) for kernel, pointers, ints in calls], grid)
            _compiled_together.add((id(kernels), operand.dtype))
    for kernel, pointers, ints in calls:
        launch.launch(kernel, grid, pointers, ints, device=operand.device, traceable=traceable,
                      small=largest <= _INT32_LIMIT)
    return True


def run(program, tensors, elements, outputs, traceable: bool = False) -> tuple:
    """See the polynomial contract of :mod:`sparse_accumulation.kernels`."""
    operand = tensors[0]
    tensors = [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]
    N, E, B = len(elements), elements.num_elements, program.channels
    lane = tuple(j for j in outputs if program.outputs[j].kind == "lane")
    element = tuple(j for j in outputs if program.outputs[j].kind == "element")
    results = {}
    for kind in (lane, element):
        if kind and not program.cached(("triton_fits", kind), lambda: fits(program, kind)):
            results.update(zip(kind, torch_polynomial.run(program, tensors, elements, kind)))
    lane = tuple(j for j in lane if j not in results)
    element = tuple(j for j in element if j not in results)
    for j in lane:
        slot = program.outputs[j]
        results[j] = (operand.new_empty if slot.map.covers(B) and N else operand.new_zeros)((N, slot.width))
    if lane and N and not _launch(program, tensors, elements, lane, {j: results[j] for j in lane},
                                  lane_tile_rows(N), traceable):
        results.update(zip(lane, torch_polynomial.run(program, tensors, elements, lane)))
    if element:
        rows = element_tile_rows(N)
        table, offsets = elements.tiles(rows)
        partial = {}
        for j in element:
            slot = program.outputs[j]
            partial[j] = (operand.new_empty if slot.map.covers(B) else operand.new_zeros)((table.shape[1], slot.width))
        if N and not _launch(program, tensors, elements, element, partial, rows, traceable):
            results.update(zip(element, torch_polynomial.run(program, tensors, elements, element)))
        else:
            for j in element:
                results[j] = segment_sum(partial[j], (offsets, None), E, traceable=traceable)
    return tuple(results[j] for j in outputs)
