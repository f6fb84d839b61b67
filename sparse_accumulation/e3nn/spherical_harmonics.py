"""e3nn's spherical harmonics ``o3.SphericalHarmonics`` as one matrix product of the vector's tensor powers.

A real spherical harmonic of degree ``l`` is a homogeneous polynomial of degree ``l`` in the vector's components,
so every output of e3nn's module is a fixed linear combination of the entries of ``u``, ``u (x) u``, ...,
``u (x) ... (x) u`` (``u`` the vector, normalized where asked). e3nn evaluates its polynomials term by term:
about 50 elementwise operations forward and 120 backward for ``lmax = 3`` (MACE's default), each a pass over the
edges, and on a GPU each a kernel launch. Here the tensor powers are built with one broadcast product per degree
and mapped to the outputs by one matrix product with a constant coefficient matrix: about 7 operations forward
and 20 backward, every derivative order by torch's autograd, so TorchScript, ``torch.compile`` and force training
work unchanged.

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
        self.register_exact("constant", constant, torch.get_default_dtype())
        self.register_exact("matrix", matrix, torch.get_default_dtype())

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
        powers: List[torch.Tensor] = [u]
        power = u
        for _ in range(1, self._lmax):
            power = (power.unsqueeze(2) * u.unsqueeze(1)).reshape(u.shape[0], power.shape[1] * 3)
            powers.append(power)
        features = torch.cat(powers, dim=1) if len(powers) > 1 else u
        matrix, constant = self.matrix.to(x.dtype), self.constant.to(x.dtype)
        return torch.addmm(constant, features, matrix).reshape(lead + [constant.shape[0]])


def _coefficients(o3, ls: List[int], normalization: str, lmax: int):
    """``(constant [dim], matrix [3 + 9 + ... + 3^lmax, dim])``, float64: each output column of e3nn's harmonics
    of ``ls`` as a combination of the tensor powers of the (unnormalized) vector, read off e3nn's polynomials by
    least squares on random vectors (exact for homogeneous polynomials of each degree; checked)."""
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(256, 3, generator=generator, dtype=torch.float64)
    offsets = [0]
    for l in range(1, max(lmax, 1) + 1):  # (degree 0 alone: the vector's columns, times zeros)
        offsets.append(offsets[-1] + 3 ** l)
    dim = sum(2 * l + 1 for l in ls)
    constant = torch.zeros(dim, dtype=torch.float64)
    matrix = torch.zeros(offsets[-1], dim, dtype=torch.float64)
    column = 0
    for l in ls:
        values = o3.spherical_harmonics(l, points, False, normalization)  # [points, 2l + 1], degree l
        if l == 0:
            constant[column] = values[0, 0]
        else:
            power = points
            for _ in range(1, l):
                power = (power.unsqueeze(2) * points.unsqueeze(1)).reshape(points.shape[0], -1)
            fit = torch.linalg.lstsq(power, values, driver="gelsd").solution
            residual = (power @ fit - values).abs().max().item()
            if residual > 1e-10 * max(values.abs().max().item(), 1.0):
                raise RuntimeError(f"e3nn's harmonics of degree {l} are not polynomials of degree {l} here "
                                   f"(fit residual {residual:.2e})")
            matrix[offsets[l - 1]:offsets[l], column:column + 2 * l + 1] = fit
        column += 2 * l + 1
    return constant, matrix
