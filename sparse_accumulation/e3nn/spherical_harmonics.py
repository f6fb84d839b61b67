"""e3nn's spherical harmonics ``o3.SphericalHarmonics`` as one matrix product of the vector's tensor powers.

A real spherical harmonic of degree ``l`` is a homogeneous polynomial of degree ``l`` in the vector's components,
so every output of e3nn's module is a fixed linear combination of the entries of ``u``, ``u (x) u``, ...,
``u (x) ... (x) u`` (``u`` the vector, normalized where asked). e3nn evaluates its polynomials term by term:
about 50 elementwise operations forward and 120 backward for ``lmax = 3`` (MACE's default), each a pass over the
edges, and on a GPU each a kernel launch. Here the tensor powers are built with one broadcast product per degree
and mapped to the outputs by one matrix product with a constant coefficient matrix, and the gradient is the
Jacobian's polynomials (one degree lower, one more constant matrix) contracted with the output gradient: about 7
operations forward and 19 backward, the normalization's included. The backward is made of differentiable
operations, so force training differentiates it again; TorchScript and ``torch.compile`` run the plain form
(autograd's own derivatives), which compiled graphs fuse.

The coefficients are read off e3nn's own polynomials when the module is made (a least-squares fit on random
vectors, which is exact for polynomials of that degree; the fit's residual is checked), so they follow e3nn's
basis, ordering and normalizations exactly.
"""
from __future__ import annotations

from typing import List

import torch

from ..exact import ExactBuffers
from .tensor_product import InvalidArgumentError, _o3

__all__ = ["SphericalHarmonics"]

#: the largest degree whose tensor powers stay small: 3 + 9 + ... + 3^lmax columns per vector (363 at 5)
MAX_L = 5


class SphericalHarmonics(ExactBuffers, torch.nn.Module):
    """e3nn's ``o3.SphericalHarmonics(irreps_out, normalize, normalization, irreps_in)``: vectors ``[..., 3]`` to
    their spherical harmonics ``[..., irreps_out.dim]`` in e3nn's basis and order.

    Args:
        irreps_out: e3nn ``Irreps`` (parities ``p**l`` of the input's parity ``p``), an ``lmax`` (int) or a list of
            degrees, as e3nn's.
        normalize: divide each vector by its norm first (zero vectors stay zero, as e3nn's).
        normalization: ``"integral"``, ``"component"`` or ``"norm"``.
        irreps_in: ``"1x1o"`` (a vector, the default) or ``"1x1e"`` (a pseudovector), as e3nn's.

    Raises:
        ImportError: e3nn is not installed (its polynomials are the reference the coefficients are read from).
        InvalidArgumentError: an unknown ``normalization``, a parity that does not follow from the input's, an
            ``irreps_in`` other than a vector or pseudovector.
        NotImplementedError: a degree above :data:`MAX_L`.
    """

    __constants__ = ["normalize", "_lmax"]

    def __init__(self, irreps_out, normalize: bool, normalization: str = "integral", irreps_in=None) -> None:
        super().__init__()
        o3 = _o3()
        if normalization not in ("integral", "component", "norm"):
            raise InvalidArgumentError(f"normalization must be 'integral', 'component' or 'norm', got "
                                       f"{normalization!r}")
        try:  # e3nn's own checks of the irreps and parities, with its messages
            reference = o3.SphericalHarmonics(irreps_out, normalize, normalization, irreps_in)
        except (ValueError, AssertionError) as error:
            raise InvalidArgumentError(str(error)) from error
        self.normalize, self.normalization = bool(normalize), normalization
        self.irreps_in, self.irreps_out = reference.irreps_in, reference.irreps_out
        self._ls_list: List[int] = list(reference._ls_list)
        self._lmax = reference._lmax
        if self._lmax > MAX_L:
            raise NotImplementedError(f"SphericalHarmonics: degrees up to {MAX_L}, got lmax = {self._lmax}")
        constant, matrix = _coefficients(o3, self._ls_list, normalization, self._lmax)
        jacobian_constant, jacobian = _jacobian(matrix, self._lmax)
        for name, values in (("constant", constant), ("matrix", matrix), ("jacobian_constant", jacobian_constant),
                             ("jacobian", jacobian)):
            self.register_exact(name, values, torch.get_default_dtype())

    @classmethod
    def from_e3nn(cls, module: torch.nn.Module) -> "SphericalHarmonics":
        """The same harmonics as e3nn's ``module`` (an ``e3nn.o3.SphericalHarmonics``), in the dtype of the default
        dtype (``.to()`` moves it, from float64 coefficients).

        Raises:
            TypeError: ``module`` is not e3nn's ``o3.SphericalHarmonics``.
        """
        o3 = _o3()
        if not isinstance(module, o3.SphericalHarmonics):
            raise TypeError(f"module must be e3nn's o3.SphericalHarmonics, got {type(module).__module__}."
                            f"{type(module).__qualname__}")
        return cls(list(module._ls_list), module.normalize, module.normalization, module.irreps_in)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.irreps_out}, normalize={self.normalize}, "
                f"normalization={self.normalization!r})")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., 3]`` (floating point) -> ``[..., irreps_out.dim]`` in ``x``'s dtype and device.

        Raises:
            InvalidArgumentError: the last dimension of ``x`` is not 3.
        """
        if x.dim() < 1 or x.shape[-1] != 3:
            raise InvalidArgumentError(f"x: last dimension of shape {list(x.shape)} is not 3")
        lead = list(x.shape[:-1])
        u = x.reshape(-1, 3)
        if self.normalize:  # e3nn's: x / max(|x|, 1e-12)
            u = u / torch.linalg.vector_norm(u, dim=1, keepdim=True).clamp_min(1e-12)
        matrix, constant = self.matrix.to(x.dtype), self.constant.to(x.dtype)
        if torch.jit.is_scripting() or not u.requires_grad or self._traced():
            # (compiled graphs differentiate the plain form themselves, to any order, and fuse it)
            out = torch.addmm(constant, tensor_powers(u, self._lmax), matrix)
        else:
            out = self._differentiable(u, matrix, constant)
        return out.reshape(lead + [constant.shape[0]])

    @torch.jit.unused
    def _traced(self):
        return torch.compiler.is_compiling()

    @torch.jit.unused
    def _differentiable(self, u: torch.Tensor, matrix: torch.Tensor, constant: torch.Tensor) -> torch.Tensor:
        return _Harmonics.apply(u, matrix, constant, self.jacobian.to(u.dtype), self.jacobian_constant.to(u.dtype),
                                self._lmax)


def tensor_powers(u: torch.Tensor, degree: int) -> torch.Tensor:
    """``[rows, 3 + 9 + ... + 3^degree]``: ``u [rows, 3]``, ``u (x) u``, ... flattened (the last factor's index
    fastest) side by side; ``[rows, 0]`` for degree 0."""
    if degree < 1:
        return u[:, :0]
    powers: List[torch.Tensor] = [u]
    power = u
    for _ in range(1, degree):
        power = (power.unsqueeze(2) * u.unsqueeze(1)).reshape(u.shape[0], power.shape[1] * 3)
        powers.append(power)
    return torch.cat(powers, dim=1) if len(powers) > 1 else u


class _Harmonics(torch.autograd.Function):
    """``tensor_powers(u, lmax) @ matrix + constant``, whose gradient is the Jacobian's polynomials (one degree
    lower) as one matrix product, contracted with the output gradient: ``[rows, 3, dim]`` from
    ``tensor_powers(u, lmax - 1) @ jacobian + jacobian_constant``. The backward is built of differentiable
    operations on ``u``, so every further derivative is autograd's."""

    @staticmethod
    def forward(ctx, u, matrix, constant, jacobian, jacobian_constant, lmax: int):
        ctx.save_for_backward(u, jacobian, jacobian_constant)
        ctx.lmax = lmax
        return torch.addmm(constant, tensor_powers(u, lmax), matrix)

    @staticmethod
    def backward(ctx, grad):
        u, jacobian, jacobian_constant = ctx.saved_tensors
        rows, dim = grad.shape
        lower = tensor_powers(u, ctx.lmax - 1)
        if lower.shape[1]:
            d = torch.addmm(jacobian_constant, lower, jacobian)
        else:
            d = jacobian_constant.expand(rows, 3 * dim)
        # each row's [3, dim] Jacobian times its output gradient
        return torch.bmm(d.view(rows, 3, dim), grad.unsqueeze(2)).view(rows, 3), None, None, None, None, None


def _coefficients(o3, ls: List[int], normalization: str, lmax: int):
    """``(constant [dim], matrix [3 + 9 + ... + 3^lmax, dim])``, float64: each output column of e3nn's harmonics
    of ``ls`` as a combination of the tensor powers of the (unnormalized) vector, read off e3nn's polynomials by
    least squares on random vectors (exact for homogeneous polynomials of each degree; checked)."""
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(256, 3, generator=generator, dtype=torch.float64)
    offsets = _offsets(lmax)
    dim = sum(2 * l + 1 for l in ls)
    constant = torch.zeros(dim, dtype=torch.float64)
    matrix = torch.zeros(offsets[-1], dim, dtype=torch.float64)
    column = 0
    for l in ls:
        values = o3.spherical_harmonics(l, points, False, normalization)  # [points, 2l + 1], degree l
        if l == 0:
            constant[column] = values[0, 0]
        else:
            power = tensor_powers(points, l)[:, offsets[l - 1]:]
            fit = torch.linalg.lstsq(power, values, driver="gelsd").solution
            residual = (power @ fit - values).abs().max().item()
            if residual > 1e-10 * max(values.abs().max().item(), 1.0):
                raise RuntimeError(f"e3nn's harmonics of degree {l} are not polynomials of degree {l} here "
                                   f"(fit residual {residual:.2e})")
            matrix[offsets[l - 1]:offsets[l], column:column + 2 * l + 1] = fit
        column += 2 * l + 1
    return constant, matrix


def _jacobian(matrix: torch.Tensor, lmax: int):
    """``(jacobian_constant [3 * dim], jacobian [3 + ... + 3^(lmax - 1), 3 * dim])``, float64: the derivatives
    of ``tensor_powers(u, lmax) @ matrix`` by ``u_k`` (column ``k * dim + j``) as combinations of the tensor powers
    one degree lower. A power's column is a tuple ``(a_1, ..., a_l)`` (the last index fastest); its derivative by
    ``u_k`` is the sum over the positions ``i`` with ``a_i = k`` of the column of degree ``l - 1`` without
    ``a_i`` (the constant 1 at degree 1)."""
    dim = matrix.shape[1]
    starts = _offsets(lmax)
    constant = torch.zeros(3, dim, dtype=torch.float64)
    lower = torch.zeros(starts[lmax - 1] if lmax > 1 else 0, 3, dim, dtype=torch.float64)
    for l in range(1, lmax + 1):
        for column in range(3 ** l):
            digits = [(column // 3 ** (l - 1 - i)) % 3 for i in range(l)]
            row = matrix[starts[l - 1] + column]
            for i, k in enumerate(digits):
                rest = digits[:i] + digits[i + 1:]
                if not rest:
                    constant[k] += row
                else:
                    index = 0
                    for a in rest:
                        index = index * 3 + a
                    lower[starts[l - 2] + index, k] += row
    return constant.reshape(3 * dim), lower.reshape(lower.shape[0], 3 * dim)


def _offsets(lmax: int) -> List[int]:
    """Where each degree's columns start in :func:`tensor_powers` (degree ``l`` at ``[l - 1]``), and the total."""
    offsets = [0]
    for l in range(1, lmax + 1):
        offsets.append(offsets[-1] + 3 ** l)
    return offsets
