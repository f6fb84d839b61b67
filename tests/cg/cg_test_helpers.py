"""Independent references for the cg tests (no code shared with the cg package)."""
from __future__ import annotations

import math

import numpy as np


def fresh_rng():
    """A generator from fresh OS entropy, and its seed (for failure messages)."""
    seed = int(np.random.SeedSequence().entropy % 2**63)
    return np.random.default_rng(seed), seed


def random_rotation(rng) -> np.ndarray:
    """Haar-ish random proper rotation matrix (QR of a Gaussian matrix)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def random_unit_vectors(rng, n: int) -> np.ndarray:
    v = rng.normal(size=(n, 3))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _legendre_no_cs(lmax: int, x: np.ndarray) -> dict:
    """Associated Legendre functions P_l^m(x), 0 <= m <= l <= lmax, WITHOUT the (-1)^m phase."""
    p = {}
    s = np.sqrt(np.clip(1.0 - x * x, 0.0, None))
    for m in range(lmax + 1):
        dfact = 1.0
        for k in range(1, 2 * m, 2):
            dfact *= k
        p[(m, m)] = dfact * s**m
        if m + 1 <= lmax:
            p[(m + 1, m)] = x * (2 * m + 1) * p[(m, m)]
        for l in range(m + 2, lmax + 1):
            p[(l, m)] = ((2 * l - 1) * x * p[(l - 1, m)] - (l + m - 1) * p[(l - 2, m)]) / (l - m)
    return p


def real_sph_harm(l: int, xyz: np.ndarray) -> np.ndarray:
    """Real spherical harmonics (Wikipedia convention) at unit vectors ``xyz`` (n, 3).

    Returns (n, 2l+1), column ``m + l``; for m > 0 ``sqrt2 N P_l^m cos(m phi)``,
    for m < 0 ``sqrt2 N P_l^|m| sin(|m| phi)`` (no Condon-Shortley phase).
    """
    x, y, z = xyz.T
    phi = np.arctan2(y, x)
    p = _legendre_no_cs(l, z)
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


def fitted_real_wigner_d(l: int, rot: np.ndarray, rng) -> np.ndarray:
    """Real Wigner D of ``rot`` from least squares: Y(R x_i) = D Y(x_i) for random x_i."""
    pts = random_unit_vectors(rng, 4 * (2 * l + 1) + 10)
    y0 = real_sph_harm(l, pts)
    y1 = real_sph_harm(l, pts @ rot.T)
    dt, *_ = np.linalg.lstsq(y0, y1, rcond=None)
    return dt.T


def triples(lmax: int):
    return [
        (l1, l2, L)
        for l1 in range(lmax + 1)
        for l2 in range(lmax + 1)
        for L in range(abs(l1 - l2), l1 + l2 + 1)
    ]
