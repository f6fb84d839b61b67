"""Complex (Condon-Shortley) coefficients against sympy.physics.wigner."""
import numpy as np
import pytest
import sympy
from sympy.physics.wigner import clebsch_gordan as sympy_cg

import cg
from cg_test_helpers import triples

LMAX_SYMPY = 6


@pytest.mark.parametrize("l1", range(LMAX_SYMPY + 1))
def test_complex_matches_sympy(l1):
    for _, l2, L in (t for t in triples(LMAX_SYMPY) if t[0] == l1):
        C = cg.clebsch_gordan(l1, l2, L, basis="complex")
        assert C.shape == (2 * l1 + 1, 2 * l2 + 1, 2 * L + 1) and C.dtype == np.float64
        allowed = np.zeros(C.shape, dtype=bool)
        for m1 in range(-l1, l1 + 1):
            for m2 in range(-l2, l2 + 1):
                M = m1 + m2
                if abs(M) > L:
                    continue
                allowed[m1 + l1, m2 + l2, M + L] = True
                ref = float(sympy_cg(l1, l2, L, m1, m2, M))
                assert C[m1 + l1, m2 + l2, M + L] == pytest.approx(ref, abs=1e-14), (l1, l2, L, m1, m2)
        assert np.all(C[~allowed] == 0.0)


@pytest.mark.parametrize("l1,l2,L", triples(3))
def test_complex_exact_equals_sympy(l1, l2, L):
    C = cg.clebsch_gordan(l1, l2, L, basis="complex", exact=True)
    assert C.dtype == object
    for m1 in range(-l1, l1 + 1):
        for m2 in range(-l2, l2 + 1):
            for M in range(-L, L + 1):
                ref = sympy_cg(l1, l2, L, m1, m2, M) if M == m1 + m2 else sympy.Integer(0)
                got = C[m1 + l1, m2 + l2, M + L]
                assert isinstance(got, sympy.Expr)
                assert sympy.simplify(got - ref) == 0, (l1, l2, L, m1, m2, M, got, ref)
                assert got == ref  # same canonical form, not just numerically equal


def test_complex_known_values():
    # <1/2 ...> is not supported; a few classic integer-spin values by hand
    C = cg.clebsch_gordan(1, 1, 0, basis="complex")
    s3 = 1 / np.sqrt(3)
    assert C[2, 0, 0] == pytest.approx(s3) and C[1, 1, 0] == pytest.approx(-s3) and C[0, 2, 0] == pytest.approx(s3)
    C = cg.clebsch_gordan(1, 1, 2, basis="complex")
    assert C[2, 2, 4] == 1.0 and C[2, 1, 3] == pytest.approx(np.sqrt(0.5))
