"""MACE's symmetric contraction (its product basis) on this library's polynomial kernels.

:class:`SymmetricContraction` takes the constructor and call of ``mace.modules.SymmetricContraction`` (mace-torch
0.3.16) and holds the same parameters (``contractions[i].weights_max`` and ``contractions[i].weights``, one
``[num_elements, paths, channels]`` tensor per correlation order). Per node and channel it computes::

    out[L, M] = sum over orders nu, paths k: W_nu[element, k, channel] * sum U_nu[M, i_1..i_nu, k] x[i_1]..x[i_nu]

as MACE does, but never contracts ``U``: its symmetric part is a few hundred terms ``(M, monomial)``
(:mod:`.couplings`), so each call folds the weights into one table ``P[element, term, channel] = B @ W`` (a
small matmul over elements, not nodes) and runs one kernel per node tile that multiplies monomials of ``x`` by
the node's element row of ``P`` (:mod:`sparse_accumulation.descriptors.programs`). Gradients, to any order, run on the
same kernels. Node attributes that are not one-hot take the same kernels with per-node weights ``y @ P``
(:meth:`SymmetricContraction.forward`).
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from .. import backends
from ..exact import ExactBuffers
from ..descriptors.channel_rules import ColumnMap
from ..descriptors.programs import LANE, Program, Slot, element_slot, lane_slot
from ..e3nn.tensor_product import IRREP_NORMALIZATIONS, PATH_NORMALIZATIONS
from ..indices import element_segments
from ..ops.scripted import check_like
from ..ops.polynomial.api import evaluate
from .attributes import prepare
from .couplings import couplings_from_dense, mace_couplings, mace_has_paths
from .irreps import irreps_text, parse_irreps



def _correlations(correlation, irreps_out) -> list:
    """One correlation order per output irrep, from an int, a sequence or a dict keyed by irrep."""
    def check(value, what):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"correlation{what} must be a positive int, got {value!r}")
        return int(value)

    if isinstance(correlation, dict):
        found = {}
        for key, value in correlation.items():
            text = str(key)
            ir = parse_irreps(text if "x" in text or isinstance(key, str) else [(1, key)], "correlation")
            if len(ir) != 1:
                raise ValueError(f"correlation: key {key!r} is not one irrep such as '1o'")
            found[ir[0].ir] = check(value, f"[{key!r}]")
        missing = [str(term.ir) for term in irreps_out if term.ir not in found]
        if missing:
            raise ValueError(f"correlation has no order for output irreps {', '.join(missing)}")
        return [found[term.ir] for term in irreps_out]
    if isinstance(correlation, (list, tuple)):
        if len(correlation) != len(irreps_out):
            raise ValueError(f"correlation must give one order per output irrep ({len(irreps_out)}), "
                             f"got {len(correlation)}")
        return [check(c, f"[{i}]") for i, c in enumerate(correlation)]
    return [check(correlation, "")] * len(irreps_out)


class FrozenZero(torch.nn.Parameter):
    """A weight frozen at zero, as MACE's ``EmptyParam``: ``requires_grad`` False, and ``requires_grad_`` does
    nothing (``module.requires_grad_()`` leaves it frozen). Made from ``data`` as given (pass zeros); a deep
    copy keeps its class and values."""

    def __new__(cls, data, requires_grad: bool = False):
        del requires_grad  # torch's deep copy passes it
        return super().__new__(cls, data, requires_grad=False)

    def requires_grad_(self, mode: bool = True):
        del mode
        return self


class _Weights(torch.nn.Module):
    """The weights of one output irrep, named as MACE names them: ``weights_max`` (the highest order) and
    ``weights`` (the lower orders, highest first), and MACE's flags ``weights_{idx}_zeroed`` (``idx`` below
    ``correlation - 1``) and ``weights_max_zeroed``.

    ``zeroed[idx]`` says that the coupling tensor of order ``idx + 1`` is all zeros. As MACE's ``Contraction``
    does, flag ``idx < correlation - 1`` freezes ``weights[idx]`` (which holds order ``correlation - 1 - idx``,
    not ``idx + 1``) at zero and the last one ``weights_max``: MACE's checkpoints and outputs reflect that
    choice, so it is kept. External weights (``internal=False``) are used as passed, as in MACE."""

    def __init__(self, shapes, internal: bool, zeroed, dtype, device):
        super().__init__()
        made = [torch.randn(shape, dtype=dtype, device=device) / shape[1] for shape in shapes]
        if internal:
            self.weights_max = torch.nn.Parameter(made[0])
            self.weights = torch.nn.ParameterList([torch.nn.Parameter(w) for w in made[1:]])
        else:
            self.weights_max = None
            self.weights = None
        last = len(shapes) - 1
        for idx, zero in enumerate(zeroed):
            zero = bool(zero)
            if idx < last:
                if zero and internal:
                    self.weights[idx] = FrozenZero(torch.zeros_like(made[1 + idx]))
                self.register_buffer(f"weights_{idx}_zeroed", torch.tensor(zero, device=device))
            else:
                if zero and internal:
                    self.weights_max = FrozenZero(torch.zeros_like(made[0]))
                self.register_buffer("weights_max_zeroed", torch.tensor(zero, device=device))

    def tensors(self) -> List[torch.Tensor]:
        """``[weights_max, *weights]`` (empty for external weights)."""
        found: List[torch.Tensor] = []
        if self.weights_max is not None:
            found.append(self.weights_max)
        if self.weights is not None:
            for w in self.weights:
                found.append(w)
        return found


class SymmetricContraction(ExactBuffers, torch.nn.Module):
    """MACE's symmetric contraction (product basis), computed as sparse polynomials of the node features.

    A drop-in for ``mace.modules.symmetric_contraction.SymmetricContraction``: the same constructor, call and
    parameters, outputs and gradients equal to MACE's to rounding. As MACE, it freezes some weights at zero
    (:class:`FrozenZero`, flagged by the buffers ``contractions[i].weights_{idx}_zeroed`` and
    ``weights_max_zeroed``): those of ``weights[idx]`` where the coupling tensor of order ``idx + 1`` is all zeros
    (MACE's index mapping, kept as it is) and ``weights_max`` where the highest order's is. :meth:`from_mace`
    takes a MACE module with its trained weights. Only ``from_mace`` and the tests involve mace-torch; the
    coupling coefficients come from this library's Clebsch-Gordan generator.

    Args:
        irreps_in: irreps of the node features, each with multiplicity ``channels`` (``"128x0e+128x1o+128x2e"``,
            an e3nn ``Irreps`` or ``(mul, (l, p))`` pairs).
        irreps_out: irreps of the output, each with multiplicity ``channels``.
        correlation: the highest correlation order: an int, one int per output irrep, or a dict keyed by irrep.
        irrep_normalization, path_normalization: accepted and checked as MACE does (``"component"``/``"norm"``/
            ``"none"``, ``"element"``/``"path"``/``"none"``); MACE's coefficients do not depend on them.
        use_reduced_cg: must be False (the reduced basis of cuequivariance: load such a module with
            :meth:`from_mace`).
        internal_weights: the module holds its weights (default True); False: every call passes them and they
            are used as passed, none frozen (MACE's code replaces its frozen weights by the external ones after
            registering the flags, which are registered here too; mace-torch 0.3.16's own module fails to build
            with ``internal_weights=False``).
        shared_weights: as MACE (internal weights need ``shared_weights`` True or None).
        num_elements: number of chemical elements (required).
        implementation: kernel implementation (None: the library default, numba on CPU and Triton on CUDA).
        dtype, device: of the weights (default: torch's default dtype, the CPU).

    Raises:
        ValueError: irreps of different multiplicities, a bad correlation, normalisation or weight option,
            ``num_elements`` missing.
        NotImplementedError: ``use_reduced_cg=True``.
    """

    __e3nn_compile_mode__ = "script"  # e3nn.util.jit.compile (MACE's scripting) scripts it, as it does MACE's own

    def __init__(self, irreps_in, irreps_out, correlation, irrep_normalization: str = "component",
                 path_normalization: str = "element", use_reduced_cg: bool = False,
                 internal_weights: Optional[bool] = None, shared_weights: Optional[bool] = None,
                 num_elements: Optional[int] = None, *, implementation: Optional[str] = None, dtype=None,
                 device=None, _couplings=None, _zeroed=None):
        super().__init__()
        for name, value, allowed in (("irrep_normalization", irrep_normalization, IRREP_NORMALIZATIONS),
                                     ("path_normalization", path_normalization, PATH_NORMALIZATIONS)):
            if value is not None and value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if use_reduced_cg and _couplings is None:
            raise NotImplementedError("use_reduced_cg=True (cuequivariance's reduced basis) is not built here; "
                                      "load such a MACE module with SymmetricContraction.from_mace")
        internal_weights = True if internal_weights is None else bool(internal_weights)
        if internal_weights and shared_weights is not None and not shared_weights:
            raise ValueError("internal_weights=True needs shared_weights True or None")
        if isinstance(num_elements, bool) or not isinstance(num_elements, (int, np.integer)) or num_elements < 1:
            raise ValueError(f"num_elements must be a positive int, got {num_elements!r}")
        backends._check_name(implementation)
        self.irreps_in = parse_irreps(irreps_in, "irreps_in")
        self.irreps_out = parse_irreps(irreps_out, "irreps_out")
        muls = {term.mul for term in self.irreps_in}
        if len(muls) != 1 or 0 in muls:
            raise ValueError(f"irreps_in must give every irrep one positive multiplicity (the channels), got "
                             f"{irreps_text(self.irreps_in)}")
        self.channels = muls.pop()
        if not self.irreps_out or any(term.mul != self.channels for term in self.irreps_out):
            raise ValueError(f"irreps_out must give every irrep the multiplicity of irreps_in ({self.channels}), "
                             f"got {irreps_text(self.irreps_out)}")
        self.correlation = _correlations(correlation, self.irreps_out)
        self.num_elements = int(num_elements)
        self.internal_weights, self.shared_weights = internal_weights, shared_weights
        self.implementation = implementation
        coupling = tuple(term.ir for term in self.irreps_in)
        self.dim_in = sum(ir.dim for ir in coupling)
        if _couplings is None:
            _couplings = [[mace_couplings(coupling, term.ir, nu) for nu in range(order, 0, -1)]
                          for term, order in zip(self.irreps_out, self.correlation)]
        if _zeroed is None:
            _zeroed = [[not mace_has_paths(coupling, term.ir, nu) for nu in range(1, order + 1)]
                       for term, order in zip(self.irreps_out, self.correlation)]
        dtype = torch.get_default_dtype() if dtype is None else dtype
        self.contractions = torch.nn.ModuleList(
            _Weights([(self.num_elements, block.paths, self.channels) for block in blocks], internal_weights, zeroed,
                     dtype, device) for blocks, zeroed in zip(_couplings, _zeroed))
        self._set_couplings(_couplings, dtype, device)

    def _set_couplings(self, blocks, dtype, device) -> None:
        """The programs and the ``couplings`` buffer ``B`` of ``blocks`` (per output irrep, the
        :class:`~.couplings.Couplings` of each order, highest first)."""
        self.blocks = blocks
        self.program, self.node_program, B = _programs(self.channels, self.dim_in,
                                                       [term.ir for term in self.irreps_out], self.blocks)
        self.register_exact("couplings", B, dtype, device)
        # what a scripted call passes to the registered op (TorchScript cannot type the programs)
        self._program_key, self._node_program_key = self.program.key, self.node_program.key

    def extra_repr(self) -> str:
        return (f"{irreps_text(self.irreps_in)} -> {irreps_text(self.irreps_out)}, correlation={self.correlation}, "
                f"num_elements={self.num_elements}, terms={self.couplings.shape[0]}")

    @classmethod
    def from_mace(cls, module, *, implementation: Optional[str] = None,
                  mace_buffers: bool = False) -> "SymmetricContraction":
        """The contraction of a ``mace.modules.symmetric_contraction.SymmetricContraction`` with its weights
        (copied) and its own coupling tensors (any basis MACE built them in), on the weights' device and dtype.
        The weights MACE froze at zero are frozen here, as its ``weights_*_zeroed`` flags say (none where a
        module has no such flags).

        With ``mace_buffers``, the result also holds copies of MACE's ``contractions.<i>.U_matrix_<nu>`` buffers
        (not read by the computation), so that its state dict has MACE's keys, shapes and values and loads into
        MACE's module, and MACE's into it, with ``strict=True``; a loaded ``U`` that differs from the one held
        rebuilds the couplings from the loaded one, as MACE would compute with it.

        Raises:
            TypeError: ``module`` is not MACE's symmetric contraction.
            ValueError: ``module`` holds no weights of its own.
        """
        contractions = getattr(module, "contractions", None)
        if contractions is None or not hasattr(module, "irreps_in") or not hasattr(module, "irreps_out"):
            raise TypeError(f"module must be MACE's SymmetricContraction, got {type(module).__name__}")
        irreps_in = parse_irreps(module.irreps_in, "module.irreps_in")
        irreps_out = parse_irreps(module.irreps_out, "module.irreps_out")
        dim_in = sum(term.ir.dim for term in irreps_in)
        U_tensors, weights, zeroed = [], [], []
        for contraction in contractions:
            order = int(contraction.correlation)
            tensors = [contraction.weights_max, *(contraction.weights or ())]
            if not all(isinstance(t, torch.Tensor) for t in tensors):
                raise ValueError("module has no internal weights (MACE's internal_weights=False): from_mace copies "
                                 "a module's own weights")
            buffers = dict(contraction.named_buffers())
            U_tensors.append([buffers[f"U_matrix_{nu}"] for nu in range(order, 0, -1)])
            weights.append(tensors)
            names = [f"weights_{idx}_zeroed" for idx in range(order - 1)] + ["weights_max_zeroed"]
            zeroed.append([bool(buffers[name]) if name in buffers else False for name in names])
        blocks = _dense_couplings(U_tensors, irreps_out, dim_in)
        first = weights[0][0]
        made = cls(irreps_in, irreps_out, [len(b) for b in blocks], num_elements=first.shape[0],
                   implementation=implementation, dtype=first.dtype, device=first.device, _couplings=blocks,
                   _zeroed=zeroed)
        with torch.no_grad():
            for ours, theirs in zip(made.contractions, weights):
                for target, source in zip(ours.tensors(), theirs):
                    target.copy_(source.detach())
        if mace_buffers:
            for ours, per_irrep in zip(made.contractions, U_tensors):
                for nu, U in zip(range(len(per_irrep), 0, -1), per_irrep):
                    ours.register_buffer(f"U_matrix_{nu}", U.detach().clone())
        return made

    def _load_from_state_dict(self, state_dict, prefix, *args):
        held, loaded = [], []
        for i, blocks in enumerate(self.blocks):
            names = [f"U_matrix_{nu}" for nu in range(len(blocks), 0, -1)]
            buffers = dict(self.contractions[i].named_buffers(recurse=False))
            held.append([buffers.get(name) for name in names])
            loaded.append([state_dict.get(f"{prefix}contractions.{i}.{name}") for name in names])
        if all(h is not None for hs in held for h in hs):  # made by from_mace(..., mace_buffers=True)
            pairs = [(h, l) for hs, ls in zip(held, loaded) for h, l in zip(hs, ls)]
            # a U of another shape or a missing one: load_state_dict reports it and copies nothing of it
            if all(l is not None and l.shape == h.shape for h, l in pairs) and \
                    any(not torch.equal(l.to(h.device, h.dtype), h) for h, l in pairs):
                self._set_couplings(_dense_couplings(loaded, self.irreps_out, self.dim_in), self.couplings.dtype,
                                    self.couplings.device)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def weight_table(self, weights=None) -> torch.Tensor:
        """``P [num_elements, terms * channels]``: each element's weight of every term, ``B @ W``."""
        if weights is None:
            if not self.internal_weights:
                raise ValueError("this module has no internal weights: pass weights")
            weights = [c.tensors() for c in self.contractions]
        flat = [w for per_irrep in weights for w in per_irrep]
        W = torch.cat(flat, dim=1) if len(flat) > 1 else flat[0]
        return torch.matmul(self.couplings, W).reshape(self.num_elements, -1)

    def forward(self, x: torch.Tensor, y: torch.Tensor,
                weights: Optional[List[List[torch.Tensor]]] = None) -> torch.Tensor:
        """The contraction of node features ``x`` for node attributes ``y``.

        The output is linear in each row of ``y``, as MACE's: ``sum_e y[n, e] * out(x[n], weights of e)``.
        How ``y`` is read (:func:`sparse_accumulation.mace.attributes.prepare`):

        * integer indices and one-hot rows: the kernels gather each node's element row of the weight table;
        * rows with at most one nonzero (scaled rows, zero rows of padding nodes): the same, and the output
          rows are multiplied by that nonzero (zero rows give zeros);
        * any other rows (soft, mixed), and any ``y`` that requires grad: per-node weights ``y @ P``
          (``[nodes, terms * channels]``, a memory cost the other readings do not have), differentiable with
          respect to ``y``.

        In eager mode ``y`` is read once per tensor to choose. Under ``torch.compile`` (and CUDA graph capture)
        nothing is read: a ``y`` that does not require grad takes the scaled reading (exact for one-hot, scaled
        and zero rows), and a device-side assertion fails for rows with several nonzeros; such attributes need
        eager mode or a ``y`` that requires grad there.

        Args:
            x: ``[nodes, channels, sum(2l+1)]`` float32 or float64 tensor (MACE's layout), on the weights' device.
            y: node attributes ``[nodes, num_elements]`` of any floating dtype (MACE's ``node_attrs``, e.g.
                one-hot rows), integer element indices ``[nodes]``, or what
                :func:`~sparse_accumulation.mace.attributes.prepare` made of either.
            weights: only for ``internal_weights=False``: per output irrep, the list
                ``[weights_max, *weights]`` of ``[num_elements, paths, channels]`` tensors, used as passed.

        Returns:
            A ``[nodes, channels * sum(2L+1)]`` tensor of ``x``'s dtype, per output irrep ``L`` its
            ``[channels, 2L+1]`` block (MACE's output).

        Raises:
            TypeError: ``x`` not a floating tensor of the weights' dtype, ``y`` of a dtype that fits neither form.
            ValueError: shapes that do not fit, tensors on another device.
            IndexError: element indices out of range.
            RuntimeError: (compiled or captured calls, from the device) rows of ``y`` with several nonzeros and
                a ``y`` that does not require grad.

        Under ``torch.jit.script`` the call runs the registered op (:meth:`_scripted`): ``y`` must be a tensor,
        it is read on every call, element indices are not checked, and ``implementation=None`` means ``"auto"``.
        """
        if torch.jit.is_scripting():
            return self._scripted(x, y, weights)
        return self._eager(x, y, weights)

    def _eager(self, x, y, weights) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.couplings.dtype:
            raise TypeError(f"x has dtype {x.dtype} but the module's weights are {self.couplings.dtype}")
        if x.dim() != 3 or x.shape[1] != self.channels or x.shape[2] != self.dim_in:
            raise ValueError(f"x must be [nodes, {self.channels}, {self.dim_in}], got shape {tuple(x.shape)}")
        if x.device != self.couplings.device:
            raise ValueError(f"x is on {x.device} but the module is on {self.couplings.device}")
        if isinstance(y, torch.Tensor) and y.device != x.device:
            raise ValueError(f"y is on {y.device} but x is on {x.device}")
        if isinstance(y, torch.Tensor) and y.shape[0] != x.shape[0]:
            raise ValueError(f"y has {y.shape[0]} rows but x has {x.shape[0]} nodes")
        if (weights is None) != self.internal_weights:
            raise ValueError("weights must be given exactly when the module has no internal weights")
        attributes = prepare(y, self.num_elements, "y")
        table = self.weight_table(weights)
        flat = x.reshape(x.shape[0], self.channels * self.dim_in)
        if flat.stride(-1) != 1:
            flat = flat.contiguous()
        implementation = backends.get_default_implementation() if self.implementation is None else self.implementation
        if attributes.per_node is not None:
            per_node = torch.matmul(attributes.per_node.to(table.dtype), table)
            return evaluate(self.node_program, [flat, per_node], attributes.elements, implementation)[0]
        out = evaluate(self.program, [flat, table], attributes.elements, implementation)[0]
        return out if attributes.scale is None else out * attributes.scale.to(out.dtype)

    def _scripted(self, x: torch.Tensor, y: torch.Tensor, weights: Optional[List[List[torch.Tensor]]]) -> torch.Tensor:
        """:meth:`forward` under TorchScript, on ``torch.ops.sparse_accumulation.polynomial``: ``y`` read as the
        eager call reads it (one-hot rows, scaled rows, per-node weights), but on every call."""
        if x.dim() != 3 or x.shape[1] != self.channels or x.shape[2] != self.dim_in:
            raise ValueError(f"x must be [nodes, {self.channels}, {self.dim_in}], got shape {x.shape}")
        check_like("x", x, "the module's weights", self.couplings)
        if y.device != x.device:
            raise ValueError(f"y is on {y.device} but x is on {x.device}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y has {y.shape[0]} rows but x has {x.shape[0]} nodes")
        flat_weights: List[torch.Tensor] = []
        if weights is None:
            if not self.internal_weights:
                raise ValueError("weights must be given exactly when the module has no internal weights")
            for contraction in self.contractions:
                flat_weights.extend(contraction.tensors())
        else:
            if self.internal_weights:
                raise ValueError("weights must be given exactly when the module has no internal weights")
            for per_irrep in weights:
                flat_weights.extend(per_irrep)
        W = torch.cat(flat_weights, dim=1) if len(flat_weights) > 1 else flat_weights[0]
        if W.shape != [self.num_elements, self.couplings.shape[1], self.channels]:
            raise ValueError(f"the weights must be [num_elements={self.num_elements}, paths, channels={self.channels}] "
                             f"per order, {self.couplings.shape[1]} paths in all; got {W.shape} in all")
        table = torch.matmul(self.couplings, W).reshape(self.num_elements, -1)
        flat = x.reshape(x.shape[0], self.channels * self.dim_in)
        if flat.stride(-1) != 1:
            flat = flat.contiguous()
        implementation = "auto" if self.implementation is None else self.implementation
        if y.dim() == 1 and not y.is_floating_point():
            return _scripted_polynomial(self._program_key, [flat, table], y, self.num_elements, implementation)
        if y.dim() != 2 or not y.is_floating_point() or y.shape[1] != self.num_elements:
            raise ValueError(f"y must be 1-D integer element indices or [nodes, num_elements={self.num_elements}] "
                             f"floating node attributes, got shape {y.shape} of dtype {y.dtype}")
        nonzero = (y != 0).sum(1)
        flags: List[bool] = torch.stack([((nonzero == 1) & (y == 1).any(1)).all(), (nonzero <= 1).all()]).tolist()
        if y.requires_grad or not flags[1]:
            per_node = torch.matmul(y.to(table.dtype), table)
            one_element = torch.zeros(y.shape[0], dtype=torch.int64, device=y.device)
            return _scripted_polynomial(self._node_program_key, [flat, per_node], one_element, 1, implementation)
        columns = y.abs().argmax(1)
        out = _scripted_polynomial(self._program_key, [flat, table], columns, self.num_elements, implementation)
        return out if flags[0] else out * y.gather(1, columns[:, None]).to(out.dtype)


def _scripted_polynomial(program: str, tensors: List[torch.Tensor], elements: torch.Tensor, num_elements: int,
                         implementation: str) -> torch.Tensor:
    """The first output of the program of key ``program`` for nodes of ``elements``, on the registered op."""
    elements = elements.to(torch.int64).contiguous()
    order, starts = element_segments(elements, num_elements)
    return torch.ops.sparse_accumulation.polynomial(tensors, elements, order, starts, program, [0],
                                                    implementation)[0]


def _dense_couplings(U_tensors, irreps_out, dim_in: int) -> list:
    """Per output irrep, the :class:`~.couplings.Couplings` of MACE's dense ``U`` tensors of each order, highest
    first (``U_tensors``: per output irrep, the tensors ``U_matrix_<nu>`` for ``nu`` from its correlation down)."""
    blocks = []
    for term, per_irrep in zip(irreps_out, U_tensors):
        found = []
        for nu, U in zip(range(len(per_irrep), 0, -1), per_irrep):
            U = U.detach().cpu()
            tolerance = 64 * torch.finfo(U.dtype).eps
            found.append(couplings_from_dense(U.to(torch.float64).numpy(), term.ir.dim, dim_in, nu, tolerance))
        blocks.append(found)
    return blocks


def _programs(channels: int, dim_in: int, irreps_out, blocks) -> tuple:
    """The forward :class:`~sparse_accumulation.descriptors.programs.Program` with the weight table as an element operand
    (a row per element), the same program with it as a lane operand (a row per node), and
    ``B [terms, paths]`` (block diagonal over the output irreps and orders, paths in MACE's parameter order)."""
    bases, steps, offset = [], [], 0
    for ir in irreps_out:
        bases += [offset + M for M in range(ir.dim)]
        steps += [ir.dim] * ir.dim
        offset += channels * ir.dim
    output = Slot(LANE, ColumnMap(tuple(bases), tuple(steps), offset))
    terms, rows, columns, values = [], [], [], []
    t0 = k0 = component0 = 0
    for ir, per_order in zip(irreps_out, blocks):
        for block in per_order:
            for t, (M, monomial) in enumerate(zip(block.components, block.monomials)):
                terms.append((component0 + int(M), 1.0, [(0, int(i)) for i in monomial] + [(1, t0 + t)]))
            r, c = np.nonzero(block.B)
            rows += (r + t0).tolist()
            columns += (c + k0).tolist()
            values += block.B[r, c].tolist()
            t0 += len(block.components)
            k0 += block.paths
        component0 += ir.dim
    B = np.zeros((t0, k0))
    B[rows, columns] = values
    features, weights = lane_slot(dim_in, channels), element_slot(t0, channels)
    program = Program(channels, (features, weights), (output,), [terms])
    node_program = Program(channels, (features, Slot(LANE, weights.map)), (output,), [terms])
    return program, node_program, B
