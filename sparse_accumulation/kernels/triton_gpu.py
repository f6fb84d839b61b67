"""Triton kernels for sparse accumulation, generated per rule.

``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] * C[k]`` on 2-D ``[rows, components]`` tensors of any strides.

Every rule gets its own kernel: the indices ``m1, m2, mu`` are written into generated Triton source as
literals (only the coefficients ``C`` are read at run time, one scalar load per nonzero, since they change
during training). One program handles ``BLOCK_R`` rows; inside it each used input column is held once in
registers as a ``[BLOCK_R]`` vector, the nonzeros are grouped by output column so that every output column
is summed in registers and written exactly once (columns that no nonzero hits are written as zeros).

Ways of moving the data between memory and those column vectors (``strategy``):

* ``"columns"``: one strided load per used input column and one strided store per output column;
* ``"tile"``: one coalesced, masked 2-D load of a ``[BLOCK_R, M_pad]`` tile per input (``M_pad`` the next
  power of two), split into columns at compile time (``tl.reshape`` to ``[BLOCK_R, 2, ..., 2]``, then a tree of
  ``tl.split``), and one 2-D store of the output tile built by a tree of ``tl.join``;
* ``"pieces"``: the same, per power-of-two segment of the columns (17 = 16 + 1), so no lane is masked off;
* ``"loads+stores"`` combines two of those (``"pieces+tile"``);
* ``"auto"`` (the default): ``"pieces"`` loads, and the store strategy ("tile" or "pieces") is a compile-time
  branch on the ``STORE_TILE`` constexpr that autotuning picks, together with ``BLOCK_R`` and ``num_warps``.

Inside the sums, the side with fewer distinct vectors is factored out (``x * (y1 * C[k1] + y2 * C[k2])``),
which saves multiply-adds in the l = 8 kernels, whose instruction count is close to their memory time.

The module-level :data:`STRATEGY` (environment ``SPARSE_ACCUMULATION_TRITON_STRATEGY``) picks the default;
the entry points also take ``strategy=``.

The generated source is written (atomically) to a file in a cache folder and imported, since ``triton.jit``
reads a function's source through ``inspect``. ``triton.jit`` decides when a kernel is created whether it
runs under the interpreter (``TRITON_INTERPRET=1``), so the flag is part of the kernel cache key; the generated
code calls only triton builtins and a combine function defined next to it, never triton's own ``@jit``
library helpers (``tl.sum``, ``tl.zeros``: those are created once, when triton is imported, in the mode of that
moment), so interpreted kernels also work when triton was imported before the variable was set.

``accumulate_dC`` is deterministic, without atomics: the distinct (mu, m1, m2) triples are split into chunks
(``DC_CHUNK``, the number of per-row accumulators a program keeps in registers); program (chunk, p) walks
``DC_BLOCKS`` consecutive blocks of ``DC_BLOCK_R`` rows accumulating products elementwise, reduces once at the
end and writes its slots of a ``[programs, slots]`` buffer, which ``torch.sum`` reduces in a fixed order.
The configuration is fixed (not autotuned), so the summation order never depends on a tuning outcome.

Measured on an H200 (triton 3.6, fp32, 1000 x 2000 rows, real CG 8x8->8; copy-bandwidth floor 0.097 ms):
forward 0.166 ms with ``"auto"``, 0.265 with ``"tile"``, 0.408 with ``"columns"``; fused input gradients
0.31 ms; dC 0.32 ms with ``"columns"`` loads (chunks of 96). See ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import weakref

import torch

from . import accumulation_dtype

try:  # triton is optional: is_available() reports whether this backend can run
    import triton
    import triton.language as tl  # noqa: F401  (used by the generated modules)
    _TRITON_IMPORT_ERROR = None
except Exception as error:  # pragma: no cover - depends on the environment
    triton = None
    _TRITON_IMPORT_ERROR = error

__all__ = ["accumulate", "accumulate_backward", "accumulate_input_gradients", "accumulate_dC", "is_available",
           "STRATEGY", "STRATEGIES"]

STRATEGIES = ("auto", "tile", "pieces", "columns")
#: default load/store strategy, one of :data:`STRATEGIES` or ``"loads+stores"``
STRATEGY = os.environ.get("SPARSE_ACCUMULATION_TRITON_STRATEGY", "auto")

#: forward and input-gradient kernels on CUDA autotune over at most 4 (BLOCK_R, num_warps) configurations picked
#: from these rows per thread and warps by a register estimate (see ``_row_configs``), times the two store
#: strategies under "auto"; environment ``SPARSE_ACCUMULATION_TRITON_AUTOTUNE=0`` keeps only the first
#: configuration with "pieces" stores (a heuristic choice, no tuning runs)
AUTOTUNE = os.environ.get("SPARSE_ACCUMULATION_TRITON_AUTOTUNE", "1") != "0"
ROWS_PER_THREAD = (1, 2, 4)
#: per-thread register budget (32-bit registers) for the values a forward program keeps live
REGISTER_BUDGET = 128
#: the single configuration under the interpreter (forward and dC)
INTERPRETER_BLOCK_R = 32
#: dC kernel, fixed (not autotuned, so the summation order never depends on tuning): rows per block, warps,
#: consecutive blocks per program, and distinct triples per chunk (accumulators in registers; halved for
#: fp64); under the interpreter: BLOCK_R = INTERPRETER_BLOCK_R, 2 blocks per program, chunks of 8
DC_BLOCK_R = 128
DC_NUM_WARPS = 4
DC_BLOCKS = 16
DC_CHUNK = 96
#: load strategy of the dC kernel when none is given ("columns": a chunk loads only the columns it needs)
DC_STRATEGY = os.environ.get("SPARSE_ACCUMULATION_TRITON_DC_STRATEGY", "columns")
INTERPRETER_DC_BLOCKS = 2
INTERPRETER_DC_CHUNK = 8

#: widest active dimension (max of M1, M2, output_size) for which the input gradients use the fused kernel
#: (beyond it a program would hold too many values per row); measured on an H200, 2e6 rows fp32, "pieces"
#: loads (benchmarks/gpu_breakdown.py): fused 0.064 / 0.122 / 0.328 ms against two swapped forwards
#: 0.082 / 0.147 / 0.344 ms at l = 2 / 4 / 8
FUSED_GRADIENTS_MAX_WIDTH = 17

_INT32_LIMIT = 2**31 - 1
_MAX_BLOCK_R = 1024


def is_available() -> bool:
    """Whether this backend can run: triton importable and CUDA available (or the interpreter on)."""
    if triton is None:
        return False
    if _interpreting():
        return True
    return torch.cuda.is_available()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


# ----------------------------------------------------------------------------------------------------------
# code generation


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _log2(p: int) -> int:
    return p.bit_length() - 1


class _Code:
    """Lines of generated source; ``indent`` defaults to ``base`` levels of four spaces."""

    def __init__(self, base: int = 1):
        self.lines = []
        self.base = base

    def __call__(self, line: str = "", indent: int = None) -> None:
        indent = self.base if indent is None else indent
        self.lines.append("    " * indent + line if line else "")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _emit_prologue(code: _Code, names) -> None:
    """rows (int32 or int64), row mask, and int64 strides when IDX64."""
    code("pid = tl.program_id(0)")
    code("if IDX64:")
    code("rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)", 2)
    for s in names:
        code(f"{s} = tl.cast({s}, tl.int64)", 2)
    code("else:")
    code("rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)", 2)
    code("rmask = rows < R")


def _segments(size: int, strategy: str):
    """``(start, width)`` column ranges of a ``[R, size]`` tensor, each moved by one access per program.

    "columns": every column alone; "tile": one power-of-two range covering all (masked past ``size``);
    "pieces": the binary decomposition of ``size`` (17 = 16 + 1), so that no lane is masked off."""
    if strategy == "columns" or size == 1:
        return [(j, 1) for j in range(size)]
    if strategy == "tile":
        return [(0, _next_pow2(size))]
    segments, start = [], 0
    for bit in reversed(range(size.bit_length())):
        if size & (1 << bit):
            segments.append((start, 1 << bit))
            start += 1 << bit
    return segments


def _emit_column_loads(code: _Code, var: str, ptr: str, s_r: str, s_m: str, size: int, used,
                       strategy: str, acc: str) -> dict:
    """Load the used columns of a [R, size] input; returns {column: variable name} (in ``acc`` dtype).

    A segment of width 1 is one strided vector load; a wider one is a coalesced 2-D load of a
    ``[BLOCK_R, width]`` tile, split into its columns at compile time (``tl.reshape`` to
    ``[BLOCK_R, 2, ..., 2]``, then a tree of ``tl.split``)."""
    used = set(used)
    names = {}
    code(f"{var}_base = {ptr} + rows * {s_r}")
    for start, width in _segments(size, strategy):
        columns = [j for j in range(start, start + width) if j in used]
        if not columns:
            continue
        offset = "" if start == 0 else f" + {start} * {s_m}"
        if width == 1:
            code(f"{var}{start} = tl.load({var}_base{offset}, mask=rmask, other=0.0).to({acc})")
            names[start] = f"{var}{start}"
            continue
        bits = _log2(width)
        tile = f"{var}_{start}"
        code(f"{tile}_cols = tl.arange(0, {width})")
        mask = ("rmask[:, None]" if start + width <= size
                else f"rmask[:, None] & ({tile}_cols[None, :] < {size - start})")
        code(f"{tile}_t = tl.load({var}_base[:, None]{offset} + {tile}_cols[None, :] * {s_m}, "
             f"mask={mask}, other=0.0)")
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


def _factored_terms(terms, acc: str) -> list:
    """Expressions summing to ``sum left * right * C[k]`` over ``terms`` ``(k, left, right)``, with the side
    that has fewer distinct vectors factored out: ``x * (y1 * C[k1] + y2 * C[k2])`` costs one
    multiply-add per nonzero plus one per distinct factor instead of two per nonzero."""
    if len({left for _, left, _ in terms}) > len({right for _, _, right in terms}):
        terms = [(k, right, left) for k, left, right in terms]
    by_factor = {}
    for k, factor, other in terms:
        by_factor.setdefault(factor, []).append(f"{other} * tl.load(C + {k}).to({acc})")
    return [f"{factor} * ({' + '.join(parts)})" for factor, parts in by_factor.items()]


def _emit_output(code: _Code, groups, out_ptr: str, width: int, strategy: str, acc: str, out_ty: str,
                 prefix: str) -> None:
    """Sum and store every column of a contiguous ``[R, width]`` output, segment by segment.

    ``groups`` maps an output column to its terms ``(k, left, right)``: ``column += left * right * C[k]``,
    ``left``/``right`` names of loaded column vectors; columns without terms are stored as zeros. A wide
    segment is built by a tree of ``tl.join`` and stored as one 2-D tile.
    """
    code(f"{prefix}_base = {out_ptr} + rows * {width}")
    zero = None
    for start, size in _segments(width, strategy):
        leaves = []
        for o in range(start, start + size):
            if o in groups:
                for i, term in enumerate(_factored_terms(groups[o], acc)):
                    code(f"{prefix}{o} = {term}" if i == 0 else f"{prefix}{o} = {prefix}{o} + {term}")
                code(f"{prefix}y{o} = {prefix}{o}.to({out_ty})")
                leaves.append(f"{prefix}y{o}")
            else:
                if zero is None:
                    zero = f"{prefix}_zero"
                    code(f"{zero} = tl.full([BLOCK_R], 0, dtype={out_ty})")
                leaves.append(zero)
        offset = "" if start == 0 else f" + {start}"
        if size == 1:
            code(f"tl.store({prefix}_base{offset}, {leaves[0]}, mask=rmask)")
            continue
        tree = _join_tree(code, leaves, f"{prefix}j{start}_")
        cols = f"{prefix}_cols{start}"
        code(f"{cols} = tl.arange(0, {size})")
        mask = "rmask[:, None]" if start + size <= width else f"rmask[:, None] & ({cols}[None, :] < {width - start})"
        code(f"tl.store({prefix}_base[:, None]{offset} + {cols}[None, :], tl.reshape({tree}, [BLOCK_R, {size}]), "
             f"mask={mask})")


def _header(name: str, comment: str, signature: str) -> _Code:
    code = _Code()
    code.lines = ["import triton", "import triton.language as tl", "", ""]
    code(f"# {comment}", 0)
    code(f"def {name}({signature}, BLOCK_R: tl.constexpr, IDX64: tl.constexpr, STORE_TILE: tl.constexpr):", 0)
    return code


def _emit_stores(code: _Code, stores: tuple, emit) -> None:
    """``emit(code, name)`` for the one store strategy in ``stores``, or for ``("tile", other)`` both, under
    a compile-time branch on the ``STORE_TILE`` constexpr (autotuning then picks one)."""
    if len(stores) == 1:
        emit(code, stores[0])
        return
    for i, name in enumerate(stores):
        code("if STORE_TILE:" if i == 0 else "else:")
        branch = _Code(base=code.base + 1)
        emit(branch, name)
        code.lines += branch.lines


def _forward_source(rule, loads: str, stores: tuple, acc: str, name: str) -> str:
    M1, M2 = rule.input_sizes
    O = rule.output_size
    code = _header(name, f"rule: M1={M1} M2={M2} output_size={O} nnz={rule.nnz} loads={loads} stores={stores}",
                   "X1, X2, C, OUT, R, s1r, s1m, s2r, s2m, R_BUCKET, LAYOUT")
    _emit_prologue(code, ("s1r", "s1m", "s2r", "s2m"))
    x1 = _emit_column_loads(code, "a", "X1", "s1r", "s1m", M1, rule.m1, loads, acc)
    x2 = _emit_column_loads(code, "b", "X2", "s2r", "s2m", M2, rule.m2, loads, acc)
    groups = {}
    for k, (a, b, o) in enumerate(zip(rule.m1, rule.m2, rule.mu)):
        groups.setdefault(o, []).append((k, x1[a], x2[b]))
    _emit_stores(code, stores,
                 lambda branch, s: _emit_output(branch, groups, "OUT", O, s, acc, "OUT.dtype.element_ty", "acc"))
    return code.text()


def _input_gradients_source(rule, loads: str, stores: tuple, acc: str, name: str) -> str:
    """dX1 and dX2 in one program: G, X1 and X2 are read once, both gradients written once.

    ``dX1[m1] += C G[mu] X2[m2]`` and ``dX2[m2] += C G[mu] X1[m1]``."""
    M1, M2 = rule.input_sizes
    O = rule.output_size
    code = _header(name, f"input gradients of rule: M1={M1} M2={M2} output_size={O} nnz={rule.nnz} "
                         f"loads={loads} stores={stores}",
                   "G, X1, X2, C, D1, D2, R, sgr, sgm, s1r, s1m, s2r, s2m, R_BUCKET, LAYOUT")
    _emit_prologue(code, ("sgr", "sgm", "s1r", "s1m", "s2r", "s2m"))
    g = _emit_column_loads(code, "g", "G", "sgr", "sgm", O, rule.mu, loads, acc)
    x1 = _emit_column_loads(code, "a", "X1", "s1r", "s1m", M1, rule.m1, loads, acc)
    x2 = _emit_column_loads(code, "b", "X2", "s2r", "s2m", M2, rule.m2, loads, acc)
    groups1, groups2 = {}, {}
    for k, (a, b, o) in enumerate(zip(rule.m1, rule.m2, rule.mu)):
        groups1.setdefault(a, []).append((k, g[o], x2[b]))
        groups2.setdefault(b, []).append((k, g[o], x1[a]))

    def emit(branch, s):
        _emit_output(branch, groups1, "D1", M1, s, acc, "D1.dtype.element_ty", "d1_")
        _emit_output(branch, groups2, "D2", M2, s, acc, "D2.dtype.element_ty", "d2_")

    _emit_stores(code, stores, emit)
    return code.text()


def _dC_plan(rule, chunk_size: int):
    """Split the distinct (mu, m1, m2) triples (sorted) into chunks of at most ``chunk_size``.

    Returns ``(chunks, width, index)``: ``chunks`` a list of lists of triples, ``width`` the power of two each
    chunk's slot range is padded to (chunk ``c`` owns slots ``c * width ...``), ``index[k]`` the slot of
    nonzero ``k`` (duplicated triples share a slot)."""
    slots = {}
    for a, b, o in zip(rule.m1, rule.m2, rule.mu):
        slots.setdefault((o, a, b), None)
    triples = sorted(slots)
    n_chunks = max(1, -(-len(triples) // chunk_size))
    size = -(-len(triples) // n_chunks)
    chunks = [triples[i:i + size] for i in range(0, len(triples), size)]
    width = _next_pow2(size)
    for c, chunk in enumerate(chunks):
        for i, t in enumerate(chunk):
            slots[t] = c * width + i
    index = [slots[(o, a, b)] for a, b, o in zip(rule.m1, rule.m2, rule.mu)]
    return chunks, width, index


def _join_tree(code: _Code, leaves, prefix: str) -> str:
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


def _dC_source(rule, strategy: str, acc: str, name: str, chunk_size: int) -> str:
    """Program (chunk, p) handles the triples of one chunk (``program_id(0)``) over ``BLOCKS`` consecutive
    blocks of ``BLOCK_R`` rows (``program_id(1)``): products accumulate elementwise in registers over the
    blocks; at the end the accumulators are joined into a [BLOCK_R, width] tile, reduced over rows once and
    stored to ``PART[p, chunk * width + i]``."""
    M1, M2 = rule.input_sizes
    O = rule.output_size
    chunks, width, _ = _dC_plan(rule, chunk_size)
    loads = _split_strategy(strategy)[0]  # dC stores only its partial sums
    code = _Code()
    # a local combine function instead of tl.sum: triton's own @jit helpers are created when triton is
    # imported, so under the interpreter they only work if TRITON_INTERPRET was set before that import;
    # this one is created with the kernel and always matches its mode
    code.lines = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def _add(a, b):",
                  "    return a + b", "", ""]
    code(f"# dC of rule: M1={M1} M2={M2} output_size={O} nnz={rule.nnz} strategy={strategy} "
         f"chunks={len(chunks)} width={width}", 0)
    code(f"def {name}(G, X1, X2, PART, R, sgr, sgm, s1r, s1m, s2r, s2m, "
         "BLOCK_R: tl.constexpr, BLOCKS: tl.constexpr, IDX64: tl.constexpr):", 0)
    code("chunk = tl.program_id(0)")
    code("pid = tl.program_id(1)")
    code("if IDX64:")
    code("first = pid.to(tl.int64) * (BLOCKS * BLOCK_R)", 2)
    for st in ("sgr", "sgm", "s1r", "s1m", "s2r", "s2m"):
        code(f"{st} = tl.cast({st}, tl.int64)", 2)
    code("else:")
    code("first = pid * (BLOCKS * BLOCK_R)", 2)
    code(f"part = PART + pid.to(tl.int64) * {len(chunks) * width} + chunk * {width}")
    code(f"slots = tl.arange(0, {width})")
    for c, items in enumerate(chunks):
        code(("if" if c == 0 else "elif") + f" chunk == {c}:")
        sub = _Code(base=0)
        for i in range(len(items)):
            sub(f"acc{i} = tl.full([BLOCK_R], 0, dtype={acc})")
        sub("for i in range(BLOCKS):")
        body = _Code(base=0)
        body("rows = first + i * BLOCK_R + tl.arange(0, BLOCK_R)")
        body("rmask = rows < R")
        g = _emit_column_loads(body, "g", "G", "sgr", "sgm", O, [o for o, _, _ in items], loads, acc)
        x1 = _emit_column_loads(body, "a", "X1", "s1r", "s1m", M1, [a for _, a, _ in items], loads, acc)
        x2 = _emit_column_loads(body, "b", "X2", "s2r", "s2m", M2, [b for _, _, b in items], loads, acc)
        previous = None
        for i, (o, a, b) in enumerate(items):
            if (o, a) != previous:
                body(f"ga = {g[o]} * {x1[a]}")
                previous = (o, a)
            body(f"acc{i} += ga * {x2[b]}")
        sub.lines += ["    " + line if line else line for line in body.lines]
        leaves = [f"acc{i}" for i in range(len(items))]
        if len(items) < width:
            sub(f"zero = tl.full([BLOCK_R], 0, dtype={acc})")
            leaves += ["zero"] * (width - len(items))
        if width == 1:
            sub("sums = tl.reduce(acc0[:, None], 0, _add)")
        else:
            tree = _join_tree(sub, leaves, "j")
            sub(f"sums = tl.reduce(tl.reshape({tree}, [BLOCK_R, {width}]), 0, _add)")
        sub("tl.store(part + slots, sums)")
        code.lines += ["        " + line if line else line for line in sub.lines]
    return code.text()


# ----------------------------------------------------------------------------------------------------------
# loading generated source


def _cache_dir() -> str:
    path = os.environ.get("SPARSE_ACCUMULATION_TRITON_CACHE")
    if not path:
        try:
            user = str(os.getuid())
        except AttributeError:  # pragma: no cover - not POSIX
            user = "user"
        path = os.path.join(tempfile.gettempdir(), f"sparse_accumulation_triton_{user}")
    os.makedirs(path, exist_ok=True)
    return path


def _load_function(source: str, name: str):
    """Write ``source`` to ``<cache>/sparse_accumulation_triton_<hash>.py`` (atomically) and import ``name``."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    module_name = f"sparse_accumulation_triton_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        path = os.path.join(_cache_dir(), module_name + ".py")
        current = None
        if os.path.exists(path):
            with open(path) as f:
                current = f.read()
        if current != source:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=module_name, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return getattr(module, name)


# kernels by (kind, rule.key, options); in front of it a per-rule-object cache, so that a call with a rule
# object seen before does not hash the rule's (possibly long) index tuples
_kernels = {}
_kernels_by_rule = weakref.WeakKeyDictionary()
_kernels_lock = threading.Lock()


def _cached(rule, options: tuple, build):
    per_rule = _kernels_by_rule.get(rule)
    if per_rule is not None:
        kernel = per_rule.get(options)
        if kernel is not None:
            return kernel
    key = (rule.key,) + options
    with _kernels_lock:
        kernel = _kernels.get(key)
        if kernel is None:
            kernel = build()
            _kernels[key] = kernel
        try:
            _kernels_by_rule.setdefault(rule, {})[options] = kernel
        except TypeError:  # pragma: no cover - a rule type without weak references
            pass
    return kernel


def _acc_name(dtype: torch.dtype) -> str:
    return "tl.float64" if dtype == torch.float64 else "tl.float32"


def _split_strategy(strategy: str) -> tuple:
    """``"loads+stores"`` (or one name for both) -> ``(loads, stores)``; ``"auto"`` -> ``("pieces", "auto")``."""
    if strategy == "auto":
        return "pieces", "auto"
    loads, _, stores = strategy.partition("+")
    return loads, stores or loads


def _check_strategy(strategy):
    strategy = STRATEGY if strategy is None else strategy
    valid = isinstance(strategy, str) and (
        strategy == "auto" or all(s in STRATEGIES[1:] for s in _split_strategy(strategy)))
    if not valid:
        raise ValueError(f"strategy must be one of {STRATEGIES}, or 'loads+stores' with two of "
                         f"{STRATEGIES[1:]}, got {strategy!r}")
    return strategy


def _store_options(stores: str, output_sizes) -> tuple:
    """The store strategies a kernel is generated with: ``stores`` itself, or for "auto" ``("tile", "pieces")``
    (autotuned), just ``("pieces",)`` where the two coincide (every output width a power of two)."""
    if stores != "auto":
        return (stores,)
    if all(_segments(n, "tile") == _segments(n, "pieces") for n in output_sizes):
        return ("pieces",)
    return ("tile", "pieces")


def _row_configs(sizes, used_columns: int, acc: str, loads: str):
    """(BLOCK_R, num_warps) pairs to tune over, best guess first, from a per-row register estimate.

    ``sizes``: widths of every tensor a row touches; ``used_columns``: column vectors held under "columns"."""
    width = {"tile": sum(_next_pow2(n) for n in sizes), "pieces": sum(sizes)}.get(loads, used_columns)
    if acc == "tl.float64":
        width *= 2
    fitting = [rpt for rpt in ROWS_PER_THREAD if rpt * width <= REGISTER_BUDGET] or [1]
    best = max(fitting)
    pairs = [(best, 4), (1, 4), (best, 8), (1, 2)]
    configs = []
    for rpt, warps in pairs:
        config = (32 * warps * rpt, warps)
        if config not in configs:
            configs.append(config)
    return configs if AUTOTUNE else configs[:1]


_ROW_KERNELS = {
    # kind: (source generator, sizes a row touches, output sizes, column vectors held under "columns")
    "fwd": (_forward_source,
            lambda rule: (*rule.input_sizes, rule.output_size),
            lambda rule: (rule.output_size,),
            lambda rule: len(set(rule.m1)) + len(set(rule.m2)) + 2),
    "grad": (_input_gradients_source,
             lambda rule: (*rule.input_sizes, rule.output_size, *rule.input_sizes),
             lambda rule: rule.input_sizes,
             lambda rule: len(set(rule.m1)) + len(set(rule.m2)) + len(set(rule.mu)) + 4),
}


def _row_kernel(kind: str, rule, strategy: str, acc: str):
    """The autotuned kernel of ``kind`` ("fwd" or "grad") for a rule: one program per ``BLOCK_R`` rows.

    Autotuning runs over ``(BLOCK_R, num_warps)`` and, for the "auto" strategy, the store strategy."""
    interpret = _interpreting()
    source, sizes, output_sizes, used_columns = _ROW_KERNELS[kind]

    def build():
        loads, stores = _split_strategy(strategy)
        stores = _store_options(stores, output_sizes(rule))
        digest = hashlib.sha256(repr((kind, rule.key, loads, stores, acc)).encode()).hexdigest()[:12]
        name = f"sparse_accumulation_{kind}_{digest}"
        fn = triton.jit(_load_function(source(rule, loads, stores, acc, name), name))
        if interpret:
            pairs, tile_flags = [(INTERPRETER_BLOCK_R, 1)], [0]
        else:
            pairs = _row_configs(sizes(rule), used_columns(rule), acc, loads)
            tile_flags = [int(s == "tile") for s in stores] if len(stores) > 1 and AUTOTUNE else [0]
        configs = [triton.Config({"BLOCK_R": b, "STORE_TILE": t}, num_warps=w)
                   for t in tile_flags for b, w in pairs]
        return triton.autotune(configs=configs, key=["R_BUCKET", "LAYOUT"])(fn)

    return _cached(rule, (kind, strategy, acc, interpret, AUTOTUNE), build)


def _dC_config(acc: str):
    """(BLOCK_R, num_warps, BLOCKS, chunk size)."""
    if _interpreting():
        return INTERPRETER_BLOCK_R, 1, INTERPRETER_DC_BLOCKS, INTERPRETER_DC_CHUNK
    chunk = DC_CHUNK // 2 if acc == "tl.float64" else DC_CHUNK
    return DC_BLOCK_R, DC_NUM_WARPS, DC_BLOCKS, max(1, chunk)


def _dC_kernel(rule, strategy: str, acc: str, chunk_size: int):
    """(jitted kernel, number of chunks, slots per partial row, index of the slot of k (CPU), {device: index})."""
    interpret = _interpreting()

    def build():
        digest = hashlib.sha256(repr((rule.key, strategy, acc, chunk_size)).encode()).hexdigest()[:12]
        name = f"sparse_accumulation_dC_{digest}"
        source = _dC_source(rule, strategy, acc, name, chunk_size)
        chunks, width, index = _dC_plan(rule, chunk_size)
        return (triton.jit(_load_function(source, name)), len(chunks), len(chunks) * width,
                torch.tensor(index, dtype=torch.int64), {})

    return _cached(rule, ("dC", strategy, acc, chunk_size, interpret), build)


# ----------------------------------------------------------------------------------------------------------
# launchers


def _max_offset(t: torch.Tensor, extra_rows: int = _MAX_BLOCK_R) -> int:
    """Largest element offset a program may form for ``t`` (rows past the end included)."""
    if t.numel() == 0:
        return 0
    rows, cols = t.shape
    return (rows + extra_rows) * abs(t.stride(0)) + cols * abs(t.stride(1))


def _needs_int64(*tensors) -> bool:
    return any(_max_offset(t) >= _INT32_LIMIT for t in tensors)


class _on_device:
    """Make ``t``'s CUDA device current for the launch (Triton launches on the current device)."""

    def __init__(self, t: torch.Tensor):
        self.ctx = None
        if t.is_cuda and t.device.index is not None and t.device.index != torch.cuda.current_device():
            self.ctx = torch.cuda.device(t.device)

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            return self.ctx.__exit__(*exc)
        return False


def accumulate(X1: torch.Tensor, X2: torch.Tensor, C: torch.Tensor, rule, output_size: int,
               strategy: str = None) -> torch.Tensor:
    """``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] * C[k]``; returns contiguous ``[R, output_size]``.

    X1 ``[R, M1]`` and X2 ``[R, M2]`` may have any strides; C ``[nnz]``; all of one floating dtype.
    """
    strategy = _check_strategy(strategy)
    R = X1.shape[0]
    out = torch.empty((R, output_size), dtype=X1.dtype, device=X1.device)
    if R == 0 or output_size == 0:
        return out
    if rule.nnz == 0:
        return out.zero_()
    C = C.contiguous()
    kernel = _row_kernel("fwd", rule, strategy, _acc_name(X1.dtype))
    idx64 = _needs_int64(X1, X2, out)
    layout = int(X1.stride(1) == 1) + 2 * int(X2.stride(1) == 1)
    r_bucket = R.bit_length()
    grid = lambda meta: (triton.cdiv(R, meta["BLOCK_R"]),)  # noqa: E731
    with _on_device(X1):
        kernel[grid](X1, X2, C, out, R, X1.stride(0), X1.stride(1), X2.stride(0), X2.stride(1),
                     r_bucket, layout, IDX64=idx64)
    return out


def accumulate_input_gradients(G: torch.Tensor, X1: torch.Tensor, X2: torch.Tensor, C: torch.Tensor, rule,
                               strategy: str = None):
    """``(dX1, dX2)`` for the output gradient ``G`` in one kernel: G, X1 and X2 are read once.

    ``dX1[r, m1[k]] += G[r, mu[k]] * X2[r, m2[k]] * C[k]``, ``dX2[r, m2[k]] += G[r, mu[k]] * X1[r, m1[k]] * C[k]``;
    both contiguous, in X1's dtype.
    """
    strategy = _check_strategy(strategy)
    R = X1.shape[0]
    M1, M2 = rule.input_sizes
    d1 = torch.empty((R, M1), dtype=X1.dtype, device=X1.device)
    d2 = torch.empty((R, M2), dtype=X1.dtype, device=X1.device)
    if R == 0:
        return d1, d2
    if rule.nnz == 0:
        return d1.zero_(), d2.zero_()
    C = C.contiguous()
    kernel = _row_kernel("grad", rule, strategy, _acc_name(X1.dtype))
    idx64 = _needs_int64(G, X1, X2, d1, d2)
    layout = int(G.stride(1) == 1) + 2 * int(X1.stride(1) == 1) + 4 * int(X2.stride(1) == 1)
    grid = lambda meta: (triton.cdiv(R, meta["BLOCK_R"]),)  # noqa: E731
    with _on_device(X1):
        kernel[grid](G, X1, X2, C, d1, d2, R, G.stride(0), G.stride(1), X1.stride(0), X1.stride(1),
                     X2.stride(0), X2.stride(1), R.bit_length(), layout, IDX64=idx64)
    return d1, d2


def accumulate_backward(G, X1, X2, C, rule, want_x1=True, want_x2=True, want_c=True):
    """Gradients ``(dX1, dX2, dC)`` (``None`` where not wanted); see :mod:`sparse_accumulation.kernels`.

    For narrow rules both input gradients come from one kernel (G, X1, X2 read once); for wider ones, and when
    only one gradient is wanted, each is a forward kernel of the swapped rule, which holds fewer values per
    row (see :data:`FUSED_GRADIENTS_MAX_WIDTH`); dC has its own deterministic kernel.
    """
    d1 = d2 = None
    if want_x1 and want_x2 and max(*rule.input_sizes, rule.output_size) <= FUSED_GRADIENTS_MAX_WIDTH:
        d1, d2 = accumulate_input_gradients(G, X1, X2, C, rule)
    else:
        if want_x1:
            d1 = accumulate(G, X2, C, rule.swapped("X1"), rule.input_sizes[0])
        if want_x2:
            d2 = accumulate(X1, G, C, rule.swapped("X2"), rule.input_sizes[1])
    return d1, d2, accumulate_dC(G, X1, X2, rule) if want_c else None


def accumulate_dC(G: torch.Tensor, X1: torch.Tensor, X2: torch.Tensor, rule,
                  strategy: str = None) -> torch.Tensor:
    """``dC[k] = sum_r G[r, mu[k]] * X1[r, m1[k]] * X2[r, m2[k]]``, deterministic; returns ``[nnz]``."""
    strategy = _check_strategy(DC_STRATEGY if strategy is None else strategy)
    R = X1.shape[0]
    nnz = rule.nnz
    acc_dtype = accumulation_dtype(X1.dtype)
    if R == 0 or nnz == 0:
        return torch.zeros(nnz, dtype=X1.dtype, device=X1.device)
    acc = _acc_name(X1.dtype)
    block_r, num_warps, blocks, chunk_size = _dC_config(acc)
    kernel, n_chunks, n_slots, index, device_index = _dC_kernel(rule, strategy, acc, chunk_size)
    index_here = device_index.get(X1.device)
    if index_here is None:
        index_here = device_index.setdefault(X1.device, index.to(X1.device))
    programs = triton.cdiv(R, block_r * blocks)
    partial = torch.empty((programs, n_slots), dtype=acc_dtype, device=X1.device)
    idx64 = _needs_int64(G, X1, X2)
    with _on_device(X1):
        kernel[(n_chunks, programs)](G, X1, X2, partial, R, G.stride(0), G.stride(1), X1.stride(0),
                                     X1.stride(1), X2.stride(0), X2.stride(1), BLOCK_R=block_r, BLOCKS=blocks,
                                     IDX64=idx64, num_warps=num_warps, num_stages=1)
    return partial.sum(dim=0).index_select(0, index_here).to(X1.dtype)
