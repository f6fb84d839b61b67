"""Generation of the Triton source of one rule's kernels (plain Python: no triton import here).

Every rule gets its own kernels: the index arrays are written into the source as literals; only the
coefficients ``C`` are read at run time, one scalar load per nonzero. A program handles ``BLOCK_R`` rows of the
broadcast ``(A, B)`` row space (flat row ``r = a * B + b``); each operand is addressed through its own strides
(``a * s_a + b * s_b + m * s_m``, stride 0 where it broadcasts), each used input column is held once in
registers as a ``[BLOCK_R]`` vector, and every output column is summed in registers and written exactly once.

A :class:`Layout` fixes what is static about the operands: whether ``B == 1`` (no division of the row index),
which operands have unit component stride, and whether offsets need 64 bits. The load and store strategies
(``"columns"``, ``"tile"``, ``"pieces"``) move columns between memory and the column vectors:

* ``"columns"``: one strided load per used input column and one strided store per output column;
* ``"tile"``: one masked 2-D access of a ``[BLOCK_R, M_pad]`` tile (``M_pad`` the next power of two), split
  into columns at compile time (``tl.reshape`` to ``[BLOCK_R, 2, ..., 2]``, then a tree of ``tl.split``) or
  built from them by a tree of ``tl.join``;
* ``"pieces"``: the same per power-of-two segment of the columns (17 = 16 + 1), so no lane is masked off.

Inside each output sum the factor with the fewest distinct vectors is taken out first, recursively
(``w * (x * (y1 * C[k1] + y2 * C[k2]))``), which saves multiply-adds in the wide kernels.

The generated code calls only triton builtins and a combine function defined next to it, never triton's own
``@jit`` library helpers (``tl.sum``, ``tl.zeros``: those are created once, when triton is imported, in the
interpreter mode of that moment), so interpreted kernels work whenever ``TRITON_INTERPRET`` was set.
"""
from __future__ import annotations

from typing import NamedTuple

from .codegen import Code, factored_sum, next_pow2

STRATEGIES = ("auto", "tile", "pieces", "columns")


class Layout(NamedTuple):
    """What is static about a call's operands, part of a kernel's identity.

    ``inner_one``: ``B == 1`` (the row index is the outer index); ``unit``: per operand (in the kernel's
    operand order), whether its component stride is 1; ``idx64``: offsets need 64-bit arithmetic;
    ``inner``: ``B`` where some output is summed over it in the kernel (a power of two that divides
    ``BLOCK_R``), else 0.
    """

    inner_one: bool
    unit: tuple
    idx64: bool
    inner: int = 0


class Operand(NamedTuple):
    """An input of a generated kernel: ``var`` prefixes its column vectors, ``ptr`` names its pointer
    parameter, ``size`` is its number of components."""

    var: str
    ptr: str
    size: int


def _log2(p: int) -> int:
    return p.bit_length() - 1


def split_strategy(strategy: str) -> tuple:
    """``"loads+stores"`` (or one name for both) -> ``(loads, stores)``; ``"auto"`` -> ``("pieces", "auto")``."""
    if strategy == "auto":
        return "pieces", "auto"
    loads, _, stores = strategy.partition("+")
    return loads, stores or loads


def is_strategy(strategy) -> bool:
    return isinstance(strategy, str) and (strategy == "auto" or all(s in STRATEGIES[1:]
                                                                    for s in split_strategy(strategy)))


def segments(size: int, strategy: str):
    """``(start, width)`` column ranges of a ``[R, size]`` tensor, each moved by one access per program.

    "columns": every column alone; "tile": one power-of-two range covering all (masked past ``size``);
    "pieces": the binary decomposition of ``size`` (17 = 16 + 1)."""
    if strategy == "columns" or size == 1:
        return [(j, 1) for j in range(size)]
    if strategy == "tile":
        return [(0, next_pow2(size))]
    result, start = [], 0
    for bit in reversed(range(size.bit_length())):
        if size & (1 << bit):
            result.append((start, 1 << bit))
            start += 1 << bit
    return result


def store_options(stores: str, output_sizes) -> tuple:
    """The store strategies a kernel is generated with: ``stores`` itself, or for "auto" ``("tile", "pieces")``
    (autotuned), just ``("pieces",)`` where the two coincide (every output width a power of two)."""
    if stores != "auto":
        return (stores,)
    if all(segments(n, "tile") == segments(n, "pieces") for n in output_sizes):
        return ("pieces",)
    return ("tile", "pieces")


def _stride_params(ptr: str, unit: bool, inner_one: bool) -> list:
    names = [f"s{ptr}a"] + ([] if inner_one else [f"s{ptr}b"]) + ([] if unit else [f"s{ptr}m"])
    return names


def signature(operands, outputs, layout: Layout, extra: str = "") -> tuple:
    """``(parameters, int parameters)`` of a row kernel: pointers, R, B, the strides, R_BUCKET."""
    ints = ["R"] + ([] if layout.inner_one else ["B"])
    for operand, unit in zip(operands, layout.unit):
        ints += _stride_params(operand.ptr, unit, layout.inner_one)
    ints.append("R_BUCKET")
    pointers = [o.ptr for o in operands] + ["C"] + list(outputs)
    return pointers + ints, ints


def _emit_rows(code: Code, layout: Layout, ints) -> None:
    """Row indices of the program, the row mask, the outer/inner indices and 64-bit strides."""
    code("pid = tl.program_id(0)")
    if layout.idx64:
        code("rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)")
        for name in ints:
            if name not in ("R", "R_BUCKET"):
                code(f"{name} = tl.cast({name}, tl.int64)")
    else:
        code("rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)")
    code("rmask = rows < R")
    if not layout.inner_one:
        code("outer = rows // B")
        code("inner = rows - outer * B")


def _row_offset(ptr: str, inner_one: bool) -> str:
    return f"rows * s{ptr}a" if inner_one else f"outer * s{ptr}a + inner * s{ptr}b"


def emit_column_loads(code: Code, operand: Operand, unit: bool, used, strategy: str, acc: str,
                      inner_one: bool, mask: str = "rmask") -> dict:
    """Load the used columns of an operand; returns ``{column: variable name}`` (in ``acc`` dtype).

    A segment of width 1 is one strided vector load; a wider one a 2-D load of a ``[BLOCK_R, width]`` tile,
    split into its columns at compile time."""
    var, ptr, size = operand
    column_stride = "" if unit else f" * s{ptr}m"
    used = set(used)
    names = {}
    code(f"{var}_base = {ptr} + {_row_offset(ptr, inner_one)}")
    for start, width in segments(size, strategy):
        columns = [j for j in range(start, start + width) if j in used]
        if not columns:
            continue
        offset = "" if start == 0 else f" + {start}{column_stride}"
        if width == 1:
            code(f"{var}{start} = tl.load({var}_base{offset}, mask={mask}, other=0.0).to({acc})")
            names[start] = f"{var}{start}"
            continue
        bits = _log2(width)
        tile = f"{var}_{start}"
        code(f"{tile}_cols = tl.arange(0, {width})")
        tile_mask = (f"{mask}[:, None]" if start + width <= size
                     else f"{mask}[:, None] & ({tile}_cols[None, :] < {size - start})")
        code(f"{tile}_t = tl.load({var}_base[:, None]{offset} + {tile}_cols[None, :]{column_stride}, "
             f"mask={tile_mask}, other=0.0)")
        code(f"{tile}_t = tl.reshape({tile}_t, [{', '.join(['BLOCK_R'] + ['2'] * bits)}])")
        # after the reshape the last dimension is bit 0 of the column index: a tensor at depth d with value v
        # holds the columns c with c % 2**d == v; tl.split separates bit d
        relative = {j - start for j in columns}

        def split(name, depth, value):
            if depth == bits:
                return
            low, high = value, value + (1 << depth)
            low_name, high_name = f"{tile}_{depth + 1}_{low}", f"{tile}_{depth + 1}_{high}"
            code(f"{low_name}, {high_name} = tl.split({name})")
            for child_name, child in ((low_name, low), (high_name, high)):
                if any(c % (1 << (depth + 1)) == child for c in relative):
                    split(child_name, depth + 1, child)

        split(f"{tile}_t", 0, 0)
        for j in columns:
            code(f"{var}{j} = {tile}_{bits}_{j - start}.to({acc})")
            names[j] = f"{var}{j}"
    return names


def join_tree(code: Code, leaves, prefix: str) -> str:
    """Emit joins of ``leaves`` (a power-of-two count of [BLOCK_R] tensors) into one [BLOCK_R, 2, ..., 2]
    tensor in row-major leaf order; returns its name. Pairs (c, c + n/2) are joined first, so the first join
    makes the top bit of the leaf index and the last join bit 0."""
    level = 0
    while len(leaves) > 1:
        half = len(leaves) // 2
        new = []
        for c in range(half):
            var = f"{prefix}{level}_{c}"
            code(f"{var} = tl.join({leaves[c]}, {leaves[c + half]})")
            new.append(var)
        leaves = new
        level += 1
    return leaves[0]


def emit_summed_output(code: Code, groups, out_ptr: str, width: int, acc: str, prefix: str, inner: int,
                       idx64: bool) -> None:
    """Sum and store every column of a contiguous ``[R / inner, width]`` output: the column's values of each
    run of ``inner`` consecutive rows summed in registers (a fixed tree: deterministic), one column at a time
    (the output is ``inner`` times smaller than the rows read)."""
    out_ty = f"{out_ptr}.dtype.element_ty"
    first = "pid.to(tl.int64)" if idx64 else "pid"
    code(f"{prefix}_rows = {first} * (BLOCK_R // {inner}) + tl.arange(0, BLOCK_R // {inner})")
    code(f"{prefix}_mask = {prefix}_rows < R // {inner}")
    code(f"{prefix}_base = {out_ptr} + {prefix}_rows * {width}")
    for o in range(width):
        if o in groups:
            code(f"{prefix}{o} = tl.reduce(tl.reshape({factored_sum(groups[o], acc)}, [BLOCK_R // {inner}, "
                 f"{inner}]), 1, _add).to({out_ty})")
        else:
            code(f"{prefix}{o} = tl.full([BLOCK_R // {inner}], 0, dtype={out_ty})")
        code(f"tl.store({prefix}_base + {o}, {prefix}{o}, mask={prefix}_mask)")


def emit_output(code: Code, groups, out_ptr: str, width: int, strategy: str, acc: str, prefix: str) -> None:
    """Sum and store every column of a contiguous ``[R, width]`` output, segment by segment.

    ``groups`` maps an output column to its terms ``(k, factors)``: ``column += prod(factors) * C[k]``;
    columns without terms are stored as zeros. A wide segment is built by a tree of ``tl.join`` and stored as
    one 2-D tile."""
    out_ty = f"{out_ptr}.dtype.element_ty"
    code(f"{prefix}_base = {out_ptr} + rows * {width}")
    zero = None
    for start, size in segments(width, strategy):
        leaves = []
        for o in range(start, start + size):
            if o in groups:
                code(f"{prefix}{o} = ({factored_sum(groups[o], acc)}).to({out_ty})")
                leaves.append(f"{prefix}{o}")
            else:
                if zero is None:
                    zero = f"{prefix}_zero"
                    code(f"{zero} = tl.full([BLOCK_R], 0, dtype={out_ty})")
                leaves.append(zero)
        offset = "" if start == 0 else f" + {start}"
        if size == 1:
            code(f"tl.store({prefix}_base{offset}, {leaves[0]}, mask=rmask)")
            continue
        tree = join_tree(code, leaves, f"{prefix}j{start}_")
        cols = f"{prefix}_cols{start}"
        code(f"{cols} = tl.arange(0, {size})")
        mask = "rmask[:, None]" if start + size <= width else f"rmask[:, None] & ({cols}[None, :] < {width - start})"
        code(f"tl.store({prefix}_base[:, None]{offset} + {cols}[None, :], tl.reshape({tree}, [BLOCK_R, {size}]), "
             f"mask={mask})")


def _emit_stores(code: Code, stores: tuple, emit) -> None:
    """``emit(code, name)`` for the one store strategy in ``stores``, or for two of them under a compile-time
    branch on the ``STORE_TILE`` constexpr (autotuning then picks one)."""
    if len(stores) == 1:
        emit(code, stores[0])
        return
    for i, name in enumerate(stores):
        code("if STORE_TILE:" if i == 0 else "else:")
        branch = Code(base=code.base + 1)
        emit(branch, name)
        code.lines += branch.lines


def row_kernel_source(name: str, comment: str, operands, index_arrays, outputs, layout: Layout, loads: str,
                      stores: tuple, acc: str) -> tuple:
    """Source of a kernel that reads ``operands`` row by row and writes ``outputs``.

    Args:
        operands: :class:`Operand` s read by the kernel, in parameter order.
        index_arrays: per operand, the column it reads for each nonzero ``k``.
        outputs: ``(pointer name, width, target, skip, summed)`` each: a contiguous ``[R, width]`` output
            (``[R / layout.inner, width]`` where ``summed``: its rows summed over runs of ``layout.inner``)
            whose column ``target[k]`` receives ``C[k]`` times the columns ``index_arrays[i][k]`` of every
            operand ``i`` but ``skip`` (``None`` for the forward; for a gradient, the position of the operand
            it belongs to, whose place the output gradient takes).
        layout, loads, stores, acc: see :class:`Layout`, :func:`split_strategy`, :func:`store_options`;
            ``acc`` the accumulation dtype (``"tl.float32"`` or ``"tl.float64"``).

    Returns:
        ``(source, int parameter names)``.
    """
    params, ints = signature(operands, [output[0] for output in outputs], layout)
    code = Code()
    code.lines = ["import triton", "import triton.language as tl", "", ""]
    if any(output[4] for output in outputs):  # a local combine function: see the module's last paragraph
        code.lines += ["@triton.jit", "def _add(a, b):", "    return a + b", "", ""]
    code(f"# {comment}", 0)
    code(f"def {name}({', '.join(params)}, BLOCK_R: tl.constexpr, STORE_TILE: tl.constexpr):", 0)
    _emit_rows(code, layout, ints)
    columns = []
    for i, operand in enumerate(operands):
        needed = set()
        for output in outputs:
            if output[3] != i:
                needed.update(index_arrays[i])
        columns.append(emit_column_loads(code, operand, layout.unit[i], needed, loads, acc, layout.inner_one))
    nnz = len(index_arrays[0])

    def emit(branch, strategy):
        for ptr, width, target, skip, summed in outputs:
            groups = {}
            for k in range(nnz):
                factors = tuple(columns[i][index_arrays[i][k]] for i in range(len(operands)) if i != skip)
                groups.setdefault(target[k], []).append((k, factors))
            if summed:
                emit_summed_output(branch, groups, ptr, width, acc, f"o{ptr}_", layout.inner, layout.idx64)
            else:
                emit_output(branch, groups, ptr, width, strategy, acc, f"o{ptr}_")

    _emit_stores(code, stores, emit)
    return code.text(), ints


def coefficient_gradient_plan(nnz: int, chunk_size: int) -> tuple:
    """``(chunks, width)``: nonzeros ``k`` split into ``len(chunks)`` ranges of at most ``chunk_size``
    consecutive ``k``; chunk ``c`` owns the slots ``c * width ...`` (``width`` its size rounded up to a power
    of two) and slot ``c * width + i`` holds nonzero ``chunks[c][i]``."""
    n_chunks = max(1, -(-nnz // chunk_size))
    size = -(-nnz // n_chunks)
    chunks = [list(range(i, min(i + size, nnz))) for i in range(0, nnz, size)] or [[]]
    return chunks, next_pow2(max(size, 1))


def coefficient_gradient_source(name: str, comment: str, operands, index_arrays, layout: Layout, loads: str,
                                acc: str, chunk_size: int) -> tuple:
    """``dC[k] = sum over rows of prod_i operands_i[index_arrays_i[k]]`` (the output gradient is one of the
    operands), deterministic: program ``(chunk, p)`` handles the nonzeros of one chunk over ``BLOCKS``
    consecutive blocks of ``BLOCK_R`` rows, accumulating elementwise in registers; at the end the accumulators
    are joined into a ``[BLOCK_R, width]`` tile, reduced over rows once and stored to
    ``PART[p, chunk * width + i]``. Returns ``(source, int parameter names)``."""
    chunks, width = coefficient_gradient_plan(len(index_arrays[0]), chunk_size)
    ints = ["R"] + ([] if layout.inner_one else ["B"])
    for operand, unit in zip(operands, layout.unit):
        ints += _stride_params(operand.ptr, unit, layout.inner_one)
    params = [o.ptr for o in operands] + ["PART"] + ints
    code = Code()
    # a local combine function instead of tl.sum: triton's own @jit helpers are created when triton is
    # imported, so under the interpreter they only work if TRITON_INTERPRET was set before that import
    code.lines = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def _add(a, b):",
                  "    return a + b", "", ""]
    code(f"# {comment}", 0)
    code(f"def {name}({', '.join(params)}, BLOCK_R: tl.constexpr, BLOCKS: tl.constexpr):", 0)
    code("chunk = tl.program_id(0)")
    code("pid = tl.program_id(1)")
    if layout.idx64:
        code("first = pid.to(tl.int64) * (BLOCKS * BLOCK_R)")
        for s in ints[1:]:
            code(f"{s} = tl.cast({s}, tl.int64)")
    else:
        code("first = pid * (BLOCKS * BLOCK_R)")
    code(f"part = PART + pid.to(tl.int64) * {len(chunks) * width} + chunk * {width}")
    code(f"slots = tl.arange(0, {width})")
    for c, ks in enumerate(chunks):
        code(("if" if c == 0 else "elif") + f" chunk == {c}:")
        sub = Code(base=0)
        tuples = {}
        for k in ks:  # nonzeros with the same indices share one accumulator
            tuples.setdefault(tuple(a[k] for a in index_arrays), len(tuples))
        for i in range(len(tuples)):
            sub(f"acc{i} = tl.full([BLOCK_R], 0, dtype={acc})")
        sub("for i in range(BLOCKS):")
        body = Code(base=0)
        body("rows = first + i * BLOCK_R + tl.arange(0, BLOCK_R)")
        body("rmask = rows < R")
        if not layout.inner_one:
            body("outer = rows // B")
            body("inner = rows - outer * B")
        columns = [emit_column_loads(body, operand, layout.unit[j], [t[j] for t in tuples], loads, acc,
                                     layout.inner_one) for j, operand in enumerate(operands)]
        previous = None
        for t, i in sorted(tuples.items()):  # sorted, so that products of the first two factors are reused
            if t[:2] != previous:
                body(f"p = {columns[0][t[0]]} * {columns[1][t[1]]}")
                previous = t[:2]
            rest = " * ".join(["p"] + [columns[j][t[j]] for j in range(2, len(operands))])
            body(f"acc{i} += {rest}")
        sub.extend(body, 1)
        leaves = [f"acc{tuples[tuple(a[k] for a in index_arrays)]}" for k in ks]
        if len(leaves) < width:
            sub(f"zero = tl.full([BLOCK_R], 0, dtype={acc})")
            leaves += ["zero"] * (width - len(leaves))
        if width == 1:
            sub(f"sums = tl.reduce({leaves[0]}[:, None], 0, _add)")
        else:
            tree = join_tree(sub, leaves, "j")
            sub(f"sums = tl.reduce(tl.reshape({tree}, [BLOCK_R, {width}]), 0, _add)")
        sub("tl.store(part + slots, sums)")
        code.extend(sub, 2)
    return code.text(), ints
