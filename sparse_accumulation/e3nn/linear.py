"""e3nn's equivariant linear layer ``o3.Linear`` with e3nn's constructor, weights and state dict, computed
without e3nn's slicing gradients.

e3nn's generated code takes each input irrep with ``narrow``, whose gradient is a zero tensor the size of the whole
input with the slice copied in; the gradients of all slices are then added together, so a backward writes and
reads the full input once per input irrep (nine times for the convolution output of a MACE interaction). Here the
input is cut with ``split``, whose gradient is one concatenation, and each instruction's path weight scales its
weight block instead of its output.
"""

import math
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from ..exact import ExactBuffers
from .tensor_product import InvalidArgumentError, IrrepIndexError, WeightsMissingError, _o3

__all__ = ["Linear"]

#: shared-weight float32 calls on CUDA of at most this many rows compute the map, and the inputs' gradient, each
#: as one Triton kernel (:mod:`sparse_accumulation.ops.linear`) instead of a transposing copy, a product and a
#: copy back per output irrep; 0: never
FUSED_MAX_ROWS = 0


class LinearInstruction(NamedTuple):
    """One path of a :class:`Linear`: input irrep ``i_in`` (``-1``: a bias) into output irrep ``i_out``,
    weight block of ``path_shape`` (``(mul_in, mul_out)``, a bias ``(dim,)``), scaled by ``path_weight``."""
    i_in: int
    i_out: int
    path_shape: Tuple[int, ...]
    path_weight: float


class Linear(ExactBuffers, torch.nn.Module):
    r"""e3nn's ``o3.Linear``: ``out[i_out] = sum over instructions (i_in, i_out) of path_weight * x[i_in] @ w``
    per irrep, plus biases on scalar outputs (e3nn 0.6.0's constructor, instructions, path weights, ``weight``
    and ``bias`` layouts, state dict and initialisation).

    Args:
        irreps_in, irreps_out: e3nn ``Irreps`` (or what ``e3nn.o3.Irreps`` accepts).
        f_in, f_out: e3nn's extra feature dimension; not supported (None).
        internal_weights, shared_weights: as e3nn's (default: internal, shared weights).
        instructions: ``(i_in, i_out)`` pairs of equal irreps (default: every such pair).
        biases: a bool, or one per output irrep (only scalar outputs take a bias).
        path_normalization: ``"element"`` or ``"path"``.
        _optimize_einsums: accepted, no effect.

    Raises:
        ImportError: e3nn is not installed.
        NotImplementedError: ``f_in`` or ``f_out`` given.
        InvalidArgumentError: an unknown ``path_normalization``, an instruction between different irreps,
            ``internal_weights`` without ``shared_weights``, biases on non-scalar outputs or of the wrong count.
        IrrepIndexError: an instruction index that is not an index of its irreps.
    """

    # what TorchScript reads (typed here: an empty list would not be), and what it does not
    __jit_ignored_attributes__ = ExactBuffers.__jit_ignored_attributes__ + ["_path_weights", "_fused_tables"]
    _plans: List[List[int]]
    _in_sizes: List[int]
    _weight_sizes: List[int]

    def __init__(self, irreps_in, irreps_out, *, f_in: Optional[int] = None, f_out: Optional[int] = None,
                 internal_weights: Optional[bool] = None, shared_weights: Optional[bool] = None,
                 instructions: Optional[Sequence[Tuple[int, int]]] = None, biases: Union[bool, List[bool]] = False,
                 path_normalization: str = "element", _optimize_einsums: Optional[bool] = None) -> None:
        # not super(): in .recognised.Linear the next class is e3nn's o3.Linear, whose constructor must not run
        torch.nn.Module.__init__(self)
        o3 = _o3()
        if f_in is not None or f_out is not None:
            raise NotImplementedError("Linear does not take f_in / f_out (e3nn's extra feature dimension); use "
                                      "e3nn.o3.Linear for it")
        if path_normalization not in ("element", "path"):
            raise InvalidArgumentError(f"path_normalization must be 'element' or 'path', got {path_normalization!r}")
        self.irreps_in, self.irreps_out = o3.Irreps(irreps_in), o3.Irreps(irreps_out)
        if instructions is None:
            instructions = [(i_in, i_out) for i_in, (_, ir_in) in enumerate(self.irreps_in)
                            for i_out, (_, ir_out) in enumerate(self.irreps_out) if ir_in == ir_out]
        pairs = [(int(i_in), int(i_out)) for i_in, i_out in instructions]
        for i_in, i_out in pairs:
            if not -len(self.irreps_in) <= i_in < len(self.irreps_in):
                raise IrrepIndexError(f"{i_in} is not a valid index for irreps_in ({self.irreps_in})")
            if not -len(self.irreps_out) <= i_out < len(self.irreps_out):
                raise IrrepIndexError(f"{i_out} is not a valid index for irreps_out ({self.irreps_out})")
            if self.irreps_in[i_in].ir != self.irreps_out[i_out].ir:
                raise InvalidArgumentError(f"instruction ({i_in}, {i_out}): {self.irreps_in[i_in].ir} and "
                                           f"{self.irreps_out[i_out].ir} are not the same irrep")

        def fan_in(i_in, i_out):
            n = sum(self.irreps_in[i if path_normalization == "element" else i_in].mul
                    for i, o in pairs if o == i_out)
            return 1.0 if n == 0 else n

        self.instructions = [LinearInstruction(i_in, i_out, (self.irreps_in[i_in].mul, self.irreps_out[i_out].mul),
                                               fan_in(i_in, i_out) ** -0.5) for i_in, i_out in pairs]
        if isinstance(biases, bool):
            biases = [biases and ir.is_scalar() for _, ir in self.irreps_out]
        biases = list(biases)
        if len(biases) != len(self.irreps_out):
            raise InvalidArgumentError(f"biases: {len(biases)} given for {len(self.irreps_out)} output irreps")
        if any(b and not ir.is_scalar() for b, (_, ir) in zip(biases, self.irreps_out)):
            raise InvalidArgumentError("biases: only scalar (0e) output irreps take a bias")
        self.instructions += [LinearInstruction(-1, i_out, (mul_ir.dim,), 1.0)
                              for i_out, (b, mul_ir) in enumerate(zip(biases, self.irreps_out)) if b]

        if shared_weights is False and internal_weights is None:
            internal_weights = False
        shared_weights = True if shared_weights is None else shared_weights
        internal_weights = True if internal_weights is None else internal_weights
        if internal_weights and not shared_weights:
            raise InvalidArgumentError("internal_weights=True needs shared_weights=True")
        self.internal_weights, self.shared_weights = internal_weights, shared_weights
        self.weight_numel = sum(math.prod(ins.path_shape) for ins in self.instructions if ins.i_in != -1)
        self.bias_numel = sum(math.prod(ins.path_shape) for ins in self.instructions if ins.i_in == -1)
        if internal_weights and self.weight_numel > 0:
            self.weight = torch.nn.Parameter(torch.randn(self.weight_numel))
        else:
            self.register_buffer("weight", torch.Tensor())
        if internal_weights and self.bias_numel > 0:
            self.bias = torch.nn.Parameter(torch.zeros(self.bias_numel))
        else:
            self.register_buffer("bias", torch.Tensor())
        reached = {ins.i_out for ins in self.instructions if 0 not in ins.path_shape}
        self._plan()
        self.register_buffer("output_mask", torch.cat([torch.full((mul_ir.dim,), float(i in reached))
                                                       for i, mul_ir in enumerate(self.irreps_out)])
                             if self.irreps_out.dim > 0 else torch.ones(0))

    @classmethod
    def from_e3nn(cls, linear: torch.nn.Module) -> "Linear":
        """The same layer as e3nn's ``linear`` (an ``e3nn.o3.Linear``), holding its ``weight`` and ``bias``
        parameters (not copies: training either trains both).

        Raises:
            TypeError: ``linear`` is not e3nn's ``o3.Linear``.
            NotImplementedError: ``linear`` has e3nn's ``f_in`` / ``f_out`` dimension, or path weights of
                neither normalization.
        """
        o3 = _o3()
        if not isinstance(linear, o3.Linear):
            raise TypeError(f"linear must be e3nn's o3.Linear, got {type(linear).__module__}."
                            f"{type(linear).__qualname__}")
        if linear.weight.dim() > 1:
            raise NotImplementedError("Linear does not take f_in / f_out (e3nn's extra feature dimension)")
        pairs = [(ins.i_in, ins.i_out) for ins in linear.instructions if ins.i_in != -1]
        biases = [any(ins.i_in == -1 and ins.i_out == i for ins in linear.instructions)
                  for i in range(len(linear.irreps_out))]
        for path_normalization in ("element", "path"):
            ours = cls(linear.irreps_in, linear.irreps_out, instructions=pairs, biases=biases,
                       internal_weights=linear.internal_weights, shared_weights=linear.shared_weights,
                       path_normalization=path_normalization)
            if all(math.isclose(a.path_weight, b.path_weight, rel_tol=1e-12)
                   for a, b in zip(ours.instructions, linear.instructions, strict=True)):
                break
        else:
            raise NotImplementedError("linear's path weights are neither e3nn's 'element' nor its 'path' "
                                      "normalization")
        for name in ("weight", "bias"):
            delattr(ours, name)
            value = getattr(linear, name)
            if isinstance(value, torch.nn.Parameter):
                ours.register_parameter(name, value)
            else:
                ours.register_buffer(name, value)
        ours.output_mask = linear.output_mask.clone()
        if linear.weight.is_floating_point():  # the path weights where the layer's weights are
            ours.register_exact("path_weight_values", ours._exact_values["path_weight_values"], linear.weight.dtype,
                                linear.weight.device)
        return ours

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.irreps_in} -> {self.irreps_out} | {self.weight_numel} weights)"

    def forward(self, features: torch.Tensor, weight: Optional[torch.Tensor] = None,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``features [..., irreps_in.dim]`` -> ``[..., irreps_out.dim]``.

        Args:
            features: any leading dimensions, floating point.
            weight: ``[weight_numel]`` (shared) or ``[rows, weight_numel]``; required without internal weights.
            bias: ``[bias_numel]`` (or ``[rows, bias_numel]``); required without internal weights where there are
                biases.

        Raises:
            WeightsMissingError: no ``weight`` / ``bias`` where the module holds none.
            TypeError: ``features`` of another dtype than the weights.
            InvalidArgumentError: ``features``' last dimension is not ``irreps_in.dim`` (a layer without weighted
                paths reads no input and takes any width, as e3nn's does), a weight of another size.
        """
        if weight is None:
            if self.weight_numel > 0 and not self.internal_weights:
                raise WeightsMissingError("Weights must be provided when internal_weights = False")
            weight = self.weight
        if bias is None:
            if self.bias_numel > 0 and not self.internal_weights:
                raise WeightsMissingError("Biases must be provided when internal_weights = False")
            bias = self.bias
        if features.dtype != weight.dtype and self.weight_numel > 0:  # as e3nn's, which cannot mix them either
            raise TypeError(f"features have dtype {features.dtype} but the weights are {weight.dtype}: convert the "
                            f"module (.to({features.dtype})) or the data")
        # a layer without paths reads no input: e3nn takes any width then (MACE's dipole readouts rely on it)
        if features.dim() < 1 or (self.weight_numel > 0 and features.shape[-1] != self._dim_in):
            raise InvalidArgumentError(f"features: last dimension of shape {list(features.shape)} is not "
                                       f"irreps_in.dim = {self._dim_in}")
        if self.weight_numel > 0 and (weight.dim() < 1 or weight.shape[-1] != self.weight_numel):
            raise InvalidArgumentError(f"weight: last dimension of shape {list(weight.shape)} is not weight_numel "
                                       f"= {self.weight_numel}")
        lead = list(features.shape[:-1])
        rows = 1
        for n in lead:
            rows *= n
        x = features.reshape(rows, features.shape[-1])  # (not -1: ambiguous for empty irreps_in)
        if self.shared_weights and self.weight_numel > 0 and not torch.jit.is_scripting() and self._fused(x, rows):
            return self._fused_forward(x, weight, bias).reshape(lead + [self._dim_out])
        parts: List[torch.Tensor] = []
        blocks: List[torch.Tensor] = []
        if self.weight_numel > 0:
            parts = list(torch.split(x, self._in_sizes, dim=-1))
            if torch.jit.is_scripting():
                path_weights = self.path_weight_values.to(weight.dtype)
            else:
                path_weights = self._path_weights_like(weight)
            blocks = list(torch.split(weight.reshape(-1, self.weight_numel) * path_weights, self._weight_sizes, -1))
        out: List[torch.Tensor] = []
        for plan in self._plans:
            # [mul_out, dim, sum of the paths' mul_in, bias offset or -1, then (input irrep, mul_in, block) per path]
            mul_out, d, mul_in, bias_at = plan[0], plan[1], plan[2], plan[3]
            paths = [(plan[j], plan[j + 1], plan[j + 2]) for j in range(4, len(plan), 3)]
            piece: Optional[torch.Tensor] = None
            if len(paths) > 0 and self.shared_weights:
                # the paths into this output as one product: [rows * d, sum of u] @ [sum of u, mul_out]
                inputs = [parts[i].view(rows, u, d).transpose(1, 2) for i, u, _ in paths]
                xt = (inputs[0] if len(inputs) == 1 else torch.cat(inputs, dim=2)).reshape(rows * d, mul_in)
                w = [blocks[k].view(u, mul_out) for _, u, k in paths]
                y = xt @ (w[0] if len(w) == 1 else torch.cat(w, dim=0))
                piece = y if d == 1 else y.view(rows, d, mul_out).transpose(1, 2).reshape(rows, mul_out * d)
            else:
                for i, u, k in paths:
                    term = torch.einsum("zuw,zui->zwi", blocks[k].view(-1, u, mul_out),
                                        parts[i].view(rows, u, d)).reshape(rows, mul_out * d)
                    piece = term if piece is None else piece + term
            if bias_at >= 0:
                b = bias.reshape(-1, self.bias_numel)[:, bias_at:bias_at + mul_out]
                piece = b.expand(rows, mul_out) if piece is None else piece + b
            out.append(x.new_zeros(rows, mul_out * d) if piece is None else piece)
        if len(out) == 0:  # no output irreps: e3nn's [..., 0]
            return x.new_zeros(lead + [0])
        result = torch.cat(out, dim=-1) if len(out) != 1 else out[0]
        return result.reshape(lead + [self._dim_out])

    @torch.jit.unused
    def _fused(self, x: torch.Tensor, rows: int) -> bool:
        """Whether this call takes the fused kernel (:data:`FUSED_MAX_ROWS`)."""
        if not 0 < rows <= FUSED_MAX_ROWS or torch.compiler.is_compiling():
            return False
        from ..ops import linear as fused

        return fused.available(x)

    @torch.jit.unused
    def _fused_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        from ..ops import linear as fused

        if self._fused_tables is None:
            in_at = [sum(self._in_sizes[:i]) for i in range(len(self._in_sizes))]
            out_at = [sum(mul_ir.dim for mul_ir in self.irreps_out[:j]) for j in range(len(self.irreps_out))]
            weighted = [ins for ins in self.instructions if ins.i_in != -1]
            paths = [(in_at[ins.i_in], ins.path_shape[0], out_at[ins.i_out], ins.path_shape[1],
                      self.irreps_in[ins.i_in].ir.dim, sum(self._weight_sizes[:k]), ins.path_weight)
                     for k, ins in enumerate(weighted) if 0 not in ins.path_shape]
            outputs = [(out_at[j], plan[0], plan[1], plan[3]) for j, plan in enumerate(self._plans)]
            inputs = [(in_at[i], mul_ir.mul, mul_ir.ir.dim) for i, mul_ir in enumerate(self.irreps_in)]
            self._fused_tables = fused.LinearTables(paths, outputs, inputs, self._dim_in, self._dim_out)
        return fused.linear(x, weight, bias if self.bias_numel > 0 else None, self._fused_tables)

    @torch.jit.unused
    def _path_weights_like(self, weight: torch.Tensor) -> torch.Tensor:
        """Each weight entry's path weight on ``weight``'s device, in its dtype: the module's buffer where it has
        them (a compiled graph then copies nothing from the host, which a CUDA graph could not capture), else made
        from the float64 values once per pair (not kept when made while compiling, or inside inference mode, where it
        would be an inference tensor that a later call that trains could not save for its backward)."""
        held = self.path_weight_values
        if held.device == weight.device and held.dtype == weight.dtype:
            return held
        key = (weight.device, weight.dtype)
        found = self._path_weights.get(key)
        if found is None:
            found = self._exact_values["path_weight_values"].to(weight.device, weight.dtype)
            if not (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()):
                self._path_weights[key] = found
        return found

    def _plan(self) -> None:
        """What :meth:`forward` reads per output irrep, as a list of ints (TorchScript types it): ``[mul, dim,
        the paths' total mul_in, bias offset or -1]`` and ``input irrep, mul_in, weight block`` per path of the
        instructions computed (none on multiplicity 0); the split sizes of the input and the weight; each weight
        entry's path weight (float64, :meth:`_path_weights_like`)."""
        self._dim_in, self._dim_out = self.irreps_in.dim, self.irreps_out.dim  # plain ints for torch.compile
        self._in_sizes = [mul_ir.dim for mul_ir in self.irreps_in]
        weighted = [ins for ins in self.instructions if ins.i_in != -1]
        self._weight_sizes = [math.prod(ins.path_shape) for ins in weighted]
        # a buffer that moves with the module (not saved: e3nn's state dict has none), and per device and dtype
        # the copies eager calls use (_path_weights_like)
        self.register_exact("path_weight_values", torch.cat(
            [torch.full((n,), ins.path_weight, dtype=torch.float64) for n, ins in zip(self._weight_sizes, weighted)]
            or [torch.zeros(0, dtype=torch.float64)]), torch.float64)
        self._path_weights = {}
        self._fused_tables = None  # the fused kernel's tables (sparse_accumulation.ops.linear), made on first use
        bias_offsets, offset = {}, 0
        for ins in self.instructions:
            if ins.i_in == -1:
                bias_offsets[ins.i_out] = offset
                offset += ins.path_shape[0]
        self._plans = []
        for i_out, mul_ir in enumerate(self.irreps_out):
            paths = [(ins.i_in, ins.path_shape[0], k) for k, ins in enumerate(weighted)
                     if ins.i_out == i_out and 0 not in ins.path_shape]
            self._plans.append([mul_ir.mul, mul_ir.ir.dim, sum(u for _, u, _ in paths), bias_offsets.get(i_out, -1)]
                               + [n for path in paths for n in path])

    def weight_view_for_instruction(self, instruction: int, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The view of ``weight`` (default the module's) of instruction ``instruction``: ``[..., mul_in,
        mul_out]``."""
        if weight is None:
            if not self.internal_weights:
                raise WeightsMissingError("Weights must be provided when internal_weights = False")
            weight = self.weight
        offset = sum(math.prod(ins.path_shape) for ins in self.instructions[:instruction])
        ins = self.instructions[instruction]
        return weight.narrow(-1, offset, math.prod(ins.path_shape)).view(weight.shape[:-1] + ins.path_shape)

    def weight_views(self, weight: Optional[torch.Tensor] = None,
                     yield_instruction: bool = False) -> Iterator:
        """Every weighted instruction's weight view in order (with ``yield_instruction``: ``(index, instruction,
        view)``); the bias instructions have none."""
        for i, ins in enumerate(self.instructions):
            if ins.i_in == -1:
                continue
            view = self.weight_view_for_instruction(i, weight)
            yield (i, ins, view) if yield_instruction else view
