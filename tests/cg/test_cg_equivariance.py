"""Equivariance of real and e3nn coefficients under random rotations, and e3nn equality."""
import math

import numpy as np
import pytest
import sympy

import cg
from cg_test_helpers import fitted_real_wigner_d, fresh_rng, triples
from rotation_helpers import random_rotation, real_sph_harm


@pytest.fixture
def o3():
    """e3nn's ``o3`` module: the tests that compare with e3nn are skipped without it, the others run."""
    return pytest.importorskip("e3nn.o3")


def test_reference_harmonics_follow_design_convention():
    """The test's own real harmonics equal sqrt2 (-1)^m Re/Im Y_m built from sympy's Ynm."""
    rng, seed = fresh_rng()
    theta_s, phi_s = sympy.symbols("theta phi", real=True)
    for l in range(4):
        pts = rng.normal(size=(3, 3))
        pts /= np.linalg.norm(pts, axis=1, keepdims=True)
        ours = real_sph_harm(l, pts)
        for i, (x, y, z) in enumerate(pts):
            th, ph = math.acos(z), math.atan2(y, x)
            for m in range(-l, l + 1):
                am = abs(m)
                Y = complex(sympy.Ynm(l, am, theta_s, phi_s).expand(func=True).subs({theta_s: th, phi_s: ph}).evalf())
                ref = Y.real if m > 0 else (Y.imag if m < 0 else Y.real)
                if m != 0:
                    ref *= math.sqrt(2) * (-1) ** am
                assert ours[i, m + l] == pytest.approx(ref, abs=1e-12), (l, m, seed)


def _check_equivariance(C, D1, D2, DL, tol, msg):
    lhs = np.einsum("abc,ai,bj->ijc", C, D1, D2)
    rhs = np.einsum("cd,ijd->ijc", DL, C)
    np.testing.assert_allclose(lhs, rhs, atol=tol, err_msg=msg)


@pytest.mark.parametrize("lmax", [6])
def test_real_basis_equivariance(lmax):
    rng, seed = fresh_rng()
    for trial in range(2):
        rot = random_rotation(rng)
        D = {l: fitted_real_wigner_d(l, rot, rng) for l in range(2 * lmax + 1)}
        for l, d in D.items():  # the fit must be a genuine orthogonal representation
            np.testing.assert_allclose(d @ d.T, np.eye(2 * l + 1), atol=1e-10, err_msg=f"seed={seed}")
        for l1, l2, L in triples(lmax):
            C = cg.clebsch_gordan(l1, l2, L, basis="real")
            _check_equivariance(C, D[l1], D[l2], D[L], 1e-10, f"{(l1, l2, L)} seed={seed}")


def test_real_basis_fails_equivariance_when_broken():
    """Guard against a vacuous check: a sign-flipped coefficient is not equivariant."""
    rng, seed = fresh_rng()
    rot = random_rotation(rng)
    D = {l: fitted_real_wigner_d(l, rot, rng) for l in (1, 2)}
    C = cg.clebsch_gordan(2, 1, 2, basis="real")
    C[0, 0, 1] *= -1
    with pytest.raises(AssertionError):
        _check_equivariance(C, D[2], D[1], D[2], 1e-10, "")


def test_e3nn_basis_equivariance(o3):
    import torch

    rng, seed = fresh_rng()
    angles = torch.tensor(rng.uniform(0, 2 * np.pi, size=3), dtype=torch.float64)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn builds its generators in the default dtype
    try:
        D = {l: o3.wigner_D(l, *angles).numpy() for l in range(13)}
    finally:
        torch.set_default_dtype(previous)
    for l1, l2, L in triples(6):
        C = cg.clebsch_gordan(l1, l2, L, basis="e3nn")
        # e3nn's wigner_D (matrix exponentials) is accurate to about 1e-10: 1.6e-10 at worst over 60 random
        # rotations and every triple here
        _check_equivariance(C, D[l1], D[l2], D[L], 1e-9, f"{(l1, l2, L)} seed={seed}")


def test_e3nn_basis_equals_wigner_3j(o3):
    import torch

    for l1, l2, L in triples(4):
        ref = math.sqrt(2 * L + 1) * o3.wigner_3j(l1, l2, L, dtype=torch.float64).numpy()
        np.testing.assert_allclose(cg.clebsch_gordan(l1, l2, L, basis="e3nn"), ref, atol=1e-12, rtol=0)


def test_e3nn_exact_equals_wigner_3j(o3):
    import torch

    for l1, l2, L in triples(2):
        ref = math.sqrt(2 * L + 1) * o3.wigner_3j(l1, l2, L, dtype=torch.float64).numpy()
        exact = cg.clebsch_gordan(l1, l2, L, basis="e3nn", exact=True)
        np.testing.assert_allclose(exact.astype(float), ref, atol=1e-12, rtol=0)
