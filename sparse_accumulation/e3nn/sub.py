"""e3nn's tensor products of fixed instructions, on :class:`~sparse_accumulation.e3nn.TensorProduct`: the same
constructors, instructions, irreps, weights and state dicts as ``e3nn.o3.FullyConnectedTensorProduct``,
``ElementwiseTensorProduct``, ``FullTensorProduct`` and ``TensorSquare`` (e3nn 0.6.0). Every other keyword is
:class:`~sparse_accumulation.e3nn.TensorProduct`'s (``shared_weights``, ``internal_weights``,
``implementation``, e3nn's compile flags, ...).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .tensor_product import InvalidArgumentError, TensorProduct, _o3

__all__ = ["FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct", "TensorSquare"]


def _filter(filter_ir_out, message):
    """e3nn's ``filter_ir_out``: None, or a list of ``Irrep``; raises ``ValueError`` (``message``) otherwise."""
    if filter_ir_out is None:
        return None
    o3 = _o3()
    try:
        return [o3.Irrep(ir) for ir in filter_ir_out]
    except ValueError as error:
        raise ValueError(message.format(filter_ir_out=filter_ir_out, error=error)) from error


class FullyConnectedTensorProduct(TensorProduct):
    r"""e3nn's fully connected weighted tensor product: one "uvw" instruction (weighted) for every triple of
    irreps ``in1[i] x in2[j] -> out[k]`` that couples, ``z_w = sum_{u,v} w_{uvw} x_u (x) y_v + ...``.

    Args:
        irreps_in1, irreps_in2, irreps_out: e3nn ``Irreps`` (or what ``e3nn.o3.Irreps`` accepts).
        irrep_normalization, path_normalization, kwargs: as for :class:`TensorProduct`.
    """

    def __init__(self, irreps_in1, irreps_in2, irreps_out, irrep_normalization: Optional[str] = None,
                 path_normalization: Optional[str] = None, **kwargs) -> None:
        o3 = _o3()
        irreps_in1, irreps_in2, irreps_out = o3.Irreps(irreps_in1), o3.Irreps(irreps_in2), o3.Irreps(irreps_out)
        instructions = [(i1, i2, i_out, "uvw", True, 1.0)
                        for i1, (_, ir1) in enumerate(irreps_in1) for i2, (_, ir2) in enumerate(irreps_in2)
                        for i_out, (_, ir_out) in enumerate(irreps_out) if ir_out in ir1 * ir2]
        super().__init__(irreps_in1, irreps_in2, irreps_out, instructions, irrep_normalization=irrep_normalization,
                         path_normalization=path_normalization, **kwargs)


class ElementwiseTensorProduct(TensorProduct):
    r"""e3nn's elementwise tensor product ``z_u = x_u (x) y_u`` (no weights): the inputs simplified and split so
    that their irreps pair up one by one, one "uuu" instruction per pair and output irrep.

    Args:
        irreps_in1, irreps_in2: e3nn ``Irreps`` with the same number of irreps.
        filter_ir_out: the output irreps to keep (iterable of ``Irrep``), default all.
        irrep_normalization, kwargs: as for :class:`TensorProduct`.

    Raises:
        InvalidArgumentError: inputs with different numbers of irreps (an ``AssertionError``, as e3nn's).
        ValueError: ``filter_ir_out`` that is not an iterable of irreps.
    """

    def __init__(self, irreps_in1, irreps_in2, filter_ir_out=None, irrep_normalization: Optional[str] = None,
                 **kwargs) -> None:
        o3 = _o3()
        irreps_in1, irreps_in2 = o3.Irreps(irreps_in1).simplify(), o3.Irreps(irreps_in2).simplify()
        filter_ir_out = _filter(filter_ir_out, "filter_ir_out (={filter_ir_out}) must be an iterable of e3nn.o3.Irrep")
        if irreps_in1.num_irreps != irreps_in2.num_irreps:
            raise InvalidArgumentError(f"{irreps_in1} and {irreps_in2} must have the same number of irreps")
        in1, in2 = list(irreps_in1), list(irreps_in2)
        i = 0
        while i < len(in1):  # split the larger block so that both have the smaller multiplicity
            (mul1, ir1), (mul2, ir2) = in1[i], in2[i]
            if mul1 < mul2:
                in2[i:i + 1] = [(mul1, ir2), (mul2 - mul1, ir2)]
            if mul2 < mul1:
                in1[i:i + 1] = [(mul2, ir1), (mul1 - mul2, ir1)]
            i += 1
        out, instructions = [], []
        for i, ((mul, ir1), (_, ir2)) in enumerate(zip(in1, in2)):
            for ir in ir1 * ir2:
                if filter_ir_out is None or ir in filter_ir_out:
                    instructions.append((i, i, len(out), "uuu", False))
                    out.append((mul, ir))
        super().__init__(in1, in2, out, instructions, irrep_normalization=irrep_normalization, **kwargs)


class FullTensorProduct(TensorProduct):
    r"""e3nn's full tensor product ``z_{uv} = x_u (x) y_v`` (no weights): one "uvuv" instruction per pair of
    irreps and output irrep, the output irreps sorted as e3nn sorts them.

    Args:
        irreps_in1, irreps_in2: e3nn ``Irreps`` (simplified first).
        filter_ir_out: the output irreps to keep (iterable of ``Irrep``), default all.
        irrep_normalization, kwargs: as for :class:`TensorProduct`.

    Raises:
        ValueError: ``filter_ir_out`` that is not an iterable of irreps.
    """

    def __init__(self, irreps_in1, irreps_in2, filter_ir_out=None, irrep_normalization: Optional[str] = None,
                 **kwargs) -> None:
        o3 = _o3()
        irreps_in1, irreps_in2 = o3.Irreps(irreps_in1).simplify(), o3.Irreps(irreps_in2).simplify()
        filter_ir_out = _filter(filter_ir_out, "filter_ir_out (={filter_ir_out}) must be an iterable of e3nn.o3.Irrep")
        out, instructions = [], []
        for i1, (mul1, ir1) in enumerate(irreps_in1):
            for i2, (mul2, ir2) in enumerate(irreps_in2):
                for ir in ir1 * ir2:
                    if filter_ir_out is None or ir in filter_ir_out:
                        instructions.append((i1, i2, len(out), "uvuv", False))
                        out.append((mul1 * mul2, ir))
        out, p, _ = o3.Irreps(out).sort()
        instructions = [(i1, i2, p[i_out], mode, weighted) for i1, i2, i_out, mode, weighted in instructions]
        super().__init__(irreps_in1, irreps_in2, out, instructions, irrep_normalization=irrep_normalization, **kwargs)


def _alpha(irrep_normalization, ir1, ir2, ir_out, diagonal: bool) -> float:
    """e3nn's path weight of a square's instruction: its irrep normalization, made explicit (the module then
    uses "none"); ``diagonal`` for the "uuu"/"uuw" terms ``x_u (x) x_u``, whose variance differs."""
    if not diagonal:
        return {"component": ir_out.dim, "norm": ir1.dim * ir2.dim, "none": 1}[irrep_normalization]
    if irrep_normalization == "component":
        return ir_out.dim / (ir1.dim + 2) if ir_out.l == 0 else ir_out.dim / 2
    if irrep_normalization == "norm":
        return ir_out.dim * ir1.dim if ir_out.l == 0 else ir1.dim * (ir1.dim + 2) / 2
    return 1


class TensorSquare(TensorProduct):
    r"""e3nn's tensor square of ``x``: without ``irreps_out``, unweighted ("uvuv" for pairs of different irreps,
    "uvu<v" and, for even output degrees, "uuu" for an irrep with itself; the output irreps sorted); with
    ``irreps_out``, fully connected ("uvw", "u<vw" and "uuw", weighted). Called as ``tp(x, weight=None)``.

    Args:
        irreps_in: e3nn ``Irreps`` of ``x`` (simplified first).
        irreps_out: the output irreps of the weighted square (simplified), or None.
        filter_ir_out: the output irreps to keep without ``irreps_out`` (iterable of ``Irrep``).
        irrep_normalization: ``"component"`` (default), ``"norm"`` or ``"none"``, as path weights of the
            instructions (the module's own normalization is "none", as in e3nn).
        kwargs: as for :class:`TensorProduct`.

    Attributes:
        irreps_in: the irreps of ``x``.

    Raises:
        InvalidArgumentError: an unknown ``irrep_normalization`` (an ``AssertionError``).
        ValueError: both ``irreps_out`` and ``filter_ir_out``, or a ``filter_ir_out`` that is not irreps.
    """

    def __init__(self, irreps_in, irreps_out=None, filter_ir_out=None, irrep_normalization: Optional[str] = None,
                 **kwargs) -> None:
        o3 = _o3()
        irrep_normalization = "component" if irrep_normalization is None else irrep_normalization
        if irrep_normalization not in ("component", "norm", "none"):
            raise InvalidArgumentError(f"irrep_normalization must be 'component', 'norm' or 'none', "
                                       f"got {irrep_normalization!r}")
        irreps_in = o3.Irreps(irreps_in).simplify()
        filter_ir_out = _filter(filter_ir_out, "Error constructing filter_ir_out irrep: {error}")
        instructions = []
        if irreps_out is None:
            out = []
            for i1, (mul1, ir1) in enumerate(irreps_in):
                for i2, (mul2, ir2) in enumerate(irreps_in):
                    for ir in ir1 * ir2:
                        if filter_ir_out is not None and ir not in filter_ir_out or i1 > i2:
                            continue
                        alpha = _alpha(irrep_normalization, ir1, ir2, ir, False)
                        if i1 < i2:
                            instructions.append((i1, i2, len(out), "uvuv", False, alpha))
                            out.append((mul1 * mul2, ir))
                            continue
                        if mul1 > 1:
                            instructions.append((i1, i1, len(out), "uvu<v", False, alpha))
                            out.append((mul1 * (mul1 - 1) // 2, ir))
                        if ir.l % 2 == 0:
                            instructions.append((i1, i1, len(out), "uuu", False,
                                                 _alpha(irrep_normalization, ir1, ir2, ir, True)))
                            out.append((mul1, ir))
            irreps_out, p, _ = o3.Irreps(out).sort()
            instructions = [(i1, i2, p[i_out], mode, weighted, alpha)
                            for i1, i2, i_out, mode, weighted, alpha in instructions]
        else:
            if filter_ir_out is not None:
                raise ValueError("Both `irreps_out` and `filter_ir_out` are not None, this is ambiguous.")
            irreps_out = o3.Irreps(irreps_out).simplify()
            for i1, (mul1, ir1) in enumerate(irreps_in):
                for i2, (_, ir2) in enumerate(irreps_in):
                    for i_out, (_, ir) in enumerate(irreps_out):
                        if ir not in ir1 * ir2 or i1 > i2:
                            continue
                        alpha = _alpha(irrep_normalization, ir1, ir2, ir, False)
                        if i1 < i2:
                            instructions.append((i1, i2, i_out, "uvw", True, alpha))
                            continue
                        if mul1 > 1:
                            instructions.append((i1, i1, i_out, "u<vw", True, alpha))
                        if ir.l % 2 == 0:
                            instructions.append((i1, i1, i_out, "uuw", True,
                                                 _alpha(irrep_normalization, ir1, ir2, ir, True)))
        self.irreps_in = irreps_in
        super().__init__(irreps_in, irreps_in, irreps_out, instructions, irrep_normalization="none", **kwargs)

    def __repr__(self) -> str:
        paths = sum(math.prod(ins.path_shape) for ins in self.instructions)
        return (f"{type(self).__name__}({self.irreps_in} -> {self.irreps_out.simplify()} | {paths} paths | "
                f"{self.weight_numel} weights)")

    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:  # noqa: D417
        """``tp(x, x, weight)`` of :class:`TensorProduct`: ``x [..., irreps_in.dim]`` -> ``[..., irreps_out.dim]``."""
        return self._product(x, x, weight, None, None, None, None, None)
