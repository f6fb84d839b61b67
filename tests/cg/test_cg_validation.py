"""Every invalid argument raises ValueError naming the argument."""
import numpy as np
import pytest

import cg


@pytest.mark.parametrize("func", [cg.clebsch_gordan, cg.transformation_rule])
@pytest.mark.parametrize(
    "args,match",
    [
        ((-1, 1, 1), r"l1 must be a non-negative integer, got -1"),
        ((1, -2, 1), r"l2 must be a non-negative integer, got -2"),
        ((1, 1, -1), r"L must be a non-negative integer, got -1"),
        ((1.5, 1, 1), r"l1 must be a non-negative integer, got 1.5"),
        ((2.0, 1, 1), r"l1 must be a non-negative integer, got 2.0"),
        ((1, "2", 2), r"l2 must be a non-negative integer, got '2'"),
        ((True, 1, 1), r"l1 must be a non-negative integer, got True"),
        ((1, 1, np.bool_(True)), r"L must be a non-negative integer"),
        ((1, None, 1), r"l2 must be a non-negative integer, got None"),
        ((1, 1, 5), r"L=5 is outside \|l1-l2\|\.\.l1\+l2 = 0\.\.2"),
        ((4, 1, 2), r"L=2 is outside \|l1-l2\|\.\.l1\+l2 = 3\.\.5"),
    ],
)
def test_invalid_l(func, args, match):
    with pytest.raises(ValueError, match=match):
        func(*args)


@pytest.mark.parametrize("bad", ["Real", "spherical", "", None, 3])
def test_invalid_basis(bad):
    for call in (
        lambda: cg.clebsch_gordan(1, 1, 1, basis=bad),
        lambda: cg.transformation_rule(1, 1, 1, basis=bad),
        lambda: cg.CoefficientTable.build(1, basis=bad),
        lambda: cg.load_precomputed(bad, 2),
    ):
        with pytest.raises(ValueError, match=r"basis must be one of 'real', 'complex', 'e3nn'"):
            call()


@pytest.mark.parametrize("bad", [-1, 1.0, "3", True])
def test_invalid_lmax(bad):
    with pytest.raises(ValueError, match="lmax must be a non-negative integer"):
        cg.CoefficientTable.build(bad)
    with pytest.raises(ValueError, match="lmax must be a non-negative integer"):
        cg.load_precomputed("real", bad)


def test_table_rule_errors():
    table = cg.load_precomputed("real", 2)
    with pytest.raises(ValueError, match="L=4 is outside"):
        table.rule(1, 1, 4)
    with pytest.raises(KeyError, match="not in this table"):
        table.rule(3, 1, 2)
    with pytest.raises(ValueError, match="exceeds"):
        table.truncate(3)


def test_exact_flag_errors_too():
    with pytest.raises(ValueError, match="l1 must be"):
        cg.clebsch_gordan(-3, 1, 1, exact=True)
