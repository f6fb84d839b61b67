"""The sample values of DESIGN.md, in the dense array and in the flattened rule."""
import math

import numpy as np
import pytest

import cg

S3, S2, S6 = 1 / math.sqrt(3), 1 / math.sqrt(2), 1 / math.sqrt(6)

# (l1, l2, L): [(m1, m2, mu, C)] with m values NOT offset, exactly as in DESIGN.md
SAMPLES = {
    (1, 1, 0): [(-1, -1, 0, -0.57735), (0, 0, 0, -0.57735), (1, 1, 0, -0.57735)],
    (1, 1, 1): [(-1, 0, 1, -0.707107), (-1, 1, 0, 0.707107), (0, -1, 1, 0.707107)],
    (2, 1, 2): [(-2, -1, -1, -0.408248), (-2, 0, 2, -0.816497), (-1, 1, 0, 0.707107)],
}
# the closed forms those printed decimals stand for
EXACT = {-0.57735: -S3, -0.707107: -S2, 0.707107: S2, -0.408248: -S6, -0.816497: -2 * S6}


@pytest.mark.parametrize("triple", list(SAMPLES))
def test_design_samples_dense(triple):
    l1, l2, L = triple
    C = cg.clebsch_gordan(l1, l2, L, basis="real")
    for m1, m2, mu, value in SAMPLES[triple]:
        got = C[m1 + l1, m2 + l2, mu + L]
        assert got == pytest.approx(value, abs=1e-6)
        assert got == pytest.approx(EXACT[value], rel=3e-16, abs=0)


@pytest.mark.parametrize("triple", list(SAMPLES))
def test_design_samples_in_rule(triple):
    l1, l2, L = triple
    m1, m2, mu, c = cg.transformation_rule(l1, l2, L, basis="real")
    entries = {(a - l1, b - l2, u - L): v for a, b, u, v in zip(m1, m2, mu, c)}
    for s1, s2, smu, value in SAMPLES[triple]:
        assert (s1, s2, smu) in entries
        assert np.sign(entries[(s1, s2, smu)]) == np.sign(value)
        assert entries[(s1, s2, smu)] == pytest.approx(value, abs=1e-6)


def test_rule_110_is_exactly_the_samples():
    # the scalar coupling of two vectors is -x.y/sqrt(3): exactly three entries
    m1, m2, mu, c = cg.transformation_rule(1, 1, 0)
    assert m1.tolist() == [0, 1, 2] and m2.tolist() == [0, 1, 2] and mu.tolist() == [0, 0, 0]
    np.testing.assert_allclose(c, [-S3] * 3, rtol=3e-16, atol=0)


def test_rule_111_is_a_cross_product():
    # (1,1,1) is -/+ cross product / sqrt2: antisymmetric with six entries
    C = cg.clebsch_gordan(1, 1, 1)
    np.testing.assert_array_equal(C, -C.transpose(1, 0, 2))
    assert np.count_nonzero(C) == 6


def test_exact_samples():
    C = cg.clebsch_gordan(2, 1, 2, basis="real", exact=True)
    import sympy

    assert C[0, 0, 1] == -sympy.sqrt(6) / 6
    assert C[0, 1, 4] == -sympy.sqrt(6) / 3
    assert C[1, 2, 2] == sympy.sqrt(2) / 2
