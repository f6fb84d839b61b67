"""Triton polynomial kernels (CUDA; CPU tensors under ``TRITON_INTERPRET=1``): the contract of
the polynomial contract of :mod:`sparse_accumulation.kernels`, on kernels generated per program (:mod:`.polynomial_source`)
whose terms are tables, so that a kernel compiles in seconds however many terms it has.

A call launches at most two kernels: one for the lane outputs (tiles of ``LANE_SUB`` nodes) and one for the
element outputs (larger tiles, walked ``ELEMENT_SUB`` nodes at a time), whose per-tile partial sums are then
summed over each element's tiles in order (:func:`.triton_graph.segment_sum`): deterministic, no atomics. Both
are persistent (a few programs per multiprocessor, each with its slice of a scratch buffer).
Outputs whose terms have more than one element factor (no program of this library makes them) run on the
plain torch kernels, as do eager calls while their kernel compiles (:func:`.launch.ready`).
"""
from __future__ import annotations

import torch

from .. import accumulation_dtype
from ..torch import polynomial as torch_polynomial

try:  # triton is optional: is_available() reports whether this backend can run
    import triton

    from . import build, launch
    from .polynomial_source import LANE_SUB, block_channels, fits, kernel_source, sub_rows, tables
    from .graph import segment_sum
except Exception:  # pragma: no cover - depends on the environment
    triton = None

#: programs per multiprocessor of a persistent kernel (each holds a scratch slice in L1)
PROGRAMS_PER_SM = 8
#: programs of a persistent kernel under the interpreter
_INTERPRETER_PROGRAMS = 2
_INT32_LIMIT = 2**31 - 1
_multiprocessors = {}


def _prev_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def element_tile_rows(nodes: int) -> int:
    """Nodes per tile of an element-output kernel: larger, to keep the per-tile partial sums small."""
    return max(16, min(512, _prev_pow2(nodes // 128)))


def _programs(device, work: int) -> int:
    """Programs of a persistent kernel with ``work`` items on ``device``."""
    if build.interpreting() or device.type != "cuda":
        return max(1, min(work, _INTERPRETER_PROGRAMS))
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = _multiprocessors.get(index)
    if count is None:
        count = _multiprocessors[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return max(1, min(work, count * PROGRAMS_PER_SM))


def _kernel(program, outputs: tuple, acc: str):
    def make():
        found = tables(program, outputs)
        name = build.kernel_name("polynomial", (program.key, outputs, acc))
        source, pointers, ints = kernel_source(name, found, program.channels, acc)
        block_c = block_channels(program.channels)
        sub = sub_rows(found)
        warps = 1 if build.interpreting() else max(1, min(4, sub * block_c // 128))
        configs = [triton.Config({"BLOCK_C": block_c, "SUB": sub}, num_warps=warps, num_stages=1)]
        return build.autotuned(source, name, ints, configs), pointers, ints, found, block_c, sub

    return build.cached(("polynomial", program.key, outputs, acc), make)


def _device_tables(program, outputs: tuple, found, device, dtype) -> tuple:
    """The tables as tensors on ``device`` (made once per program, outputs, device and dtype)."""
    return program.cached(("triton_polynomial_tables", outputs, str(device), dtype), lambda: (
        torch.as_tensor(found.ints, device=device), torch.as_tensor(found.coefficients, dtype=dtype, device=device)))


def _launch(program, tensors, elements, outputs: tuple, targets: dict, rows: int, traceable: bool) -> bool:
    """Launch the kernel of ``outputs`` into ``targets``; False (nothing launched) where an eager call's kernel
    is still compiling (:func:`.launch.ready`)."""
    operand = tensors[0]
    dtype = accumulation_dtype(operand.dtype)
    acc = "tl.float64" if dtype == torch.float64 else "tl.float32"
    kernel, pointer_names, int_names, found, block_c, sub = _kernel(program, outputs, acc)
    ints_table, coefficients = _device_tables(program, outputs, found, operand.device, dtype)
    table, _ = elements.tiles(rows)
    tiles = table.shape[1]
    programs = _programs(operand.device, tiles * triton.cdiv(program.channels, block_c))
    scratch = torch.empty(programs * found.sizes["NCOL"] * sub * block_c, dtype=dtype, device=operand.device)
    available = {f"T{s}": t for s, t in enumerate(tensors)}
    available.update({f"D{i}": targets[j] for i, j in enumerate(outputs)})
    available.update(TAB=ints_table, COEF=coefficients, ORDER=elements.order, TABLE=table, SCR=scratch)
    values = {f"S{s}": t.stride(0) if t.shape[0] > 1 else 0 for s, t in enumerate(tensors)}
    values.update({f"SD{i}": targets[j].stride(0) for i, j in enumerate(outputs)})
    values.update(NT=tiles, R_BUCKET=len(elements).bit_length())
    pointers = [available[n] for n in pointer_names]
    ints = [values[n] for n in int_names]
    largest = max([t.numel() for t in tensors] + [t.numel() for t in targets.values()] + [scratch.numel()])

    def grid(meta):
        return (programs,)

    if not traceable and not launch.ready(kernel, grid, pointers, ints):
        return False
    launch.launch(kernel, grid, pointers, ints, device=operand.device, traceable=traceable, tuning=ints[-1],
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
    if lane and N and not _launch(program, tensors, elements, lane, {j: results[j] for j in lane}, LANE_SUB,
                                  traceable):
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


def is_available() -> bool:
    """Whether this backend can run: triton importable and CUDA available (or the interpreter on)."""
    if triton is None:
        return False
    return build.interpreting() or torch.cuda.is_available()
