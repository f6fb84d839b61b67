"""Programs for AOTInductor: the library's ops written in plain torch, so that a package runs without it.

``torch.export`` keeps each call of a library op (``torch.ops.sparse_accumulation.accumulate``, ...) as one node,
which only a process that imported sparse_accumulation can run. :func:`decompositions` maps the rule ops and the
message-passing ops to functions of aten ops (``index_select``, ``mul``, ``index_add``, ``sum``) that compute
the same values; with them
:func:`export_for_aoti` returns an exported program with no op of this library left in it, which
``torch._inductor.aoti_compile_and_package`` compiles into code of its own (C++ on the CPU, Triton on CUDA)
and ``torch._inductor.aoti_load_package`` (or libtorch's ``AOTIModelPackageLoader``) runs anywhere torch runs.

The decompositions materialise every product ``X1[m1[k]] * X2[m2[k]] * W[w[k]] * C[k]`` (``[rows, nnz]``
elements) before summing it: inductor fuses the gather and the product, but the result is not the
library's kernels (see the docs, "Deploying a model", for measured costs).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch import Tensor
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from . import backends
from .descriptors.rules import Rule
from .kernels import accumulation_dtype

_OPS = torch.ops.sparse_accumulation


def _index(rule: Rule, name: str, device) -> Tensor:
    # a new tensor, not the rule's cached one, which a trace must not capture or replace
    return torch.from_numpy(rule.array(name).copy()).to(device)


def _factors(rule: Rule, operands, names, device, dtype):
    """``operand[..., index]`` for each operand and index name, in the computation's dtype."""
    return [t.to(dtype).index_select(-1, _index(rule, name, device)) for t, name in zip(operands, names)]


def _product(factors, C: Tensor) -> Tensor:
    result = C
    for factor in factors:
        result = factor * result
    return result


def _scatter(values: Tensor, rule: Rule, name: str, size: int, lead) -> Tensor:
    """``out[..., index[k]] += values[..., k]`` over the leading shape ``lead``."""
    values = values.expand(*lead, values.shape[-1])
    out = values.new_zeros((*lead, size))
    return out.index_add(-1, _index(rule, name, values.device), values)


def _accumulate(X1: Tensor, X2: Tensor, W: Optional[Tensor], C: Tensor, rule: str, implementation: str) -> Tensor:
    """``accumulate`` in aten ops: ``[*broadcast leading shape, output_size]`` in the dtype of ``X1``."""
    del implementation
    rule = Rule.from_key(rule)
    operands = (X1, X2) if W is None else (X1, X2, W)
    dtype = accumulation_dtype(X1.dtype)
    lead = torch.broadcast_shapes(*(t.shape[:-1] for t in operands))
    factors = _factors(rule, operands, ("m1", "m2", "w"), X1.device, dtype)
    return _scatter(_product(factors, C.to(dtype)), rule, "mu", rule.output_size, lead).to(X1.dtype)


def _accumulate_backward(G: Tensor, X1: Tensor, X2: Tensor, W: Optional[Tensor], C: Tensor, rule: str,
                         implementation: str, want_x1: bool, want_x2: bool, want_w: bool, want_c: bool):
    """``accumulate_backward`` in aten ops: ``(dX1, dX2, dW, dC)`` of the inputs' shapes (summed over what each
    broadcasts), an empty tensor where not wanted."""
    del implementation
    rule = Rule.from_key(rule)
    operands = (X1, X2) if W is None else (X1, X2, W)
    names = ("m1", "m2", "w")[:len(operands)]
    wanted = (want_x1, want_x2, want_w and W is not None)
    dtype = accumulation_dtype(X1.dtype)
    lead = G.shape[:-1]
    gathered = _factors(rule, (G,) + operands, ("mu",) + names, X1.device, dtype)
    coefficients = C.to(dtype)
    grads = []
    for slot, (t, name) in enumerate(zip(operands, names)):
        if not wanted[slot]:
            grads.append(X1.new_empty(0))
            continue
        others = [f for j, f in enumerate(gathered) if j != slot + 1]
        full = _scatter(_product(others, coefficients), rule, name, t.shape[-1], lead)
        grads.append(full.sum_to_size(t.shape).to(X1.dtype))
    grads += [X1.new_empty(0)] * (3 - len(operands))
    dC = _product(gathered, torch.ones_like(coefficients)).reshape(-1, rule.nnz).sum(0).to(X1.dtype) if want_c \
        else X1.new_empty(0)
    return (*grads, dC)


def _graph_accumulate(X1, X2, W, T, C, indices, offsets, orders, crule, outputs, rows, edges, implementation,
                      reduction):
    """``graph_accumulate`` (message passing) on the library's plain-torch graph kernels
    (:mod:`sparse_accumulation.kernels.torch.graph`: gathers, products and ``index_add`` over chunks of edges)."""
    del implementation
    from .ops.graph.registered import run

    return run(backends.kernel_module("graph", "torch"), [X1, X2, W, T], C, indices, offsets, orders, crule, outputs,
               rows, edges, reduction, False)


def _graph_coefficient_sums(X1, X2, W, T, indices, crule, edges, implementation):
    """``graph_coefficient_sums`` on the plain-torch graph kernels."""
    del implementation
    from .ops.graph.registered import coefficient_sums

    return coefficient_sums(X1, X2, W, T, indices, crule, edges)


def _polynomial(tensors, elements, order, starts, program, outputs, implementation):
    """``polynomial`` (MACE's symmetric contraction) on the library's plain-torch polynomial kernels."""
    del implementation
    from .indices import Elements
    from .ops.polynomial.registered import run

    return run(program, tensors, Elements.from_tensors(elements, order, starts), outputs, "torch")


def _pair_sum(name: str) -> Callable:
    """The pair sum ``name`` (envsum, sensesum or featsum) on the library's plain-torch pair-sum kernels."""

    def decomposed(a, b, pair_first, pair_second, implementation):
        del implementation
        from .indices import unremembered
        from .ops.pair_sums.registered import run

        with unremembered():  # the pairs of a trace are not remembered
            return run(name, a, b, pair_first, pair_second, "torch")

    return decomposed


def decompositions() -> Dict[Any, Callable]:
    """The library's ops that :func:`export_for_aoti` replaces, each with a function of aten ops.

    Returns:
        A new dict from op overloads to functions with the ops' signatures, which call aten ops only: the rule
        ops (``torch.ops.sparse_accumulation.accumulate.default``, ``accumulate_backward.default``) and the
        message-passing ops (``graph_accumulate.default``, ``graph_coefficient_sums.default``: the fused
        products of :func:`~sparse_accumulation.accumulate_graph` and of
        :class:`sparse_accumulation.e3nn.TensorProduct` with indices), the polynomial op
        (``polynomial.default``: :class:`sparse_accumulation.mace.SymmetricContraction`) and the pair sums
        (``envsum``, ``sensesum``, ``featsum``).
    """
    table = {_OPS.accumulate.default: _accumulate, _OPS.accumulate_backward.default: _accumulate_backward,
             _OPS.graph_accumulate.default: _graph_accumulate,
             _OPS.graph_coefficient_sums.default: _graph_coefficient_sums,
             _OPS.polynomial.default: _polynomial}
    for name in ("envsum", "sensesum", "featsum"):
        table[getattr(_OPS, name).default] = _pair_sum(name)
    return table


class _Decomposing(TorchFunctionMode):
    """Calls of the ops in ``table`` run the table's functions instead (and are traced as those)."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.table.get(func, func)(*args, **(kwargs or {}))


def export_for_aoti(model: torch.nn.Module, args: Sequence[Any], *, dynamic_shapes=None,
                    trace_autograd: bool = False) -> torch.export.ExportedProgram:
    """Export ``model`` on ``args`` with the library's ops replaced by aten ops (:func:`decompositions`).

    The replacement happens while tracing (a ``TorchFunctionMode``), not with
    ``ExportedProgram.run_decompositions``, which in torch 2.13 fails on a decomposition that makes a tensor
    constant (the rule's indices).

    Args:
        model: a module built from the library's layers.
        args: example inputs of ``model.forward`` (a tuple or list).
        dynamic_shapes: as for ``torch.export.export`` (a tuple of ``{dim: torch.export.Dim}`` per argument).
        trace_autograd: for a forward that calls ``torch.autograd.grad`` (forces as minus the gradient of the
            energy), which ``torch.export.export`` does not export (torch 2.13). The forward is traced first
            with ``torch.fx.experimental.proxy_tensor.make_fx``, which runs autograd while tracing and records
            the gradient's ops, then that graph is exported; the parameters and buffers are constants of the
            program. Without ``dynamic_shapes`` the trace runs on the real ``args`` (static shapes); with them,
            on symbolic sizes, and a trace that decided anything about a dimension declared dynamic (a branch
            on it) is refused, since the program would follow that decision at every size.

    Returns:
        An ``ExportedProgram`` of aten ops only (``run_decompositions`` applied), for
        ``torch._inductor.aoti_compile_and_package``.

    Raises:
        ValueError: with ``trace_autograd`` and ``dynamic_shapes``, a trace that depends on a dynamic
            dimension (the message names the condition and the argument).
        NotImplementedError: the model calls an op of this library that has no decomposition (the tensor
            API's indexed op); the message names it.
    """
    args = tuple(args)
    with _Decomposing(decompositions()):
        if trace_autograd and dynamic_shapes is not None:
            model = make_fx(model, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*args)
            _check_dynamic_dimensions(model, dynamic_shapes)
        elif trace_autograd:
            model = make_fx(model, tracing_mode="real")(*args)
        program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    program = program.run_decompositions()
    remaining = sorted({str(node.target) for node in program.graph.nodes
                        if node.op == "call_function" and str(node.target).startswith("sparse_accumulation.")})
    if remaining:
        raise NotImplementedError(f"no decomposition for AOTInductor of {', '.join(remaining)}")
    return program


def _check_dynamic_dimensions(graph: torch.fx.GraphModule, dynamic_shapes) -> None:
    """Raise if the symbolic trace ``graph`` holds a condition (a guard of its shape environment) on a size
    that ``dynamic_shapes`` declares dynamic."""
    placeholders = [node for node in graph.graph.nodes if node.op == "placeholder"]
    dynamic = {}
    for position, (node, spec) in enumerate(zip(placeholders, dynamic_shapes)):
        value = node.meta.get("val")
        for dim in (spec or {}):
            size = value.shape[dim] if isinstance(value, Tensor) else None
            where = f"argument {position}, dimension {dim}"
            symbols = size.node.expr.free_symbols if isinstance(size, torch.SymInt) else ()
            if not symbols:
                raise ValueError(f"the trace made the dynamic size of {where} the constant {size}: the exported "
                                 "program would hold it at every size")
            for symbol in symbols:
                dynamic[symbol] = where
    environments = {v.fake_mode.shape_env for node in graph.graph.nodes
                    for v in [node.meta.get("val")] if isinstance(v, Tensor) and hasattr(v, "fake_mode")}
    for environment in environments:
        for guard in environment.guards:
            touched = [dynamic[s] for s in guard.expr.free_symbols if s in dynamic]
            if touched:
                raise ValueError(f"the trace depends on the dynamic size of {', '.join(sorted(touched))} "
                                 f"(it assumed {guard.expr}): the exported program would assume it at every size; "
                                 "mark that dimension static, or remove the branch on it")
