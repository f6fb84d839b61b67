"""Independent references for the cg tests (no code shared with the cg package)."""
from __future__ import annotations


import numpy as np

from rotation_helpers import fitted_wigner_d


def fresh_rng():
    """A generator from fresh OS entropy, and its seed (for failure messages)."""
    seed = int(np.random.SeedSequence().entropy % 2**63)
    return np.random.default_rng(seed), seed


def fitted_real_wigner_d(l: int, rot: np.ndarray, rng) -> np.ndarray:
    """Real Wigner D of ``rot`` from least squares: Y(R x_i) = D Y(x_i) for random x_i."""
    return fitted_wigner_d(l, rot, rng, "real")


def triples(lmax: int):
    return [
        (l1, l2, L)
        for l1 in range(lmax + 1)
        for l2 in range(lmax + 1)
        for L in range(abs(l1 - l2), l1 + l2 + 1)
    ]
