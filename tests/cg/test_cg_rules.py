"""Flattened rules and the exact path of the real / e3nn bases."""
import numpy as np
import pytest
import sympy

import cg
from cg_test_helpers import fresh_rng, triples


@pytest.mark.parametrize("basis", ["real", "complex", "e3nn"])
def test_rules_sorted_clean_and_reconstruct(basis):
    for l1, l2, L in triples(6):
        m1, m2, mu, c = cg.transformation_rule(l1, l2, L, basis=basis)
        for arr in (m1, m2, mu):
            assert arr.dtype == np.int64
        assert c.dtype == np.float64
        assert len(m1) == len(m2) == len(mu) == len(c) > 0
        assert m1.min() >= 0 and m1.max() <= 2 * l1
        assert m2.min() >= 0 and m2.max() <= 2 * l2
        assert mu.min() >= 0 and mu.max() <= 2 * L
        keys = np.stack([mu, m1, m2], axis=1)
        # strictly increasing lexicographically by (mu, m1, m2): sorted and no duplicates
        diffs = np.diff(keys, axis=0)
        first_nonzero = diffs[np.arange(len(diffs)), np.argmax(diffs != 0, axis=1)]
        assert np.all(first_nonzero > 0)
        assert np.all(np.abs(c) >= 1e-15)
        dense = np.zeros((2 * l1 + 1, 2 * l2 + 1, 2 * L + 1))
        dense[m1, m2, mu] = c
        np.testing.assert_array_equal(dense, cg.clebsch_gordan(l1, l2, L, basis=basis))


def test_rule_applies_like_dense_contraction():
    rng, seed = fresh_rng()
    for l1, l2, L in [(2, 3, 4), (4, 4, 8), (5, 3, 2)]:
        x1 = rng.normal(size=(7, 2 * l1 + 1))
        x2 = rng.normal(size=(7, 2 * l2 + 1))
        m1, m2, mu, c = cg.transformation_rule(l1, l2, L)
        out = np.zeros((7, 2 * L + 1))
        for k in range(len(c)):
            out[:, mu[k]] += x1[:, m1[k]] * x2[:, m2[k]] * c[k]
        ref = np.einsum("abc,na,nb->nc", cg.clebsch_gordan(l1, l2, L), x1, x2)
        np.testing.assert_allclose(out, ref, atol=1e-12, err_msg=f"seed={seed}")


def _is_sign_sqrt_rational(x):
    if x == 0:
        return True
    sq = sympy.nsimplify(x**2)
    return sq.is_Rational and sq > 0 and sympy.simplify(x - sympy.sign(x) * sympy.sqrt(sq)) == 0


@pytest.mark.parametrize("basis", ["real", "complex", "e3nn"])
def test_exact_matches_float_and_is_sign_sqrt_rational(basis):
    for l1, l2, L in triples(3):
        exact = cg.clebsch_gordan(l1, l2, L, basis=basis, exact=True)
        num = cg.clebsch_gordan(l1, l2, L, basis=basis)
        assert exact.shape == num.shape and exact.dtype == object
        np.testing.assert_allclose(exact.astype(np.float64), num, atol=2e-16, rtol=2e-16)
        for value in exact.flat:
            assert _is_sign_sqrt_rational(value)


def test_exact_float_agree_at_l8():
    exact = cg.clebsch_gordan(8, 7, 9, basis="real", exact=True)
    num = cg.clebsch_gordan(8, 7, 9, basis="real")
    np.testing.assert_allclose(exact.astype(np.float64), num, atol=0, rtol=3e-16)
    assert (exact != 0).sum() == np.count_nonzero(num)


def test_exact_real_independent_of_float_path():
    """Exact real coefficients from sympy: complex CG transformed with exact U matrices."""
    from sympy.physics.wigner import clebsch_gordan as scg

    def U(l):
        u = sympy.zeros(2 * l + 1, 2 * l + 1)
        r2 = 1 / sympy.sqrt(2)
        u[l, l] = 1
        for m in range(1, l + 1):  # R_m = sqrt2 (-1)^m Re Y_m, R_-m = sqrt2 (-1)^m Im Y_m
            u[l + m, l + m] = (-1) ** m * r2
            u[l + m, l - m] = r2  # since Y_-m = (-1)^m conj(Y_m)
            u[l - m, l + m] = (-1) ** m * r2 / sympy.I
            u[l - m, l - m] = -r2 / sympy.I
        return u

    for l1, l2, L in [(1, 1, 1), (2, 1, 2), (2, 2, 3), (1, 2, 2)]:
        u1, u2, uL = U(l1), U(l2), U(L)
        phase = sympy.I if (l1 + l2 - L) % 2 else 1
        got = cg.clebsch_gordan(l1, l2, L, basis="real", exact=True)
        for a in range(2 * l1 + 1):
            for b in range(2 * l2 + 1):
                for c in range(2 * L + 1):
                    val = 0
                    for m1 in range(-l1, l1 + 1):
                        for m2 in range(-l2, l2 + 1):
                            M = m1 + m2
                            if abs(M) > L:
                                continue
                            val += (sympy.conjugate(u1[a, m1 + l1]) * sympy.conjugate(u2[b, m2 + l2])
                                    * uL[c, M + L] * scg(l1, l2, L, m1, m2, M))
                    val = sympy.nsimplify(sympy.expand(phase * val))
                    assert sympy.simplify(got[a, b, c] - val) == 0, (l1, l2, L, a, b, c)


def test_cache_cannot_be_corrupted():
    C = cg.clebsch_gordan(2, 2, 2)
    C[:] = 42.0
    assert cg.clebsch_gordan(2, 2, 2).max() < 1
    E = cg.clebsch_gordan(1, 1, 1, exact=True)
    E[0, 0, 0] = 42
    assert cg.clebsch_gordan(1, 1, 1, exact=True)[0, 0, 0] == 0
    m1, m2, mu, c = cg.transformation_rule(1, 1, 2)
    c[:] = 0
    assert np.all(cg.transformation_rule(1, 1, 2)[3] != 0)


def test_numpy_integers_accepted():
    a = cg.clebsch_gordan(np.int64(2), np.int32(1), np.uint8(2))
    np.testing.assert_array_equal(a, cg.clebsch_gordan(2, 1, 2))
    assert cg.transformation_rule(np.int16(1), 1, np.int64(0))[3].shape == (3,)
