"""e3nn's ``TensorProduct`` (every instruction mode) computed as ONE weighted sparse accumulation.

:class:`TensorProduct` takes e3nn's constructor arguments (irreps, instructions, normalizations,
``shared_weights`` / ``internal_weights``) and is called like e3nn's, ``tp(x, y, weight=None)``, with e3nn's
layouts in and out: ``x[..., irreps_in1.dim]``, ``y[..., irreps_in2.dim]``, ``weight[..., weight_numel]``
(or ``[weight_numel]`` when shared), output ``[..., irreps_out.dim]``. It gives e3nn's values and gradients.

How the product is computed
---------------------------
One rule holds every instruction: for each CG nonzero of an instruction and each multiplicity, the
components it reads in ``x`` and ``y``, the output component it adds to (instructions into the same output
irrep add up) and the weight it is multiplied by, so a call is one kernel launch forward and one backward,
with the weights read by the kernels (never expanded per nonzero). :mod:`sparse_accumulation.e3nn.layout`
has the details. Two layouts of the operands, picked per call:

* on CPU tensors, e3nn's tensors themselves (the rows are e3nn's rows; ``x``, ``y``, the weights and the
  output are used in place, nothing is copied);
* on CUDA (and with the Triton kernels), ``U`` channels as rows, ``U`` the greatest common divisor of the
  multiplicities the instructions use, so the rule is that of one channel (the generated kernels need a
  short rule). On CUDA tensors the per-channel graph kernels read ``x``, ``y`` and the weights and write
  the output in e3nn's layout in place; on CPU tensors (``channels=`` above 1, or the Triton kernels asked
  for) ``x`` and the output are copied once into and out of ``[..., U, D]``, "uvu"'s ``y`` is read in place
  by every channel and the weights of "uvu" with spherical harmonics (one ``v``, equal multiplicities) are a
  view.

The coefficients are e3nn's: ``sqrt(alpha)`` times its Wigner 3j symbol, the 3j symbol being
``cg.transformation_rule(l1, l2, L, basis="e3nn")`` divided by ``sqrt(2L + 1)``, and ``alpha`` e3nn's
documented normalization (see :class:`TensorProduct`).

e3nn is needed for its ``Irreps`` (imported when a :class:`TensorProduct` is made).
"""
from __future__ import annotations

import math
import warnings
from typing import List, NamedTuple, Optional, Sequence

import numpy as np
import torch

from .. import backends
from ..exact import ExactBuffers
from ..ops.accumulate.api import accumulate_rule
from ..ops.scripted import broadcast_shapes, check_index, check_like, check_width
from ..ops.factored import CHUNK_BYTES, factored_instructions, factored_product, specs
from .layout import channel_rule, divisor_of_multiplicities, gather, gather_weights, make_plan, scatter

__all__ = ["TensorProduct", "Instruction", "SUPPORTED_MODES", "InvalidArgumentError", "WeightsMissingError",
           "IrrepIndexError", "UnknownModeError", "LeadingDimensionsError"]

#: the modes e3nn knows
E3NN_MODES = ("uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw")
#: instruction modes :class:`TensorProduct` computes: all of e3nn's
SUPPORTED_MODES = E3NN_MODES
IRREP_NORMALIZATIONS = ("component", "norm", "none")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: channels of the channel plan from which message passing on the CPU runs fused in a call that records gradients
#: (below: per edge, faster there forward and backward); a call that records none runs per edge below twice as
#: many (its forward alone is faster per edge at 16 channels, the fused backward is what pays there). Measured
#: with benchmarks/cpu_schedules.py at 2*10^4 edges, see benchmarks/RESULTS.md
FUSED_MIN_CHANNELS = 16
PATH_NORMALIZATIONS = ("element", "path", "none")


def _o3():
    try:
        from e3nn import o3
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("sparse_accumulation.e3nn needs the e3nn package for its Irreps "
                          "(pip install e3nn)") from error
    return o3


class InvalidArgumentError(ValueError, AssertionError):
    """A bad argument or input where e3nn fails an ``assert``: invalid instructions (parities, degrees,
    multiplicities), normalization names, variances, ``internal_weights`` without ``shared_weights``, last
    dimensions of ``x`` / ``y``, weight shapes. Caught by ``except ValueError`` and ``except AssertionError``."""


class WeightsMissingError(RuntimeError, ValueError):
    """A call without weights on a module without internal weights (e3nn raises ``RuntimeError``)."""


class IrrepIndexError(ValueError, IndexError):
    """An instruction index that is not an index of its irreps (e3nn raises ``IndexError``)."""


class UnknownModeError(ValueError, KeyError):
    """An instruction mode e3nn does not know (e3nn raises ``KeyError``)."""

    __str__ = ValueError.__str__  # KeyError's would print the message quoted


class LeadingDimensionsError(ValueError, RuntimeError):
    """Leading dimensions of ``x``, ``y`` (and per-row weights) that do not broadcast (e3nn raises
    ``RuntimeError``)."""


class Instruction(NamedTuple):
    """One instruction ``in1[i_in1] x in2[i_in2] -> out[i_out]``, as e3nn's TensorProduct holds it.

    ``path_weight`` is the factor the instruction's output is multiplied by (``sqrt(alpha)``, the
    normalization included); ``path_shape`` the shape of its weights (``(mul1, mul2)`` for "uvu",
    ``(mul1,)`` for "uuu").
    """

    i_in1: int
    i_in2: int
    i_out: int
    connection_mode: str
    has_weight: bool
    path_weight: float
    path_shape: tuple


# --------------------------------------------------------------------------------------------------------
# instructions and e3nn's normalization


def _check_instructions(irreps_in1, irreps_in2, irreps_out, instructions) -> list:
    """Instructions as :class:`Instruction` (``path_weight`` still the user's factor), validated as e3nn does:
    the multiplicities only of instructions it computes (none of them 0).

    Raises:
        ValueError: an entry that is not a 5- or 6-tuple.
        IrrepIndexError: an index out of range.
        UnknownModeError: a mode e3nn does not know.
        NotImplementedError: a mode e3nn knows but this module does not compute.
        InvalidArgumentError: parities or degrees that do not couple, multiplicities the mode does not allow.
    """
    result = []
    for number, entry in enumerate(instructions):
        entry = tuple(entry)
        if len(entry) not in (5, 6):
            raise ValueError(f"instruction {number} must be (i_in1, i_in2, i_out, mode, has_weight[, path_weight]), "
                             f"got {entry!r}")
        i1, i2, io, mode, has_weight = entry[:5]
        path_weight = float(entry[5]) if len(entry) == 6 else 1.0
        for name, index, irreps in (("i_in1", i1, irreps_in1), ("i_in2", i2, irreps_in2), ("i_out", io, irreps_out)):
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(irreps):
                raise IrrepIndexError(f"instruction {number}: {name}={index!r} is not an index of {irreps} "
                                      f"(0 <= {name} < {len(irreps)})")
        if mode not in E3NN_MODES:
            raise UnknownModeError(f"instruction {number}: unknown mode {mode!r} (e3nn's modes are {E3NN_MODES})")
        (mul1, ir1), (mul2, ir2), (mul_out, ir_out) = irreps_in1[i1], irreps_in2[i2], irreps_out[io]
        if ir1.p * ir2.p != ir_out.p or not abs(ir1.l - ir2.l) <= ir_out.l <= ir1.l + ir2.l:
            raise InvalidArgumentError(f"instruction {number}: {ir1} x {ir2} cannot give {ir_out} "
                                       f"(|l1 - l2| <= L <= l1 + l2 and p1 p2 = p are required)")
        if 0 not in (mul1, mul2, mul_out):  # e3nn computes nothing on a multiplicity 0 and checks nothing there
            problem = _multiplicity_problem(mode, bool(has_weight), mul1, mul2, mul_out)
            if problem:
                raise InvalidArgumentError(f"instruction {number}: mode {mode!r} {problem}, got in1[{i1}], in2[{i2}], "
                                           f"out[{io}] of multiplicities {mul1}, {mul2}, {mul_out}")
        pairs = mul1 * (mul2 - 1) // 2
        shape = {"uvw": (mul1, mul2, mul_out), "uvu": (mul1, mul2), "uvv": (mul1, mul2), "uuw": (mul1, mul_out),
                 "uuu": (mul1,), "uvuv": (mul1, mul2), "uvu<v": (pairs,), "u<vw": (pairs, mul_out)}[mode]
        result.append(Instruction(int(i1), int(i2), int(io), mode, bool(has_weight), path_weight, shape))
    return result


def _multiplicity_problem(mode: str, has_weight: bool, mul1: int, mul2: int, mul_out: int) -> str:
    """What e3nn requires of an instruction that its multiplicities or weights do not give ("" if nothing)."""
    if mode in ("uvw", "u<vw") and not has_weight:
        return "needs weights"
    if mode == "uvu" and mul1 != mul_out:
        return "needs the same multiplicity in in1 and out"
    if mode == "uvv" and mul2 != mul_out:
        return "needs the same multiplicity in in2 and out"
    if mode in ("uuw", "u<vw") and mul1 != mul2:
        return "needs the same multiplicity in in1 and in2"
    if mode == "uuw" and not has_weight and mul_out != 1:
        return "without weights (a sum over u) needs multiplicity 1 in out"
    if mode == "uuu" and not mul1 == mul2 == mul_out:
        return "needs the same multiplicity in in1, in2 and out"
    if mode == "uvuv" and mul1 * mul2 != mul_out:
        return "needs multiplicity mul1 * mul2 in out"
    if mode == "uvu<v" and not (mul1 == mul2 and mul_out == mul1 * (mul1 - 1) // 2):
        return "needs the same multiplicity mul in in1 and in2 and mul (mul - 1) / 2 in out"
    return ""


#: per mode, the number of terms summed into one output component, as a function of (mul1, mul2)
_ELEMENTS = {"uvw": lambda m1, m2: m1 * m2, "uvu": lambda m1, m2: m2, "uvv": lambda m1, m2: m1,
             "uuw": lambda m1, m2: m1, "uuu": lambda m1, m2: 1, "uvuv": lambda m1, m2: 1, "uvu<v": lambda m1, m2: 1,
             "u<vw": lambda m1, m2: m1 * (m2 - 1) // 2}


def _variances(values, irreps, name) -> list:
    if values is None:
        return [1.0] * len(irreps)
    values = [float(v) for v in values]
    if len(values) != len(irreps):
        raise InvalidArgumentError(f"{name} needs one variance per irrep of {irreps} ({len(irreps)}), "
                                   f"got {len(values)}")
    return values


def _normalized(instructions, irreps_in1, irreps_in2, irreps_out, in1_var, in2_var, out_var,
                irrep_normalization, path_normalization) -> list:
    """e3nn's normalization: each instruction's ``path_weight`` becomes ``sqrt(alpha)``, with

    ``alpha = a(l1, l2, L) / x * out_var[i_out] * path_weight``, ``a`` = ``2L + 1`` ("component"),
    ``(2 l1 + 1)(2 l2 + 1)`` ("norm") or 1 ("none"), and ``x`` (left out when 0) the variance the
    instruction's output irrep receives: over the instructions into that irrep, the sum of
    ``in1_var * in2_var * n`` ("element"), or the instruction's own term times their count ("path"), or 1
    ("none"); ``n`` is the number of terms summed per output component (e3nn's: ``mul1 mul2`` for "uvw",
    ``mul2`` for "uvu", ``mul1`` for "uvv" and "uuw", ``mul1 (mul2 - 1) / 2`` for "u<vw", 1 otherwise).
    """
    def elements(ins):
        return in1_var[ins.i_in1] * in2_var[ins.i_in2] * _ELEMENTS[ins.connection_mode](irreps_in1[ins.i_in1].mul,
                                                                                         irreps_in2[ins.i_in2].mul)

    result = []
    for ins in instructions:
        l1, l2, L = irreps_in1[ins.i_in1].ir.l, irreps_in2[ins.i_in2].ir.l, irreps_out[ins.i_out].ir.l
        alpha = {"component": 2 * L + 1, "norm": (2 * l1 + 1) * (2 * l2 + 1), "none": 1}[irrep_normalization]
        same_output = [other for other in instructions if other.i_out == ins.i_out]
        if path_normalization == "element":
            x = sum(elements(other) for other in same_output)
        elif path_normalization == "path":
            x = elements(ins) * len(same_output)
        else:
            x = 1
        if x > 0:
            alpha /= x
        alpha *= out_var[ins.i_out] * ins.path_weight
        result.append(ins._replace(path_weight=math.sqrt(alpha)))
    return result


# --------------------------------------------------------------------------------------------------------
# the module


class TensorProduct(ExactBuffers, torch.nn.Module):
    r"""e3nn's ``o3.TensorProduct`` (every instruction mode), as ONE sparse accumulation.

    Same constructor and call as e3nn's; same outputs and gradients (for ``x``, ``y`` and the weights).

    Args:
        irreps_in1, irreps_in2, irreps_out: e3nn ``Irreps`` or anything ``e3nn.o3.Irreps`` accepts
            (``"32x0e + 32x1o"``).
        instructions: ``(i_in1, i_in2, i_out, mode, has_weight[, path_weight])`` tuples, as in e3nn: each
            puts ``in1[i_in1] x in2[i_in2]`` into ``out[i_out]`` (several instructions into one output irrep
            add up). ``mode``, with the weights' ``path_shape``: ``"uvw"`` (``out[w] += sum_uv w[u, v, w]
            in1[u] x in2[v]``; ``(mul1, mul2, mul_out)``), ``"uvu"`` (``out[u] += sum_v w[u, v] in1[u] x
            in2[v]``; ``(mul1, mul2)``), ``"uvv"`` (``out[v] += sum_u w[u, v] ...``; ``(mul1, mul2)``),
            ``"uuw"`` (``out[w] += sum_u w[u, w] in1[u] x in2[u]``; ``(mul1, mul_out)``), ``"uuu"``
            (``out[u] += w[u] in1[u] x in2[u]``; ``(mul1,)``), ``"uvuv"`` (``out[u mul2 + v] += w[u, v]
            in1[u] x in2[v]``; ``(mul1, mul2)``), ``"uvu<v"`` (``out[q] += w[q] in1[u] x in2[v]`` for the
            ``q``-th pair ``u < v``; ``(mul (mul - 1) / 2,)``), ``"u<vw"`` (``out[w] += sum_q w[q, w] in1[u] x
            in2[v]``; ``(mul (mul - 1) / 2, mul_out)``). Pairs are numbered as ``torch.triu_indices``.
            ``path_weight`` (default 1) multiplies ``alpha`` below (so the output by its square root).
        in1_var, in2_var, out_var: one variance per irrep of each input / the output (default 1), used by
            the normalization.
        irrep_normalization: ``"component"`` (default), ``"norm"`` or ``"none"``.
        path_normalization: ``"element"`` (default), ``"path"`` or ``"none"``. Instruction ``i`` is
            multiplied by ``sqrt(alpha_i)``, ``alpha_i = a / x * out_var[i_out] * path_weight`` with ``a`` =
            ``2L + 1`` / ``(2 l1 + 1)(2 l2 + 1)`` / 1 for the three irrep normalizations and ``x`` (left out
            when 0) = the sum over the instructions into the same output irrep of
            ``in1_var * in2_var * n`` ("element"; ``n`` the number of terms summed per output component:
            ``mul1 mul2`` for "uvw", ``mul2`` for "uvu", ``mul1`` for "uvv" and "uuw", ``mul (mul - 1) / 2``
            for "u<vw", 1 for the others), this instruction's
            term times the number of those instructions ("path"), or 1 ("none").
        internal_weights: hold the weights as a parameter (default: when ``shared_weights`` and some
            instruction has weights). Internal weights are shared.
        shared_weights: one set of weights for every row (default True; e3nn's ``False`` is per-row weights
            ``weight[..., weight_numel]``, for example per edge from a radial network).
        compile_left_right, compile_right, _specialized_code, _optimize_einsums: e3nn's code generation
            flags, accepted and without effect (:meth:`right` is always available). The last two are kept as
            attributes (default True, as e3nn's defaults).
        normalization: e3nn's deprecated name of ``irrep_normalization`` (with a ``DeprecationWarning``).
        channels: the channel count ``U`` on CUDA (default: the greatest common divisor of the multiplicities
            the instructions use, 1 when an instruction is in a mode other than "uvu" and "uuu", which run on
            one channel only); giving it makes every device use it (``1``: e3nn's rows, no copies).
        dtype: dtype of the coefficients and internal weights (default: torch's default dtype); inputs must
            have it (``.to(dtype)`` converts the module, its coefficients exactly).
        implementation: the kernels, as for :func:`sparse_accumulation.accumulate_rule` (default: the
            process default).

    Attributes:
        irreps_in1, irreps_in2, irreps_out: e3nn ``Irreps``.
        instructions: list of :class:`Instruction`, ``path_weight`` holding the normalization factor
            ``sqrt(alpha)``.
        weight_numel: number of weights (``sum`` of ``prod(path_shape)`` over weighted instructions), laid
            out instruction after instruction, each row-major over ``path_shape``.
        shared_weights, internal_weights: as resolved from the arguments.
        weight: the ``[weight_numel]`` parameter with internal weights (initialized like e3nn's, standard
            normal), else an empty buffer.
        output_mask: e3nn's buffer ``[irreps_out.dim]``: 1 on the output irreps some instruction writes.
        channels: ``U``, the channel count of the accumulation on CUDA (see :mod:`sparse_accumulation.e3nn`).

    The state dict is e3nn's (``weight`` and ``output_mask``): an e3nn module's state dict loads with
    ``strict=True`` (the constants of e3nn's generated code in it are ignored), and ours loads into e3nn's.

    Every path of an instruction is a term of the rule: "uvw" and "u<vw" instructions of large multiplicities
    make long rules (``mul1 mul2 mul_out`` times the 3j symbol's nonzeros).

    Irreps of multiplicity 0 are handled as e3nn does: an instruction on one computes nothing and its
    multiplicities are not checked; its weights (if ``path_shape`` has no 0, as for "uvu" into a ``0x``
    output) are counted in ``weight_numel`` and keep their place, unread. (e3nn 0.6.0 gives the instructions
    after such a one the wrong outputs and weights; here each instruction reads its own weights.)

    Errors are of e3nn's type where e3nn raises one, and ``ValueError`` subclasses (the classes below subclass
    both).

    Raises:
        ImportError: e3nn is not installed.
        IrrepIndexError: an instruction index out of range (an ``IndexError``).
        UnknownModeError: an instruction mode e3nn does not know (a ``KeyError``).
        InvalidArgumentError: parities, degrees or multiplicities an instruction cannot have, normalization
            names, variances, ``internal_weights`` without ``shared_weights`` (an ``AssertionError``).
        ValueError: an instruction that is not a 5- or 6-tuple, ``channels`` that does not divide the
            multiplicities (or is not 1 with modes other than "uvu" and "uuu").
    """

    __e3nn_compile_mode__ = "script"  # e3nn.util.jit.compile scripts it, as it does e3nn's own

    def __init__(self, irreps_in1, irreps_in2, irreps_out, instructions: Sequence[tuple],
                 in1_var: Optional[Sequence[float]] = None, in2_var: Optional[Sequence[float]] = None,
                 out_var: Optional[Sequence[float]] = None, irrep_normalization: Optional[str] = None,
                 path_normalization: Optional[str] = None, internal_weights: Optional[bool] = None,
                 shared_weights: Optional[bool] = None, compile_left_right: bool = True, compile_right: bool = False,
                 normalization: Optional[str] = None, _specialized_code: Optional[bool] = None,
                 _optimize_einsums: Optional[bool] = None, *, channels: Optional[int] = None, dtype=None,
                 implementation=None):
        super().__init__()
        o3 = _o3()
        if normalization is not None:
            warnings.warn("`normalization` is deprecated. Use `irrep_normalization` instead.", DeprecationWarning,
                          stacklevel=2)
            irrep_normalization = normalization
        self._specialized_code = True if _specialized_code is None else bool(_specialized_code)
        self._optimize_einsums = True if _optimize_einsums is None else bool(_optimize_einsums)
        self.irreps_in1, self.irreps_in2, self.irreps_out = o3.Irreps(irreps_in1), o3.Irreps(irreps_in2), \
            o3.Irreps(irreps_out)
        # forward reads plain ints only (torch.compile cannot guard on e3nn's Irreps)
        self._dims = (self.irreps_in1.dim, self.irreps_in2.dim, self.irreps_out.dim)
        irrep_normalization = "component" if irrep_normalization is None else irrep_normalization
        path_normalization = "element" if path_normalization is None else path_normalization
        if irrep_normalization not in IRREP_NORMALIZATIONS:
            raise InvalidArgumentError(f"irrep_normalization must be one of {IRREP_NORMALIZATIONS}, "
                                       f"got {irrep_normalization!r}")
        if path_normalization not in PATH_NORMALIZATIONS:
            raise InvalidArgumentError(f"path_normalization must be one of {PATH_NORMALIZATIONS}, "
                                       f"got {path_normalization!r}")
        checked = _check_instructions(self.irreps_in1, self.irreps_in2, self.irreps_out, instructions)
        self.instructions = _normalized(
            checked, self.irreps_in1, self.irreps_in2, self.irreps_out,
            _variances(in1_var, self.irreps_in1, "in1_var"), _variances(in2_var, self.irreps_in2, "in2_var"),
            _variances(out_var, self.irreps_out, "out_var"), irrep_normalization, path_normalization)
        self.irrep_normalization, self.path_normalization = irrep_normalization, path_normalization

        if shared_weights is False and internal_weights is None:
            internal_weights = False
        shared_weights = True if shared_weights is None else bool(shared_weights)
        if internal_weights is None:
            internal_weights = shared_weights and any(ins.has_weight for ins in self.instructions)
        if internal_weights and not shared_weights:
            raise InvalidArgumentError("internal_weights=True needs shared_weights=True (internal weights are shared)")
        self.shared_weights, self.internal_weights = shared_weights, bool(internal_weights)
        self.weight_numel = sum(math.prod(ins.path_shape) for ins in self.instructions if ins.has_weight)
        self.implementation = implementation
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if self.internal_weights and self.weight_numel:
            self.weight = torch.nn.Parameter(torch.randn(self.weight_numel, dtype=dtype))
        else:
            self.register_buffer("weight", torch.zeros(0, dtype=dtype))
        self._make_plans(channels, dtype)
        written = {ins.i_out for ins in self.instructions if ins.path_weight != 0 and 0 not in ins.path_shape}
        mask = [float(i in written) for i, (mul, ir) in enumerate(self.irreps_out) for _ in range(mul * ir.dim)]
        self.register_buffer("output_mask", torch.tensor(mask, dtype=dtype))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # e3nn's state dicts hold the constants of its generated code
        for key in [k for k in state_dict if k.startswith(prefix + "_compiled_main_")]:
            del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _make_plans(self, channels, dtype) -> None:
        """The plan with one channel (CPU) and the one with ``channels`` (default: the multiplicities'
        greatest common divisor; CUDA), the same object when they coincide; and the instructions computed
        factored (:mod:`.factored`), which the plans leave out."""
        factored = factored_instructions(self.instructions, self.irreps_in1, self.irreps_in2, self.irreps_out)
        rows, coefficients = specs(self.instructions, factored, self.irreps_in1, self.irreps_in2, self.irreps_out)
        self._factored_specs = rows
        #: bytes the factored instructions' intermediates may take before rows go in chunks (:mod:`.factored`)
        self._factored_chunk_bytes = CHUNK_BYTES
        self.register_exact("_factored_coefficients", coefficients, dtype)
        divisor = divisor_of_multiplicities(self.irreps_in1, self.irreps_in2, self.irreps_out, self.instructions,
                                            factored)
        if channels is not None:
            if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
                raise ValueError(f"channels must be a positive int or None, got {channels!r}")
            if divisor % channels:
                raise ValueError(f"channels={channels} must divide {divisor}, the greatest common divisor of the "
                                 "multiplicities the instructions use")
        self.channels = divisor if channels is None else channels
        args = (self.irreps_in1, self.irreps_in2, self.irreps_out, self.instructions)
        self._channel_plan = make_plan(*args, self.channels, factored)
        self._row_plan = (make_plan(*args, 1, factored) if channels is None and self.channels > 1
                          else self._channel_plan)
        for name, plan in (("coefficients_channels", self._channel_plan), ("coefficients_rows", self._row_plan)):
            self.register_exact(name, plan.coefficients, dtype)
        self._graph_rule = channel_rule(self._channel_plan, self.irreps_in2.dim)
        self._make_script_state()

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        # a module pickled by an earlier version lacks the script state added since
        self.__dict__.setdefault("_per_edge_on_cpu_without_gradients", self.channels < 2 * FUSED_MIN_CHANNELS)

    def _make_script_state(self) -> None:
        """What a scripted call reads in place of the plans (TorchScript types neither them nor the descriptors):
        the keys of the row rule (when its operands are e3nn's tensors themselves: one channel) and of the channel
        rule (None when nothing is computed), whether the rule is weighted and has a column of ones, whether
        message passing on the CPU runs per edge with and without gradients (by :data:`FUSED_MIN_CHANNELS` when the
        module is made), and the weights' columns that the row rule reads (None: all of them, in order)."""
        row = self._row_plan
        self._row_key = row.rule.key if row.rule is not None and row.channels == 1 else None
        self._graph_key = None if self._graph_rule is None else self._graph_rule.key
        self._weighted = row.weights is not None
        self._per_edge_on_cpu = self.channels < FUSED_MIN_CHANNELS
        self._per_edge_on_cpu_without_gradients = self.channels < 2 * FUSED_MIN_CHANNELS
        self._ones_column = row.weights is not None and row.weights.ones is not None
        columns = None
        if self._row_key is not None and row.weights is not None:
            read = [c for s in row.weights.layout.segments for c in range(s.start, s.start + s.mul * s.dim)]
            if read != list(range(self.weight_numel)):
                columns = torch.as_tensor(read, dtype=torch.int64)
        self.register_buffer("_row_weight_columns", columns, persistent=False)

    def _plan_for(self, device: torch.device, implementation: Optional[str]):
        """The row plan on CPU tensors (unless the Triton kernels run them), else the channel plan."""
        if device.type == "cpu" and backends.resolved(implementation, device) != "triton":
            return self._row_plan, self.coefficients_rows
        return self._channel_plan, self.coefficients_channels

    def _implementation_on(self, device: torch.device) -> Optional[str]:
        """The implementation a call on ``device`` runs, decided once per call and handed to every op it makes
        (which take a resolved name as it is); while ``torch.compile`` or ``torch.export`` trace, the module's
        own name, which the registered ops resolve where the program runs (an exported program holds ``"auto"``,
        not the kernels of the machine that traced it)."""
        if torch.compiler.is_compiling():
            return self.implementation
        return backends.resolved(self.implementation, device)

    def rule_for(self, device):
        """The :class:`~sparse_accumulation.Rule` that calls on ``device`` use (``None`` if nothing is computed)."""
        device = torch.device(device)
        return self._plan_for(device, self.implementation)[0].rule

    def __repr__(self) -> str:
        paths = sum(math.prod(ins.path_shape) for ins in self.instructions)
        return (f"{type(self).__name__}({self.irreps_in1.simplify()} x {self.irreps_in2.simplify()} -> "
                f"{self.irreps_out.simplify()} | {paths} paths | {self.weight_numel} weights)")

    def _joined(self, weight):
        """e3nn's list of per-instruction weights (``[*path_shape]`` each, or ``[..., *path_shape]`` per row) as one
        ``[..., weight_numel]`` tensor; anything else as it is."""
        if not isinstance(weight, (list, tuple)):
            return weight
        shapes = [ins.path_shape for ins in self.instructions if ins.has_weight]
        if len(weight) != len(shapes):
            raise InvalidArgumentError(f"a list of weights needs one tensor per weighted instruction ({len(shapes)}), "
                                       f"got {len(weight)}")
        lead = () if self.shared_weights else (-1,)
        return torch.cat([w.reshape(*lead, math.prod(shape)) for w, shape in zip(weight, shapes)], dim=-1)

    def _get_weights(self, weight) -> Optional[torch.Tensor]:
        weight = self._joined(weight)
        if weight is None:
            if self.weight_numel and not self.internal_weights:
                raise WeightsMissingError("weight is required: this TensorProduct has no internal weights "
                                          f"(give weight [..., {self.weight_numel}])")
            return self.weight
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        if self.shared_weights and tuple(weight.shape) != (self.weight_numel,):
            raise InvalidArgumentError(f"weight must be [{self.weight_numel}] (shared weights), "
                                       f"got shape {tuple(weight.shape)}")
        if not self.shared_weights and (weight.dim() < 2 or weight.shape[-1] != self.weight_numel):
            raise InvalidArgumentError(f"weight must be [..., {self.weight_numel}] with at least one batch dimension "
                                       f"(shared_weights=False), got shape {tuple(weight.shape)}")
        return weight

    def weight_view_for_instruction(self, instruction: int, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The view ``[..., *path_shape]`` of the weights (``weight`` as for :meth:`forward`, default the internal
        ones) of instruction number ``instruction``.

        Raises:
            ValueError: the instruction has no weights.
        """
        if not self.instructions[instruction].has_weight:
            raise ValueError(f"Instruction {instruction} has no weights.")
        return next(view for index, _, view in self.weight_views(weight, yield_instruction=True)
                    if index == instruction % len(self.instructions))

    def weight_views(self, weight: Optional[torch.Tensor] = None, yield_instruction: bool = False):
        """Views ``[..., *path_shape]`` of the weights of each weighted instruction, in order (as e3nn's).

        With ``yield_instruction``, yields ``(index, instruction, view)``.
        """
        weight = self._get_weights(weight)
        offset = 0
        for index, ins in enumerate(self.instructions):
            if ins.has_weight:
                size = math.prod(ins.path_shape)
                view = weight.narrow(-1, offset, size).unflatten(-1, ins.path_shape)
                offset += size
                yield (index, ins, view) if yield_instruction else view

    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor] = None,
                indices_1: Optional[torch.Tensor] = None, indices_2: Optional[torch.Tensor] = None,
                indices_out: Optional[torch.Tensor] = None, size_out: Optional[int] = None,
                reduction: Optional[str] = None) -> torch.Tensor:
        """``x[..., irreps_in1.dim]`` times ``y[..., irreps_in2.dim]`` -> ``[..., irreps_out.dim]``; with
        cuEquivariance's keywords, message passing: ``out[indices_out[e]] += tp(x[indices_1[e]],
        y[indices_2[e]], weight[e])`` for every edge ``e``, fused (no per-edge tensor is made).

        Args:
            x, y: floating tensors of one dtype and device in e3nn's layout; leading dimensions broadcast. With
                indices: ``x [N1, irreps_in1.dim]`` and ``y [N2, irreps_in2.dim]`` (each gathered by its index
                if given, else one row per edge).
            weight: ``[weight_numel]`` (shared weights) or ``[..., weight_numel]`` (per-row weights, leading
                dimensions broadcasting with the inputs'; with indices ``[edges, weight_numel]``); required
                unless the weights are internal.
            indices_1, indices_2: the row of x / y each edge reads (1-D integer tensors of one length, or
                :class:`sparse_accumulation.Index` objects).
            indices_out: the output row each edge adds to; ``size_out`` output rows (required with it).
            reduction: ``"segment"`` (default, deterministic) or ``"atomic"`` (CUDA): how rows that several edges
                add to are summed (see :func:`sparse_accumulation.accumulate_graph`).

        Returns:
            ``[..., irreps_out.dim]``, or with indices ``[size_out (or edges), irreps_out.dim]``.

        Raises:
            TypeError: non-tensor inputs or weights, dtypes that differ (from each other or from the module's),
                non-integer indices.
            InvalidArgumentError: last dimensions that do not match the irreps, weights of the wrong shape (a
                ``ValueError`` and an ``AssertionError``, as e3nn's asserts).
            WeightsMissingError: no weights and no internal weights (a ``RuntimeError``, as e3nn's, and a
                ``ValueError``).
            LeadingDimensionsError: leading dimensions that do not broadcast (a ``ValueError`` and a
                ``RuntimeError``).
            ValueError: with indices, index lengths that differ, ``size_out`` missing, inputs that are not 2-D.
            IndexError: an index out of range (eager mode).

        Under ``torch.jit.script`` the call runs the registered ops on the same kernels (:meth:`_scripted`): the
        indices must be tensors, their values are not checked, and ``implementation=None`` means ``"auto"``.
        """
        return self._product(x, y, weight, indices_1, indices_2, indices_out, size_out, reduction)

    def _product(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor],
                 indices_1: Optional[torch.Tensor], indices_2: Optional[torch.Tensor],
                 indices_out: Optional[torch.Tensor], size_out: Optional[int],
                 reduction: Optional[str]) -> torch.Tensor:
        """:meth:`forward` (which subclasses may give another signature)."""
        if torch.jit.is_scripting():
            out = self._scripted(x, y, weight, indices_1, indices_2, indices_out, size_out, reduction)
        else:
            weight = self._joined(weight)
            out = self._eager(x, y, weight, indices_1, indices_2, indices_out, size_out, reduction)
        if len(self._factored_specs) > 0:
            if not torch.jit.is_scripting():  # checked Index objects give their tensors
                indices_1, indices_2, indices_out = (_index_tensor(i) for i in (indices_1, indices_2, indices_out))
            out = out + self._factored(x, y, weight, indices_1, indices_2, indices_out, size_out)
        return out

    def _factored(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor],
                  indices_1: Optional[torch.Tensor], indices_2: Optional[torch.Tensor],
                  indices_out: Optional[torch.Tensor], size_out: Optional[int]) -> torch.Tensor:
        """The part of the instructions computed factored (:mod:`.factored`), for arguments the kernels' part
        has checked: ``[..., irreps_out.dim]``, or with indices ``[size_out (or edges), irreps_out.dim]``."""
        W = self.weight.to(x.dtype) if weight is None else weight
        C = self._factored_coefficients.to(x.dtype)
        if indices_1 is None and indices_2 is None and indices_out is None and size_out is None:
            lead = broadcast_shapes(x.shape[:-1], y.shape[:-1])
            if not self.shared_weights:
                lead = broadcast_shapes(lead, W.shape[:-1])
                W = _broadcast_rows(W, lead)
            out = factored_product(_broadcast_rows(x, lead), _broadcast_rows(y, lead), W, self.shared_weights,
                                   self._factored_specs, C, self._dims[2], self._factored_chunk_bytes)
            return out.view(lead + [self._dims[2]])
        messages = factored_product(x if indices_1 is None else x.index_select(0, indices_1),
                                    y if indices_2 is None else y.index_select(0, indices_2), W,
                                    self.shared_weights, self._factored_specs, C, self._dims[2],
                                    self._factored_chunk_bytes)
        if indices_out is None or size_out is None:
            return messages
        return messages.new_zeros(size_out, self._dims[2]).index_add(0, indices_out.to(torch.int64), messages)

    @torch.jit.export
    def right(self, y: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """e3nn's ``right``: the operator ``[..., irreps_in1.dim, irreps_out.dim]`` that the product with ``y`` (and
        the weights) is, so that ``forward(x, y, weight) = einsum("...ik,...i->...k", right(y, weight), x)``.

        Args:
            y: ``[..., irreps_in2.dim]``.
            weight: as for :meth:`forward` (per-row weights broadcasting with ``y``'s leading dimensions).

        Returns:
            ``[..., irreps_in1.dim, irreps_out.dim]``: row ``i`` is the product of the ``i``-th unit vector with
            ``y``, computed as one call on ``irreps_in1.dim`` rows per row of ``y`` (errors as :meth:`forward`'s).
        """
        if not torch.jit.is_scripting():
            weight = self._joined(weight)
        eye = torch.eye(self._dims[0], dtype=y.dtype, device=y.device)
        if weight is not None and not self.shared_weights:
            weight = weight.unsqueeze(-2)
        return self._product(eye, y.unsqueeze(-2), weight, None, None, None, None, None)

    def _eager(self, x, y, weight, indices_1, indices_2, indices_out, size_out, reduction,
               implementation: Optional[str] = None) -> torch.Tensor:
        """:meth:`forward` outside TorchScript; ``implementation``: the one this call runs (None: decide it)."""
        weight = self._joined(weight)
        for name, t, dim in (("x", x, self._dims[0]), ("y", y, self._dims[1])):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() < 1 or t.shape[-1] != dim:
                raise InvalidArgumentError(f"{name} must be [..., {dim}], got shape {tuple(t.shape)}")
        given = weight
        weight = self._get_weights(weight)
        self._check_data(x, y, given)
        if weight is self.weight:  # in the inputs' dtype (the module's, checked above) even if set by hand in another
            weight = weight.to(x.dtype)
        if implementation is None:
            implementation = self._implementation_on(x.device)
        if indices_1 is not None or indices_2 is not None or indices_out is not None or size_out is not None:
            recording = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, y, weight))
            if self._per_edge_on(x.device, implementation, recording):  # the per-edge product takes given weights
                return self._per_edge(x, y, given, indices_1, indices_2, indices_out, size_out, reduction,
                                      implementation)
            return self._message_passing(x, y, weight, indices_1, indices_2, indices_out, size_out, reduction,
                                         implementation)
        lead = self._leading_shape(x, y, weight)
        plan, C = self._plan_for(x.device, implementation)
        if plan.rule is None:
            return x.new_zeros(*lead, self._dims[2])
        if plan.weights is None and not self.shared_weights and x.shape[:-1] != lead:
            # per-row weights that no computed instruction reads still broadcast with the inputs, as in e3nn
            x = x.expand(*lead, x.shape[-1])
        if plan is self._channel_plan and x.device.type == "cuda":
            return self._in_place(x, y, weight, lead, implementation)
        X1 = gather(x, plan.x)
        X2 = y.unsqueeze(-2) if plan.y is None else gather(y, plan.y)
        W = None if plan.weights is None else gather_weights(weight, plan.weights)
        out = accumulate_rule(X1, X2, plan.rule, C.to(x.dtype), W, implementation=implementation)
        return scatter(out, plan.out)

    def _check_data(self, x, y, weight) -> None:
        """Raise, in the caller's words, for data of other floating dtypes or devices than ``x``, or a module
        whose tensors are on another device than the data."""
        if x.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"x must have a floating dtype (float16, bfloat16, float32 or float64), got {x.dtype}")
        for name, t in (("y", y), ("weight", weight)):
            if t is None:
                continue
            if t.dtype != x.dtype:
                raise TypeError(f"{name} has dtype {t.dtype} but x has dtype {x.dtype}; they must match")
            if t.device != x.device:
                raise ValueError(f"{name} is on {t.device} but x is on {x.device}; all tensors must be on one "
                                 "device")
        if x.dtype != self.coefficients_rows.dtype:  # as e3nn's, which cannot mix dtypes either
            raise TypeError(f"x has dtype {x.dtype} but this {type(self).__name__} computes in "
                            f"{self.coefficients_rows.dtype} (its coefficients and weights): convert the module "
                            f"(.to({x.dtype})) or the data")
        held = self.coefficients_rows.device
        if held != x.device:
            raise ValueError(f"this TensorProduct's tensors are on {held} but x is on {x.device}: move the module "
                             f"to the data's device (tp.to({str(x.device)!r}))")

    def _leading_shape(self, x, y, weight) -> torch.Size:
        """The broadcast leading dimensions of ``x``, ``y`` and per-row weights (as e3nn's, where weights no
        instruction reads count too); raises :class:`LeadingDimensionsError` if they do not broadcast."""
        shapes = [x.shape[:-1], y.shape[:-1]] + ([] if self.shared_weights else [weight.shape[:-1]])
        try:
            return torch.broadcast_shapes(*shapes)
        except RuntimeError:
            given = f"x {tuple(x.shape)}, y {tuple(y.shape)}" + ("" if self.shared_weights else
                                                                 f", weight {tuple(weight.shape)}")
            raise LeadingDimensionsError(f"the leading dimensions (all but the last) of {given} do not "
                                         "broadcast") from None

    def _weight_rows(self, weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The weights as the W operand of the graph kernels: ``[rows, weight_numel]`` (one row when shared)."""
        if self._graph_rule is None or not self._graph_rule.weighted:
            return None
        return weight.reshape(1, -1) if self.shared_weights else weight

    def _in_place(self, x, y, weight, lead, implementation: Optional[str]) -> torch.Tensor:
        """The product of broadcasting e3nn-layout tensors (leading dimensions ``lead`` once broadcast) on the
        graph kernels: one row per broadcast row, e3nn's tensors read and written in place."""
        W = self._weight_rows(weight)

        def rows(t):
            if t.shape[:-1] == lead:
                return t.reshape(-1, t.shape[-1])
            if math.prod(t.shape[:-1]) == 1:
                return t.reshape(1, t.shape[-1])
            return t.expand(*lead, t.shape[-1]).reshape(-1, t.shape[-1])

        operands = [rows(x), rows(y)] + ([] if W is None else [W if self.shared_weights else rows(W)])
        out = self._message_passing(*operands[:2], operands[2] if W is not None else None, None, None, None, None,
                                    None, implementation, weights_as_rows=True)
        return out.view(*lead, self._dims[2])

    def _per_edge_on(self, device: torch.device, implementation: Optional[str], recording: bool) -> bool:
        """Whether message passing runs per edge here: on the CPU's numba kernels, where the channel plan has
        fewer channels than :data:`FUSED_MIN_CHANNELS` (twice as many in a call that records no gradient,
        ``recording`` False): the fused graph kernels are slower there than the row kernels on gathered rows
        followed by a sum by destination."""
        limit = FUSED_MIN_CHANNELS if recording else 2 * FUSED_MIN_CHANNELS
        if device.type != "cpu" or self.channels >= limit:
            return False
        return backends.resolved(implementation, device) == "numba"

    def _per_edge(self, x, y, weight, indices_1, indices_2, indices_out, size_out, reduction,
                  implementation: Optional[str]) -> torch.Tensor:
        """Message passing as the product of the gathered rows, then their sum by ``indices_out``: indices (and
        ``reduction``) checked as the fused path checks them (by name), the per-edge messages made."""
        from ..ops.graph.api import message_indices

        x_rows, y_rows, out_rows = message_indices(x, y, indices_1, indices_2, indices_out, size_out, reduction)
        # index_select, not x[rows]: its gradient is an index_add, several times faster on the CPU than advanced
        # indexing's (index_put with accumulation)
        messages = self._eager(x if x_rows is None else x.index_select(0, x_rows),
                               y if y_rows is None else y.index_select(0, y_rows), weight, None, None, None, None,
                               None, implementation)
        if out_rows is None:
            return messages
        return messages.new_zeros(size_out, messages.shape[-1]).index_add(0, out_rows, messages)

    def _message_passing(self, x, y, weight, indices_1, indices_2, indices_out, size_out, reduction,
                         implementation: Optional[str], *, weights_as_rows: bool = False) -> torch.Tensor:
        from ..ops.graph.api import accumulate_graph

        crule = self._graph_rule
        W = weight if weights_as_rows else self._weight_rows(weight)
        if crule is None:
            if indices_out is not None and size_out is None:
                raise ValueError("size_out is required with indices_out")
            edges = next((len(i) for i in (indices_1, indices_2) if i is not None), x.shape[0])
            return x.new_zeros(edges if indices_out is None else size_out, self._dims[2])
        for name, t in (("x", x), ("y", y)):
            if t.dim() != 2:
                raise ValueError(f"with indices, {name} must be 2-D [rows, dim], got shape {tuple(t.shape)}")
        return accumulate_graph(crule, x, y, self.coefficients_channels.to(x.dtype), W, indices_1=indices_1,
                                indices_2=indices_2, indices_out=indices_out, size_out=size_out,
                                implementation=implementation, reduction=reduction, names=("x", "y", "weight"))

    # ----------------------------------------------------------------------------------------------------
    # the scripted path: TorchScript compiles these methods (and only these), which call the registered ops

    def _scripted(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor],
                  indices_1: Optional[torch.Tensor], indices_2: Optional[torch.Tensor],
                  indices_out: Optional[torch.Tensor], size_out: Optional[int],
                  reduction: Optional[str]) -> torch.Tensor:
        """:meth:`forward` under TorchScript: the schedule of the eager call (the row rule on the CPU, the channel
        rule read in place elsewhere, message passing per edge or fused as :data:`FUSED_MIN_CHANNELS` says) on
        ``torch.ops.sparse_accumulation`` with the rules' keys. Index values are not checked (as under
        ``torch.compile``)."""
        check_width("x", x, self._dims[0], f"[..., {self._dims[0]}]")
        check_width("y", y, self._dims[1], f"[..., {self._dims[1]}]")
        check_like("y", y, "x", x)
        if self.coefficients_rows.device != x.device:
            raise ValueError(f"this TensorProduct's tensors are on {self.coefficients_rows.device} but x is on "
                             f"{x.device}: move the module to the data's device")
        if weight is None:
            if self.weight_numel > 0 and not self.internal_weights:
                raise RuntimeError(f"weight is required: this TensorProduct has no internal weights "
                                   f"(give weight [..., {self.weight_numel}])")
            weight = self.weight.to(x.dtype)
        else:
            if self.shared_weights and weight.dim() != 1:
                raise ValueError(f"weight must be [{self.weight_numel}] (shared weights), got shape {weight.shape}")
            if not self.shared_weights and weight.dim() < 2:
                raise ValueError(f"weight must be [..., {self.weight_numel}] with at least one batch dimension "
                                 f"(shared_weights=False), got shape {weight.shape}")
            check_width("weight", weight, self.weight_numel, f"[..., {self.weight_numel}]")
            check_like("weight", weight, "x", x)
        for name, index in (("indices_1", indices_1), ("indices_2", indices_2), ("indices_out", indices_out)):
            check_index(name, index)
        implementation = "auto" if self.implementation is None else self.implementation
        if indices_1 is None and indices_2 is None and indices_out is None and size_out is None:
            return self._scripted_product(x, y, weight, implementation)
        if x.dim() != 2 or y.dim() != 2:
            raise ValueError(f"with indices, x and y must be 2-D [rows, dim], got shapes {x.shape} and {y.shape}")
        if indices_out is not None and size_out is None:
            raise ValueError("size_out is required with indices_out")
        recording = torch.is_grad_enabled() and (x.requires_grad or y.requires_grad or weight.requires_grad)
        per_edge = self._per_edge_on_cpu if recording else self._per_edge_on_cpu_without_gradients
        if x.device.type == "cpu" and per_edge and implementation in ("auto", "numba"):
            messages = self._scripted_product(x if indices_1 is None else x.index_select(0, indices_1),
                                              y if indices_2 is None else y.index_select(0, indices_2), weight,
                                              implementation)
            if indices_out is None or size_out is None:
                return messages
            return messages.new_zeros(size_out, messages.shape[-1]).index_add(0, indices_out, messages)
        W: Optional[torch.Tensor] = None
        if self._weighted:
            W = weight.reshape(1, -1) if self.shared_weights else weight
        return self._scripted_graph(x, y, W, indices_1, indices_2, indices_out, size_out, reduction, implementation)

    def _scripted_product(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                          implementation: str) -> torch.Tensor:
        """The product of broadcasting e3nn-layout tensors under TorchScript."""
        lead = broadcast_shapes(x.shape[:-1], y.shape[:-1])
        if not self.shared_weights:
            lead = broadcast_shapes(lead, weight.shape[:-1])
        row_key = self._row_key
        if self._graph_key is None:  # nothing is computed
            return x.new_zeros(lead + [self._dims[2]])
        if not self._weighted and not self.shared_weights and x.shape[:-1] != lead:
            x = x.expand(lead + [x.shape[-1]])
        if row_key is not None and x.device.type == "cpu" and implementation != "triton":
            W: Optional[torch.Tensor] = None
            if self._weighted:
                columns = self._row_weight_columns
                W = (weight if columns is None else weight.index_select(-1, columns)).unsqueeze(-2)
                if self._ones_column:
                    W = torch.cat([W, W.new_ones(1).expand(W.shape[:-1] + [1])], dim=-1)
            out = torch.ops.sparse_accumulation.accumulate(x.unsqueeze(-2), y.unsqueeze(-2), W,
                                                           self.coefficients_rows.to(x.dtype), row_key,
                                                           implementation)
            return out.squeeze(-2)
        rows: Optional[torch.Tensor] = None
        if self._weighted:
            rows = weight.reshape(1, -1) if self.shared_weights else _broadcast_rows(weight, lead)
        out = self._scripted_graph(_broadcast_rows(x, lead), _broadcast_rows(y, lead), rows, None, None, None, None,
                                   None, implementation)
        return out.view(lead + [self._dims[2]])

    def _scripted_graph(self, x: torch.Tensor, y: torch.Tensor, W: Optional[torch.Tensor],
                        indices_1: Optional[torch.Tensor], indices_2: Optional[torch.Tensor],
                        indices_out: Optional[torch.Tensor], size_out: Optional[int], reduction: Optional[str],
                        implementation: str) -> torch.Tensor:
        """The graph op under TorchScript: the channel rule on e3nn's 2-D tensors, their rows gathered by the
        indices and summed by ``indices_out`` (without indices: one row per row of the operands)."""
        if W is not None and W.dim() != 2:
            raise ValueError(f"with indices, per-row weights must be 2-D [edges, {self.weight_numel}], got shape "
                             f"{W.shape}")
        edges = max(x.shape[0], y.shape[0], 0 if W is None else W.shape[0])
        lengths: List[int] = []
        for index in (indices_1, indices_2, indices_out):
            if index is not None:
                lengths.append(index.shape[0])
        if len(lengths) > 0:
            edges = lengths[0]
            if lengths != [edges] * len(lengths):
                raise ValueError(f"the indices have {lengths} entries: every index has one entry per edge")
        for name, t, index in (("x", x, indices_1), ("y", y, indices_2), ("weight", W, None)):
            if t is not None and index is None and t.shape[0] != edges and t.shape[0] != 1:
                raise ValueError(f"{name} has {t.shape[0]} rows but there are {edges} edges (an operand without "
                                 "index has one row per edge, or one row)")
        rows = size_out if indices_out is not None and size_out is not None else edges
        key = self._graph_key
        if key is None:
            return x.new_zeros(rows, self._dims[2])
        indices: List[Optional[torch.Tensor]] = [None, None, None, None]
        for slot, index in ((0, indices_1), (1, indices_2), (3, indices_out)):
            if index is not None:
                indices[slot] = index.to(torch.int64)
        no_segments: List[Optional[torch.Tensor]] = [None, None, None, None]  # the op sorts the indices it sums by
        return torch.ops.sparse_accumulation.graph_accumulate(
            x, y, W, None, self.coefficients_channels.to(x.dtype), indices, no_segments, no_segments, key, [3],
            [x.shape[0], y.shape[0], 0 if W is None else W.shape[0], rows], edges, implementation,
            "segment" if reduction is None else reduction)[0]


# typed for TorchScript, which cannot infer the type of an empty list (and reads no string annotation)
TensorProduct.__annotations__["_factored_specs"] = List[List[int]]


def _index_tensor(index):
    """An index as a tensor (an :class:`~sparse_accumulation.Index` gives its checked one)."""
    return getattr(index, "tensor", index)


def _broadcast_rows(t: torch.Tensor, lead: List[int]) -> torch.Tensor:
    """``t [..., d]`` as the 2-D rows of the broadcast leading shape ``lead``: its own rows, one row shared by
    every row, or an expanded copy."""
    if t.shape[:-1] == lead:
        return t.reshape(-1, t.shape[-1])
    count = 1
    for size in t.shape[:-1]:
        count *= size
    if count == 1:
        return t.reshape(1, t.shape[-1])
    return t.expand(lead + [t.shape[-1]]).reshape(-1, t.shape[-1])
