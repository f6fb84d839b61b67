"""Property tests (hypothesis): random shapes, rules and layouts agree with the float64 oracle."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparse_accumulation as sa
from accumulation_helpers import assert_close_to, oracle


@st.composite
def problems(draw):
    M1, M2, O = (draw(st.integers(1, 9)) for _ in range(3))
    nnz = draw(st.integers(0, 60))
    lead = tuple(draw(st.lists(st.integers(0, 6), max_size=3)))
    seed = draw(st.integers(0, 2**32 - 1))
    g = torch.Generator().manual_seed(seed)
    m1, m2, mu = (torch.randint(0, size, (nnz,), generator=g) for size in (M1, M2, O))
    C = torch.randn(nnz, generator=g, dtype=torch.float64)
    X1 = torch.randn(*lead, M1, generator=g, dtype=torch.float64)
    X2 = torch.randn(*lead, M2, generator=g, dtype=torch.float64)
    return X1, X2, mu, O, m1, m2, C


@settings(max_examples=60, deadline=None)
@given(problem=problems(), implementation=st.sampled_from(["numba", "torch"]))
def test_any_shape_and_rule_matches_oracle(problem, implementation):
    X1, X2, mu, O, m1, m2, C = problem
    out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation=implementation)
    assert out.shape == X1.shape[:-1] + (O,)
    assert_close_to(out, oracle(X1, X2, mu, O, m1, m2, C), torch.float64)


@settings(max_examples=30, deadline=None)
@given(problem=problems())
def test_gradients_match_reference(problem):
    X1, X2, mu, O, m1, m2, C = problem
    inputs = [t.clone().requires_grad_() for t in (X1, X2, C)]
    reference_inputs = [t.clone().requires_grad_() for t in (X1, X2, C)]
    G = torch.randn(*X1.shape[:-1], O, dtype=torch.float64)
    got = torch.autograd.grad(sa.accumulate(inputs[0], inputs[1], mu, O, m1, m2, inputs[2]), inputs, G)
    expected = torch.autograd.grad(
        sa.reference.index_add(reference_inputs[0], reference_inputs[1], mu, O, m1, m2, reference_inputs[2]),
        reference_inputs, G, allow_unused=True, materialize_grads=True)
    for a, b in zip(got, expected):
        assert_close_to(a, b, torch.float64)


@settings(max_examples=30, deadline=None)
@given(problem=problems())
def test_layouts_agree(problem):
    X1, X2, mu, O, m1, m2, C = problem
    last = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    first = sa.accumulate_active_dim_first(X1.movedim(-1, 0), X2.movedim(-1, 0), mu, O, m1, m2, C)
    torch.testing.assert_close(first, last.movedim(-1, 0), rtol=0, atol=0)
    if X1.dim() >= 2:
        middle = sa.accumulate_active_dim_middle(X1.movedim(-1, 1), X2.movedim(-1, 1), mu, O, m1, m2, C)
        torch.testing.assert_close(middle, last.movedim(-1, 1), rtol=0, atol=0)
