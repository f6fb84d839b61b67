"""Triton kernels (CUDA; CPU tensors under ``TRITON_INTERPRET=1``): the contract of
:mod:`sparse_accumulation.kernels`, on kernels generated per rule.

Three kinds of generated kernels (:mod:`.triton.source`), each specialised to the rule, the operands' static
layout, the dtype and the load/store strategy:

* forward: ``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] (* W[r, w[k]]) * C[k]``, one program per
  ``BLOCK_R`` rows, every output column written once;
* fused input gradients: all wanted gradients of a narrow rule (every width at most
  :data:`~.triton.configs.FUSED_GRADIENTS_MAX_WIDTH`) in one pass that reads G and the operands once; wider
  rules, and single gradients, run the forward kernel of the swapped rule;
* dC: deterministic, without atomics (:func:`accumulate_dC`).

Gradients of operands that broadcast are computed per row and then summed over what they broadcast; the fused
gradient kernel sums an operand shared by runs of ``B`` rows (``[E, 1, M]`` against ``[E, F, M]``, ``B`` a
power of two up to :data:`~.triton.configs.SUMMED_INNER_MAX`) itself, in registers.

``strategy`` (module default :data:`STRATEGY`, environment ``SPARSE_ACCUMULATION_TRITON_STRATEGY``) picks how
columns move between memory and registers: ``"auto"`` (pieces loads; tile or pieces stores, autotuned),
``"tile"``, ``"pieces"``, ``"columns"`` or ``"loads+stores"`` (see :mod:`.triton.source`).

Eager calls whose kernels are still compiling (in worker processes) compute with the portable torch kernels of
:mod:`..torch.accumulate` meanwhile (:func:`.launch.portable_meanwhile`).

Measured on an H200 (triton 3.6, fp32, 1000 x 2000 rows, real CG 8x8->8; copy-bandwidth floor 0.097 ms):
forward 0.166 ms with ``"auto"``, fused input gradients 0.31 ms, dC 0.32 ms; see ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import os

import torch

from .. import accumulation_dtype, layout, memo


try:  # triton is optional: is_available() reports whether this backend can run
    import triton

    from ..torch import accumulate as portable
    from . import accumulate_source as source, build, configs, launch
    _TRITON_IMPORT_ERROR = None
except Exception as error:  # pragma: no cover - depends on the environment
    triton = None
    _TRITON_IMPORT_ERROR = error

__all__ = ["accumulate", "accumulate_backward", "accumulate_input_gradients", "accumulate_dC", "is_available",
           "compile_only", "prefetching", "STRATEGY", "STRATEGIES"]

STRATEGIES = ("auto", "tile", "pieces", "columns")
#: default load/store strategy, one of :data:`STRATEGIES` or ``"loads+stores"``
STRATEGY = os.environ.get("SPARSE_ACCUMULATION_TRITON_STRATEGY", "auto")
#: load strategy of the dC kernel ("columns": a chunk loads only the columns it needs)
DC_STRATEGY = os.environ.get("SPARSE_ACCUMULATION_TRITON_DC_STRATEGY", "columns")

_INT32_LIMIT = 2**31 - 1
_MAX_BLOCK_R = 1024
_SLOTS = ("X1", "X2", "W")
_CHECKED_STRATEGIES = frozenset(STRATEGIES)


def compile_only():
    """A context in which the functions of this module only start compiling their kernels, in worker
    processes, and return outputs that hold nothing (see :func:`.launch.compile_only`)."""
    return launch.compile_only()


def prefetching() -> bool:
    """Whether :func:`compile_only` starts any compile (compile workers on; see :func:`.build.prefetching`)."""
    return build.prefetching()


def is_available() -> bool:
    """Whether this backend can run: triton importable and CUDA available (or the interpreter on)."""
    if triton is None:
        return False
    return build.interpreting() or torch.cuda.is_available()


def _check_strategy(strategy):
    strategy = STRATEGY if strategy is None else strategy
    if strategy not in _CHECKED_STRATEGIES and not source.is_strategy(strategy):
        raise ValueError(f"strategy must be one of {STRATEGIES}, or 'loads+stores' with two of "
                         f"{STRATEGIES[1:]}, got {strategy!r}")
    return strategy


def _acc(dtype: torch.dtype) -> str:
    return "tl.float64" if dtype == torch.float64 else "tl.float32"


def _layout(operands, folded, A: int, B: int, output_widths, inner: int = 0) -> tuple:
    """``(Layout, strides)``: the static layout of a call and ``(s_a, s_b, s_m)`` per operand (``inner``: see
    :class:`~.triton.source.Layout`).

    64-bit offsets are needed once the largest offset a program may form (rows past the end included) reaches
    2**31."""
    largest = (A * B + _MAX_BLOCK_R) * max(output_widths, default=0)
    strides, unit = [], []
    for t, (_, _, s_a, s_b) in zip(operands, folded):
        s_m, M = t.stride(-1), t.shape[-1]
        strides.append((s_a, s_b, s_m))
        unit.append(bool(s_m == 1 or M == 1))
        offset = (A + _MAX_BLOCK_R) * abs(s_a) + B * abs(s_b) + M * abs(s_m)
        if offset > largest:
            largest = offset
    # bool(): under torch.compile with dynamic shapes these are symbolic, and become guards here
    return source.Layout(bool(B == 1), tuple(unit), bool(largest >= _INT32_LIMIT), inner), strides


def _int_args(layout, strides, R: int, B: int) -> list:
    values = [R] + ([] if layout.inner_one else [B])
    for (s_a, s_b, s_m), unit in zip(strides, layout.unit):
        values += [s_a] + ([] if layout.inner_one else [s_b]) + ([] if unit else [s_m])
    values.append(R.bit_length() if isinstance(R, int) else 0)  # R_BUCKET, the autotuning key
    return values


def _operands_of(kind: str, rule) -> tuple:
    """``(operands, index arrays)`` of the generated kernel ``kind`` for ``rule``."""
    M1, M2 = rule.input_sizes
    operands = [source.Operand("a", "X1", M1), source.Operand("b", "X2", M2)]
    indices = [rule.m1, rule.m2]
    if rule.weighted:
        operands.append(source.Operand("w", "W", rule.weight_size))
        indices.append(rule.w)
    if kind != "fwd":
        operands.insert(0, source.Operand("g", "G", rule.output_size))
        indices.insert(0, rule.mu)
    return operands, indices


def _row_kernel(kind: str, rule, layout, strategy: str, acc: str, wanted=()):
    """The autotuned kernel ``kind`` ("fwd", or "grad" for the gradients of the slots in ``wanted``: pairs
    ``(slot, summed)``, ``summed`` where the kernel sums the gradient over runs of ``layout.inner`` rows)."""

    def make():
        operands, indices = _operands_of(kind, rule)
        if kind == "fwd":
            outputs = [("OUT", rule.output_size, rule.mu, None, False)]
        else:
            outputs = [(f"D{j}", operands[j + 1].size, indices[j + 1], j + 1, summed) for j, summed in wanted]
        loads, stores = source.split_strategy(strategy)
        stores = source.store_options(stores, [output[1] for output in outputs])
        name = build.kernel_name(kind, (rule.key, layout, strategy, acc, wanted))
        comment = (f"{kind} of a rule with nnz={rule.nnz}, sizes {[o.size for o in operands]} -> "
                   f"{[output[1] for output in outputs]}, {layout}, loads={loads}, stores={stores}")
        text, ints = source.row_kernel_source(name, comment, operands, indices, outputs, layout, loads, stores,
                                              acc)
        if build.interpreting():
            pairs, flags = [(configs.INTERPRETER_BLOCK_R, 1)], [0]
        else:
            sizes = [o.size for o in operands] + [output[1] for output in outputs]
            pairs = configs.row_configs(sizes, sum(len(set(i)) for i in indices) + len(outputs), acc == "tl.float64",
                                        loads)
            flags = [int(s == "tile") for s in stores] if len(stores) > 1 and configs.AUTOTUNE else [0]
        return build.autotuned_row_kernel(text, name, ints, pairs, flags)

    return build.cached((kind, rule.key, layout, strategy, acc, wanted), make)


#: host-side plans of calls per rule, row space, operand strides, dtype and options
_plans = memo.Memo(4096)


def _row_call(kind, rule, operands, folded, rows, output_widths, strategy, wanted=(), inner=0):
    """The :class:`~.triton.launch.Call` of a row kernel (after the layout analysis of :func:`_layout`)."""
    A, B = rows.A, rows.B
    R = A * B
    layout_, strides = _layout(operands, folded, A, B, output_widths, inner)
    kernel = _row_kernel(kind, rule, layout_, strategy, _acc(operands[0].dtype), wanted)
    ints = _int_args(layout_, strides, R, B)
    return launch.Call(kernel, lambda meta: (triton.cdiv(R, meta["BLOCK_R"]),), ints, tuning=ints[-1],
                       small=not layout_.idx64)


def _last_strides(tensors) -> tuple:
    return tuple([t.stride(-1) for t in tensors])


def _forward(operands, folded, C, rule, rows, strategy, traceable):
    out = operands[0].new_empty((*rows.lead, rule.output_size))
    if rows.A * rows.B == 0 or rule.output_size == 0:
        return out
    if rule.nnz == 0:
        return out.zero_()
    call = _plans.get(("fwd", rule.key, rows.A, rows.B, tuple(folded), _last_strides(operands), operands[0].dtype,
                       strategy),
                      lambda: _row_call("fwd", rule, operands, folded, rows, (rule.output_size,), strategy))
    call(list(operands) + [C if C.is_contiguous() else C.contiguous(), out], out.device, traceable)
    return out


def accumulate(X1, X2, W, C, rule, rows, strategy=None, traceable=False):
    """``out[..., mu[k]] += X1[m1[k]] * X2[m2[k]] * W[w[k]] * C[k]``; see :mod:`sparse_accumulation.kernels`.

    ``traceable``: launch through ``torch.library.wrap_triton`` (inside a registered op being traced). An eager
    call whose kernel is still compiling computes with the portable kernels (:func:`.launch.portable_meanwhile`).
    """
    operands = [X1, X2] if W is None else [X1, X2, W]
    strategy = _check_strategy(strategy)
    if traceable:
        return _forward(operands, rows.operands, C, rule, rows, strategy, traceable)
    try:
        with launch.portable_meanwhile():
            return _forward(operands, rows.operands, C, rule, rows, strategy, traceable)
    except launch.NotCompiled:
        return portable.accumulate(X1, X2, W, C, rule, rows)


def _summed_dims(t, f, rows):
    """The dimensions of ``[A, B, M]`` rows that the gradient of operand ``t`` (folded ``f``) is summed over,
    or None where it has ``t``'s own shape."""
    if (f[0], f[1]) == (rows.A, rows.B):
        return None
    return tuple(d for d in (0, 1) if f[d] == 1 and (rows.A, rows.B)[d] != 1)


def _gradient_plan(rule, operands, folded, rows, wanted, strategy) -> tuple:
    """``(call, outputs)`` of the fused gradient kernel: the row kernel call (None without rows or nonzeros)
    and per wanted slot ``(slot, dims)``: the dimensions of full ``[A, B, M]`` rows that its gradient is summed
    over afterwards, or None where the kernel writes the operand's own shape."""
    slots = tuple(j for j in range(len(operands) - 1) if wanted[j])
    A, B = rows.A, rows.B
    # an operand shared by runs of B rows (A_i = A, B_i = 1) has its gradient summed over them in the kernel
    inner = B if 1 < B <= configs.SUMMED_INNER_MAX and B & (B - 1) == 0 else 0
    summed = tuple(bool(inner) and tuple(folded[j + 1][:2]) == (A, 1) for j in slots)
    outputs = tuple((j, None if in_kernel else _summed_dims(operands[j + 1], folded[j + 1], rows))
                    for j, in_kernel in zip(slots, summed))
    call = None
    if slots and A * B and rule.nnz:
        call = _row_call("grad", rule, operands, folded, rows, tuple(operands[j + 1].shape[-1] for j in slots),
                         strategy, tuple(zip(slots, summed)), inner if any(summed) else 0)
    return call, outputs


def accumulate_input_gradients(G, X1, X2, W, C, rule, rows, wanted=(True, True, False), strategy=None,
                               traceable=False):
    """The wanted gradients among ``(dX1, dX2, dW)`` in one kernel that reads G and the operands once
    (``None`` where not wanted); each of its operand's shape."""
    strategy = _check_strategy(strategy)
    G, g_folded = layout.output_rows(G, rows)
    operands = [G, X1, X2] if W is None else [G, X1, X2, W]
    folded = (g_folded,) + rows.operands
    call, outputs = _plans.get(("grad", rule.key, rows.A, rows.B, folded, _last_strides(operands), X1.dtype,
                                strategy, tuple(wanted)),
                               lambda: _gradient_plan(rule, operands, folded, rows, wanted, strategy))
    # the shapes come from the operands of this call: the plan's key holds only their folded description
    targets = [X1.new_empty(operands[j + 1].shape if dims is None else (rows.A, rows.B, operands[j + 1].shape[-1]))
               for j, dims in outputs]
    if call is None:
        for t in targets:
            t.zero_()
    elif targets:
        call(operands + [C if C.is_contiguous() else C.contiguous()] + targets, X1.device, traceable)
    grads = [None, None, None]
    for (j, dims), target in zip(outputs, targets):
        grads[j] = target if dims is None else target.sum(dims, keepdim=True).view(operands[j + 1].shape)
    return tuple(grads)


def accumulate_dC(G, X1, X2, W, rule, rows, strategy=None, traceable=False):
    """``dC[k] = sum over rows of G[mu[k]] * X1[m1[k]] * X2[m2[k]] (* W[w[k]])``, deterministic; ``[nnz]``."""
    strategy = _check_strategy(DC_STRATEGY if strategy is None else strategy)
    A, B = rows.A, rows.B
    R = A * B
    if R == 0 or rule.nnz == 0:
        return torch.zeros(rule.nnz, dtype=X1.dtype, device=X1.device)
    G, g_folded = layout.output_rows(G, rows)
    operands = [G, X1, X2] + ([] if W is None else [W])
    acc = _acc(X1.dtype)
    block_r, num_warps, blocks, chunk_size = configs.coefficient_gradient_config(acc == "tl.float64",
                                                                                 build.interpreting())
    layout_, strides = _layout(operands, [g_folded] + list(rows.operands), A, B, [])
    names, indices = _operands_of("dC", rule)

    def make():
        name = build.kernel_name("dC", (rule.key, layout_, strategy, acc, chunk_size))
        text, ints = source.coefficient_gradient_source(name, f"dC of a rule with nnz={rule.nnz}, {layout_}",
                                                        names, indices, layout_,
                                                        source.split_strategy(strategy)[0], acc, chunk_size)
        return build.fixed_kernel(text, name, ints, {"BLOCK_R": block_r, "BLOCKS": blocks}, num_warps)

    kernel = build.cached(("dC", rule.key, layout_, strategy, acc, chunk_size, block_r, blocks, num_warps), make)
    chunks, width = source.coefficient_gradient_plan(rule.nnz, chunk_size)
    programs = triton.cdiv(R, block_r * blocks)
    partial = torch.empty((programs, len(chunks) * width), dtype=accumulation_dtype(X1.dtype), device=X1.device)
    ints = _int_args(layout_, strides, R, B)[:-1]
    launch.launch(kernel, lambda meta: (len(chunks), programs), operands + [partial], ints, device=X1.device,
                  traceable=traceable, small=not layout_.idx64)
    size = len(chunks[0])
    sums = partial.sum(0).view(len(chunks), width)[:, :size].reshape(-1)[:rule.nnz]
    return sums.to(X1.dtype)


def accumulate_backward(G, X1, X2, W, C, rule, rows, want_x1=True, want_x2=True, want_w=False, want_c=True,
                        traceable=False):
    """Gradients ``(dX1, dX2, dW, dC)`` (``None`` where not wanted); see :mod:`sparse_accumulation.kernels`.

    For narrow rules the wanted input gradients come from one kernel (G and the operands read once); for
    wider ones, and for a single one, each is the forward kernel of the swapped rule; dC has its own kernel. An
    eager call one of whose kernels is still compiling computes with the portable kernels.
    """
    if not traceable:
        try:
            with launch.portable_meanwhile():
                return _backward(G, X1, X2, W, C, rule, rows, want_x1, want_x2, want_w, want_c, traceable)
        except launch.NotCompiled:
            return portable.accumulate_backward(G, X1, X2, W, C, rule, rows, want_x1, want_x2, want_w, want_c)
    return _backward(G, X1, X2, W, C, rule, rows, want_x1, want_x2, want_w, want_c, traceable)


def _backward(G, X1, X2, W, C, rule, rows, want_x1, want_x2, want_w, want_c, traceable):
    operands = [X1, X2] if W is None else [X1, X2, W]
    wanted = (want_x1, want_x2, want_w and W is not None)
    widths = [t.shape[-1] for t in operands] + [rule.output_size]
    grads = [None, None, None]
    if sum(wanted) > 1 and max(widths) <= configs.FUSED_GRADIENTS_MAX_WIDTH:
        grads = list(accumulate_input_gradients(G, X1, X2, W, C, rule, rows, wanted, traceable=traceable))
    elif any(wanted):
        strategy = _check_strategy(None)
        G_rows, g_folded = layout.output_rows(G, rows)
        for j, want in enumerate(wanted):
            if want:
                swapped = [G_rows if i == j else t for i, t in enumerate(operands)]
                folded = [g_folded if i == j else f for i, f in enumerate(rows.operands)]
                full = _forward(swapped, folded, C, rule.swapped(_SLOTS[j]), rows, strategy, traceable)
                dims = _summed_dims(operands[j], rows.operands[j], rows)
                if dims is not None:
                    full = full.view(rows.A, rows.B, -1).sum(dims, keepdim=True)
                grads[j] = full.view(operands[j].shape)
    dC = accumulate_dC(G, X1, X2, W, rule, rows, traceable=traceable) if want_c else None
    return grads[0], grads[1], grads[2], dC
