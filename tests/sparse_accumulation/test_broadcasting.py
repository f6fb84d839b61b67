"""Broadcasting of the leading dimensions: values and gradients against the expanded float64 computation, the
row plan that reads shared operands in place, and clear errors for shapes that do not broadcast."""
import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation.kernels import layout
from accumulation_helpers import assert_close_to, random_rule

IMPLEMENTATIONS = ["numba", "torch", "index_add", "loops"]
# (X1 leading shape, X2 leading shape)
PATTERNS = [((6, 4), (6, 1)), ((6, 4), (4,)), ((6, 4), (1,)), ((1, 4), (6, 4)), ((6, 1), (1, 4)),
            ((2, 3, 4), (2, 1, 4)), ((5,), ())]


def _problem(generator, lead1, lead2, M1=4, M2=3, O=5):
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=14)
    X1 = torch.randn(*lead1, M1, generator=generator, dtype=torch.float64)
    X2 = torch.randn(*lead2, M2, generator=generator, dtype=torch.float64)
    return X1, X2, C, m1, m2, mu, O


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("lead1, lead2", PATTERNS)
def test_values_and_gradients_equal_the_expanded_computation(generator, implementation, lead1, lead2):
    X1, X2, C, m1, m2, mu, O = _problem(generator, lead1, lead2)
    lead = torch.broadcast_shapes(lead1, lead2)
    inputs = [t.clone().requires_grad_() for t in (X1, X2, C)]
    out = sa.accumulate(inputs[0], inputs[1], mu, O, m1, m2, inputs[2], implementation=implementation)
    assert out.shape == (*lead, O)
    # the reference sees expanded copies; autograd sums their gradients back to the inputs' shapes
    exact = [t.clone().requires_grad_() for t in (X1, X2, C)]
    expected = sa.reference.index_add(exact[0].expand(*lead, 4).contiguous(), exact[1].expand(*lead, 3).contiguous(),
                                      mu, O, m1, m2, exact[2])
    assert_close_to(out, expected, torch.float64)
    G = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, inputs, G), torch.autograd.grad(expected, exact, G)):
        assert got.shape == want.shape
        assert_close_to(got, want, torch.float64)


def test_second_derivatives_of_a_broadcast_operand(generator):
    X1, X2, C, m1, m2, mu, O = _problem(generator, (5, 3), (5, 1))
    inputs = [t.requires_grad_() for t in (X1, X2, C)]
    assert torch.autograd.gradgradcheck(lambda a, b, c: sa.accumulate(a, b, mu, O, m1, m2, c), inputs)


@pytest.mark.parametrize("lead1, lead2", PATTERNS[:5] + PATTERNS[6:])
def test_foldable_patterns_read_the_operands_in_place(lead1, lead2):
    X1, X2 = torch.randn(*lead1, 4), torch.randn(*lead2, 3)
    operands, rows = layout.plan((X1, X2), ("X1", "X2"))
    assert operands[0] is X1 and operands[1] is X2, "an operand was copied"
    assert rows.A * rows.B == X1.new_empty(torch.broadcast_shapes(lead1, lead2)).numel()
    for t, (a, b, s_a, s_b) in zip((X1, X2), rows.operands):
        assert a in (1, rows.A) and b in (1, rows.B)
        assert (s_a == 0) == (a == 1) or rows.A == 1


def test_patterns_that_do_not_fold_are_expanded_and_still_right(generator):
    """[A, 1, C] against [A, B, C] folds into no two dimensions: the broadcast operand is expanded first."""
    X1, X2, C, m1, m2, mu, O = _problem(generator, (2, 3, 4), (2, 1, 4))
    operands, rows = layout.plan((X1, X2), ("X1", "X2"))
    assert operands[0] is X1 and operands[1] is not X2 and operands[1].shape[:-1] == (2, 3, 4)
    X2.requires_grad_()
    out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation="numba")
    (grad,) = torch.autograd.grad(out.sum(), X2)
    (expected,) = torch.autograd.grad(sa.reference.loops(X1, X2, mu, O, m1, m2, C).sum(), X2)
    assert_close_to(grad, expected, torch.float64)


def test_shapes_that_do_not_broadcast_raise(generator):
    X1, X2, C, m1, m2, mu, O = _problem(generator, (6, 4), (5, 4))
    with pytest.raises(ValueError, match=r"X1 \(6, 4, 4\), X2 \(5, 4, 3\) do not broadcast"):
        sa.accumulate(X1, X2, mu, O, m1, m2, C)
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(4, 3))
    with pytest.raises(ValueError, match="do not broadcast"):
        sa.accumulate_rule(X1, X2, rule, C)
