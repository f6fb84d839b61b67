"""Transposition of row blocks for the numba kernels: ``[rows, M]`` rows to ``[M, rows]`` columns and back.

The kernels compute on component-major blocks; their operands come as rows. numba's loops move such blocks
about one element per nanosecond, which for rows of 17 components cost more than the products.
:func:`transpose8` moves an 8 x 8 tile with eight vector loads, 24 shuffles and eight vector stores, written
as LLVM IR that LLVM lowers to the machine's vector instructions (0.1 ns per float32 element on the AVX-512
development machine, 3-4x faster). A row of ``M`` components is moved as ``M // 8`` whole tiles and one
narrow tile for the other ``W = M % 8`` components (:func:`transpose_narrow`), whose 8-element vectors run
past the end of the row: reads stay inside the buffer, and writes are ordered so that the rows after are
written over the overrun afterwards (:func:`_tiled_rows` says how many rows that allows; the rest go one
element at a time).
"""
from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

#: elements per side of a tile
TILE = 8

_I32 = ir.IntType(32)


def _mask(values) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, len(values)), [ir.Constant(_I32, v) for v in values])


# the three rounds of an 8 x 8 transpose: interleave pairs of rows, then pairs of pairs, then halves
_INTERLEAVE = (_mask([0, 8, 1, 9, 4, 12, 5, 13]), _mask([2, 10, 3, 11, 6, 14, 7, 15]))
_PAIRS = (_mask([0, 1, 8, 9, 4, 5, 12, 13]), _mask([2, 3, 10, 11, 6, 7, 14, 15]))
_HALVES = (_mask([0, 1, 2, 3, 8, 9, 10, 11]), _mask([4, 5, 6, 7, 12, 13, 14, 15]))


def _transposed(builder, rows: list) -> list:
    """The eight columns of the eight vectors ``rows`` (LLVM values of 8 lanes), as vectors."""
    interleaved = []
    for i in range(0, TILE, 2):
        interleaved += [builder.shuffle_vector(rows[i], rows[i + 1], m) for m in _INTERLEAVE]
    # interleaved: rows (0, 1) low and high lanes, then (2, 3), (4, 5), (6, 7)
    pairs = []
    for first in (0, 4):
        for high in (0, 1):
            pairs += [builder.shuffle_vector(interleaved[first + high], interleaved[first + 2 + high], m)
                      for m in _PAIRS]
    # pairs: columns (0, 4), (1, 5), (2, 6), (3, 7) of rows 0-3, then the same of rows 4-7
    columns = [None] * TILE
    for j in range(4):
        columns[j] = builder.shuffle_vector(pairs[j], pairs[4 + j], _HALVES[0])
        columns[j + 4] = builder.shuffle_vector(pairs[j], pairs[4 + j], _HALVES[1])
    return columns


def _typed_arrays(source, target) -> bool:
    return (isinstance(source, types.Array) and isinstance(target, types.Array) and source.dtype == target.dtype
            and source.layout == target.layout == "C" and source.dtype in (types.float32, types.float64))


def _tile_codegen(reads: int, writes: int):
    """Code of a tile transpose that loads ``reads`` vectors (the others are undefined) and stores the first
    ``writes`` columns."""
    def codegen(context, builder, signature, args):
        kinds = signature.args
        element = context.get_data_type(kinds[0].dtype)
        vector = ir.VectorType(element, TILE)
        align = context.get_abi_sizeof(element)

        def address(first, i):
            data = context.make_array(kinds[first])(context, builder, args[first]).data
            start = context.cast(builder, args[first + 1], kinds[first + 1], types.intp)
            stride = context.cast(builder, args[first + 2], kinds[first + 2], types.intp)
            offset = builder.add(start, builder.mul(stride, ir.Constant(start.type, i)))
            return builder.bitcast(builder.gep(data, [offset]), vector.as_pointer())

        if writes == 0:
            return context.get_dummy_value()
        rows = [builder.load(address(0, i), align=align) if i < reads else ir.Constant(vector, ir.Undefined)
                for i in range(TILE)]
        for j, column in enumerate(_transposed(builder, rows)[:writes]):
            builder.store(column, address(3, j), align=align)
        return context.get_dummy_value()
    return codegen


@intrinsic
def transpose8(typingctx, source, source_start, source_stride, target, target_start, target_stride):
    """Read 8 vectors of 8 elements at ``source.flat[source_start + i * source_stride + j]`` and store them
    transposed at ``target.flat[target_start + j * target_stride + i]`` (C-contiguous float arrays of one
    dtype; no bounds checks)."""
    if not _typed_arrays(source, target):
        return None
    return (types.void(source, source_start, source_stride, target, target_start, target_stride),
            _tile_codegen(TILE, TILE))


@intrinsic(prefer_literal=True)
def transpose_narrow(typingctx, source, source_start, source_stride, target, target_start, target_stride, width,
                     to_rows):
    """:func:`transpose8` for ``width`` (a literal below 8; 0 does nothing) components: rows to columns
    (``to_rows`` false) reads 8 vectors of 8 elements and stores the first ``width`` columns; columns to rows
    reads ``width`` vectors and stores all 8 rows, each with ``8 - width`` undefined elements at its end."""
    if not (_typed_arrays(source, target) and isinstance(width, types.IntegerLiteral)
            and isinstance(to_rows, types.BooleanLiteral) and 0 <= width.literal_value < TILE):
        return None
    M = width.literal_value
    reads, writes = (M, TILE) if to_rows.literal_value else (TILE, M)
    if M == 0:
        reads = writes = 0
    return (types.void(source, source_start, source_stride, target, target_start, target_stride, width, to_rows),
            _tile_codegen(reads, writes))


@numba.njit(inline="always")
def _tiled_rows(n, M, W, start, size):
    """How many of ``n`` rows of ``M`` components at ``start`` (of a 1-D buffer of ``size`` elements) are
    moved in tiles, ``W = M % 8`` of each row in a narrow tile whose 8-element vectors run ``8 - W`` elements
    past the row: a multiple of 8 such that those vectors stay inside the buffer and, when rows are written,
    inside the ``n`` rows (the rows after the tiles are written one by one afterwards, over the overrun)."""
    tiled = n
    if W:
        tiled = min(n - (TILE - W + M - 1) // M, (size - start + W - TILE) // M)
    return max(tiled, 0) // TILE * TILE


@numba.njit
def _to_columns(x, start, n, scratch, W):
    numba.literally(W)
    M, width = scratch.shape
    if M == 1:  # a copy
        scratch[0, :n] = x[start:start + n]
        return
    whole = M - W
    tiled = _tiled_rows(n, M, W, start, x.shape[0])
    for r in range(0, tiled, TILE):
        for m in range(0, whole, TILE):
            transpose8(x, start + r * M + m, M, scratch, m * width + r, width)
        transpose_narrow(x, start + r * M + whole, M, scratch, whole * width + r, width, W, False)
    for r in range(tiled, n):
        for m in range(M):
            scratch[m, r] = x[start + r * M + m]


@numba.njit
def _to_rows(scratch, start, n, out, W):
    numba.literally(W)
    M, width = scratch.shape
    if M == 1:
        out[start:start + n] = scratch[0, :n]
        return
    whole = M - W
    tiled = _tiled_rows(n, M, W, start, out.shape[0])
    for r in range(0, tiled, TILE):
        # the narrow tile first: its vectors run into the next rows, which the whole tiles write afterwards
        transpose_narrow(scratch, whole * width + r, width, out, start + r * M + whole, M, W, True)
        for m in range(0, whole, TILE):
            transpose8(scratch, m * width + r, width, out, start + r * M + m, M)
    for r in range(tiled, n):
        for m in range(M):
            out[start + r * M + m] = scratch[m, r]


@numba.njit
def rows_to_columns(x, start, n, scratch):
    """``scratch[m, r] = x[start + r * M + m]`` for ``r < n`` and ``m < M = scratch.shape[0]`` (``x`` 1-D,
    ``scratch`` a C-contiguous ``[M, >= n]`` array of the same dtype)."""
    W = scratch.shape[0] % TILE
    # a literal width in each branch, for which the tile code is generated (a ladder, since numba cannot cache
    # kernels that receive the mover as a function argument)
    if W == 0:
        _to_columns(x, start, n, scratch, 0)
    elif W == 1:
        _to_columns(x, start, n, scratch, 1)
    elif W == 2:
        _to_columns(x, start, n, scratch, 2)
    elif W == 3:
        _to_columns(x, start, n, scratch, 3)
    elif W == 4:
        _to_columns(x, start, n, scratch, 4)
    elif W == 5:
        _to_columns(x, start, n, scratch, 5)
    elif W == 6:
        _to_columns(x, start, n, scratch, 6)
    else:
        _to_columns(x, start, n, scratch, 7)


@numba.njit
def columns_to_rows(scratch, start, n, out):
    """``out[start + r * M + m] = scratch[m, r]``: the inverse of :func:`rows_to_columns`."""
    W = scratch.shape[0] % TILE
    if W == 0:
        _to_rows(scratch, start, n, out, 0)
    elif W == 1:
        _to_rows(scratch, start, n, out, 1)
    elif W == 2:
        _to_rows(scratch, start, n, out, 2)
    elif W == 3:
        _to_rows(scratch, start, n, out, 3)
    elif W == 4:
        _to_rows(scratch, start, n, out, 4)
    elif W == 5:
        _to_rows(scratch, start, n, out, 5)
    elif W == 6:
        _to_rows(scratch, start, n, out, 6)
    else:
        _to_rows(scratch, start, n, out, 7)
