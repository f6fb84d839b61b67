"""Rotations for equivariance tests, built independently of the library: random rotations, real spherical
harmonics (Wikipedia convention, as DESIGN.md) from their Legendre definition, Condon-Shortley complex
harmonics from those, and Wigner D matrices fitted by least squares from ``Y(R x) = D Y(x)``."""
from __future__ import annotations

import math

import numpy as np


def random_rotation(rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def random_unit_vectors(rng, n: int) -> np.ndarray:
    v = rng.normal(size=(n, 3))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _legendre(lmax: int, x: np.ndarray) -> dict:
    """Associated Legendre P_l^m(x), 0 <= m <= l <= lmax, without the Condon-Shortley phase."""
    p = {}
    s = np.sqrt(np.clip(1.0 - x * x, 0.0, None))
    for m in range(lmax + 1):
        p[(m, m)] = math.prod(range(1, 2 * m, 2)) * s**m
        if m + 1 <= lmax:
            p[(m + 1, m)] = x * (2 * m + 1) * p[(m, m)]
        for l in range(m + 2, lmax + 1):
            p[(l, m)] = ((2 * l - 1) * x * p[(l - 1, m)] - (l + m - 1) * p[(l - 2, m)]) / (l - m)
    return p


def real_sph_harm(l: int, xyz: np.ndarray) -> np.ndarray:
    """Real harmonics ``(n, 2l+1)``, column ``m + l``: ``sqrt2 N P_l^|m| cos(m phi)`` (m > 0), ``sin`` (m < 0)."""
    x, y, z = xyz.T
    phi = np.arctan2(y, x)
    p = _legendre(l, z)
    out = np.empty((len(xyz), 2 * l + 1))
    for m in range(-l, l + 1):
        am = abs(m)
        norm = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - am) / math.factorial(l + am))
        if m > 0:
            out[:, m + l] = math.sqrt(2) * norm * p[(l, am)] * np.cos(am * phi)
        elif m < 0:
            out[:, m + l] = math.sqrt(2) * norm * p[(l, am)] * np.sin(am * phi)
        else:
            out[:, l] = norm * p[(l, 0)]
    return out


def complex_sph_harm(l: int, xyz: np.ndarray) -> np.ndarray:
    """Condon-Shortley ``Y_l^m`` from the real ones: ``Y^m = (-1)^m (R_m + i R_-m) / sqrt2``, m > 0."""
    r = real_sph_harm(l, xyz)
    out = np.empty(r.shape, dtype=np.complex128)
    out[:, l] = r[:, l]
    for m in range(1, l + 1):
        out[:, l + m] = (-1) ** m * (r[:, l + m] + 1j * r[:, l - m]) / math.sqrt(2)
        out[:, l - m] = (r[:, l + m] - 1j * r[:, l - m]) / math.sqrt(2)
    return out


def fitted_wigner_d(l: int, rot: np.ndarray, rng, kind: str = "real") -> np.ndarray:
    """D with ``Y(R x) = D Y(x)`` at random points, by least squares (``kind`` ``"real"`` or ``"complex"``)."""
    harmonics = real_sph_harm if kind == "real" else complex_sph_harm
    pts = random_unit_vectors(rng, 4 * (2 * l + 1) + 10)
    dt, *_ = np.linalg.lstsq(harmonics(l, pts), harmonics(l, pts @ rot.T), rcond=None)
    return dt.T
