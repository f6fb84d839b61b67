"""Transposition of row blocks for the numba kernels: ``[rows, M]`` rows to ``[M, rows]`` columns and back.

The kernels compute on component-major blocks; their operands come as rows. numba's loops move such blocks
about one element per nanosecond, which for rows of 17 components cost more than the products.
:func:`transpose8` moves an 8 x 8 tile with eight vector loads, 24 shuffles and eight vector stores, written
as LLVM IR that LLVM lowers to the machine's vector instructions (0.1 ns per float32 element on the AVX-512
development machine, 3-4x faster). A row of ``M`` components is moved as ``M // 8`` whole tiles and one
narrow tile for the other ``W = M % 8`` components (:func:`narrow_to_columns`, :func:`narrow_to_rows`),
whose 8-element vectors run past the end of the row: reads stay inside the buffer, and writes are ordered so
that the rows after are written over the overrun afterwards (:func:`_tiled_rows` says how many rows that
allows; the rest go one element at a time). ``W`` is a run-time value (a few predictable branches per tile),
so one compiled mover serves every width: a constant width would compile the tile code once per width in
every kernel that moves rows.
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


def _address(context, builder, kinds, args, first, i):
    """The vector pointer to ``array.flat[start + i * stride]`` for the arguments ``first .. first + 2``
    (``i`` an LLVM integer or a Python int)."""
    vector = ir.VectorType(context.get_data_type(kinds[first].dtype), TILE)
    data = context.make_array(kinds[first])(context, builder, args[first]).data
    start = context.cast(builder, args[first + 1], kinds[first + 1], types.intp)
    stride = context.cast(builder, args[first + 2], kinds[first + 2], types.intp)
    if isinstance(i, int):
        i = ir.Constant(start.type, i)
    offset = builder.add(start, builder.mul(stride, i))
    return builder.bitcast(builder.gep(data, [offset]), vector.as_pointer())


def _loaded(context, builder, kinds, args, rows) -> list:
    """The eight source vectors, vector ``i`` from row ``rows[i]`` of the source."""
    align = context.get_abi_sizeof(context.get_data_type(kinds[0].dtype))
    return [builder.load(_address(context, builder, kinds, args, 0, row), align=align) for row in rows]


@intrinsic
def transpose8(typingctx, source, source_start, source_stride, target, target_start, target_stride):
    """Read 8 vectors of 8 elements at ``source.flat[source_start + i * source_stride + j]`` and store them
    transposed at ``target.flat[target_start + j * target_stride + i]`` (C-contiguous float arrays of one
    dtype; no bounds checks)."""
    if not _typed_arrays(source, target):
        return None

    def codegen(context, builder, signature, args):
        kinds = signature.args
        align = context.get_abi_sizeof(context.get_data_type(kinds[0].dtype))
        for j, column in enumerate(_transposed(builder, _loaded(context, builder, kinds, args, range(TILE)))):
            builder.store(column, _address(context, builder, kinds, args, 3, j), align=align)
        return context.get_dummy_value()

    return types.void(source, source_start, source_stride, target, target_start, target_stride), codegen


def _narrow_signature(source, source_start, source_stride, target, target_start, target_stride, width):
    if not (_typed_arrays(source, target) and isinstance(width, types.Integer)):
        return None
    return types.void(source, source_start, source_stride, target, target_start, target_stride, width)


@intrinsic
def narrow_to_columns(typingctx, source, source_start, source_stride, target, target_start, target_stride,
                      width):
    """:func:`transpose8` that stores only the first ``width`` (1 to 7, a run-time value) columns: the narrow
    tile of rows to columns."""
    signature = _narrow_signature(source, source_start, source_stride, target, target_start, target_stride, width)

    def codegen(context, builder, signature, args):
        kinds = signature.args
        align = context.get_abi_sizeof(context.get_data_type(kinds[0].dtype))
        count = context.cast(builder, args[6], kinds[6], types.intp)
        columns = _transposed(builder, _loaded(context, builder, kinds, args, range(TILE)))
        for j, column in enumerate(columns[:TILE - 1]):
            with builder.if_then(builder.icmp_signed(">", count, ir.Constant(count.type, j)), likely=True):
                builder.store(column, _address(context, builder, kinds, args, 3, j), align=align)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def narrow_to_rows(typingctx, source, source_start, source_stride, target, target_start, target_stride, width):
    """:func:`transpose8` that reads only the first ``width`` (1 to 7, a run-time value) vectors and stores all
    8, each with ``8 - width`` undefined elements at its end: the narrow tile of columns to rows."""
    signature = _narrow_signature(source, source_start, source_stride, target, target_start, target_stride, width)

    def codegen(context, builder, signature, args):
        kinds = signature.args
        align = context.get_abi_sizeof(context.get_data_type(kinds[0].dtype))
        count = context.cast(builder, args[6], kinds[6], types.intp)
        last = builder.sub(count, ir.Constant(count.type, 1))
        # vectors past the width repeat the last one read, so that every load stays inside the source
        rows = [builder.select(builder.icmp_signed(">", count, ir.Constant(count.type, i)),
                               ir.Constant(count.type, i), last) for i in range(TILE)]
        for j, column in enumerate(_transposed(builder, _loaded(context, builder, kinds, args, rows))):
            builder.store(column, _address(context, builder, kinds, args, 3, j), align=align)
        return context.get_dummy_value()

    return signature, codegen


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


@numba.njit(no_cpython_wrapper=True, no_cfunc_wrapper=True)  # called from compiled code only
def rows_to_columns(x, start, n, scratch):
    """``scratch[m, r] = x[start + r * M + m]`` for ``r < n`` and ``m < M = scratch.shape[0]`` (``x`` 1-D,
    ``scratch`` a C-contiguous ``[M, >= n]`` array of the same dtype)."""
    M, width = scratch.shape
    if M == 1:  # a copy (an element loop: a slice assignment would compile its error message)
        for r in range(n):
            scratch[0, r] = x[start + r]
        return
    W = M % TILE
    whole = M - W
    tiled = _tiled_rows(n, M, W, start, x.shape[0])
    for r in range(0, tiled, TILE):
        for m in range(0, whole, TILE):
            transpose8(x, start + r * M + m, M, scratch, m * width + r, width)
        if W:
            narrow_to_columns(x, start + r * M + whole, M, scratch, whole * width + r, width, W)
    for r in range(tiled, n):
        for m in range(M):
            scratch[m, r] = x[start + r * M + m]


@numba.njit(no_cpython_wrapper=True, no_cfunc_wrapper=True)  # called from compiled code only
def columns_to_rows(scratch, start, n, out):
    """``out[start + r * M + m] = scratch[m, r]``: the inverse of :func:`rows_to_columns`."""
    M, width = scratch.shape
    if M == 1:
        for r in range(n):
            out[start + r] = scratch[0, r]
        return
    W = M % TILE
    whole = M - W
    tiled = _tiled_rows(n, M, W, start, out.shape[0])
    for r in range(0, tiled, TILE):
        # the narrow tile first: its vectors run into the next rows, which the whole tiles write afterwards
        if W:
            narrow_to_rows(scratch, whole * width + r, width, out, start + r * M + whole, M, W)
        for m in range(0, whole, TILE):
            transpose8(scratch, m * width + r, width, out, start + r * M + m, M)
    for r in range(tiled, n):
        for m in range(M):
            out[start + r * M + m] = scratch[m, r]
