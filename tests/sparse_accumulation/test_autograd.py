"""Gradients with respect to X1, X2 and C: first and second order, against finite differences and references."""
import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import assert_close_to, random_rule

KERNELS = ["numba", "torch"]


def _problem(generator, lead=(4, 3), M1=4, M2=5, O=6, nnz=24):
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=nnz)
    X1 = torch.randn(*lead, M1, generator=generator, dtype=torch.float64, requires_grad=True)
    X2 = torch.randn(*lead, M2, generator=generator, dtype=torch.float64, requires_grad=True)
    return X1, X2, C.requires_grad_(), (m1, m2, mu, O)


@pytest.mark.parametrize("implementation", KERNELS)
def test_gradcheck_and_gradgradcheck(generator, implementation):
    X1, X2, C, (m1, m2, mu, O) = _problem(generator)

    def f(a, b, c):
        return sa.accumulate(a, b, mu, O, m1, m2, c, implementation=implementation)

    assert torch.autograd.gradcheck(f, (X1, X2, C))
    assert torch.autograd.gradgradcheck(f, (X1, X2, C))


@pytest.mark.parametrize("implementation", KERNELS)
@pytest.mark.parametrize("layout", ["first", "middle"])
def test_gradcheck_other_layouts(generator, implementation, layout):
    X1, X2, C, (m1, m2, mu, O) = _problem(generator, lead=(3, 2))
    function = sa.accumulate_active_dim_first if layout == "first" else sa.accumulate_active_dim_middle
    dim = 0 if layout == "first" else 1
    a, b = (X.detach().movedim(-1, dim).contiguous().requires_grad_() for X in (X1, X2))

    def f(a, b, c):
        return function(a, b, mu, O, m1, m2, c, implementation=implementation)

    assert torch.autograd.gradcheck(f, (a, b, C))
    assert torch.autograd.gradgradcheck(f, (a, b, C))


@pytest.mark.parametrize("implementation", KERNELS)
def test_partial_requires_grad(generator, implementation):
    """Only the inputs that require grad get gradients; each matches the reference's."""
    X1, X2, C, (m1, m2, mu, O) = _problem(generator)
    for wanted in ((X1,), (X2,), (C,), (X1, C), (X2, C)):
        inputs = [t.detach().requires_grad_(any(t is w for w in wanted)) for t in (X1, X2, C)]
        G = torch.randn(*X1.shape[:-1], O, generator=generator, dtype=torch.float64)
        out = sa.accumulate(inputs[0], inputs[1], mu, O, m1, m2, inputs[2], implementation=implementation)
        grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad], G)
        ref_inputs = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
        ref = sa.reference.loops(ref_inputs[0], ref_inputs[1], mu, O, m1, m2, ref_inputs[2])
        ref_grads = torch.autograd.grad(ref, [t for t in ref_inputs if t.requires_grad], G)
        for got, expected in zip(grads, ref_grads):
            assert_close_to(got, expected, torch.float64)


@pytest.mark.parametrize("implementation", KERNELS)
def test_double_backward_like_force_training(generator, implementation):
    """Energy -> forces with create_graph, then a loss on forces: second derivatives match the reference."""
    X1, X2, C, (m1, m2, mu, O) = _problem(generator)

    def second_order(function):
        a, b, c = (t.detach().requires_grad_() for t in (X1, X2, C))
        energy = (function(a, b, mu, O, m1, m2, c) ** 2).sum()
        force_a, force_b = torch.autograd.grad(energy, (a, b), create_graph=True)
        loss = (force_a ** 2).sum() + (force_b * b).sum()
        return torch.autograd.grad(loss, (a, b, c))

    def ours(*args):
        return sa.accumulate(*args, implementation=implementation)

    for got, expected in zip(second_order(ours), second_order(sa.reference.index_add)):
        assert_close_to(got, expected, torch.float64)


def test_third_order_matches_reference(generator):
    """The backward of the backward is built from the same ops, so third derivatives exist and are right."""
    X1, X2, C, (m1, m2, mu, O) = _problem(generator, lead=(5,), M1=3, M2=3, O=3, nnz=10)

    def third(function):
        a, b, c = (t.detach().requires_grad_() for t in (X1, X2, C))
        y = function(a, b, mu, O, m1, m2, c).pow(2).sum()
        (ga,) = torch.autograd.grad(y, a, create_graph=True)
        (gga,) = torch.autograd.grad(ga.sin().sum(), b, create_graph=True)
        return torch.autograd.grad(gga.pow(2).sum(), (a, b, c))

    for got, expected in zip(third(sa.accumulate), third(sa.reference.loops)):
        assert_close_to(got, expected, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_gradients(generator, dtype):
    """Gradients in float32/16-bit agree with float64 gradients of the rounded inputs."""
    m1, m2, mu, C = random_rule(generator, 5, 5, 5, nnz=30, dtype=dtype)
    X1 = torch.randn(64, 5, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
    X2 = torch.randn(64, 5, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
    C.requires_grad_()
    G = torch.randn(64, 5, generator=generator, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad(sa.accumulate(X1, X2, mu, 5, m1, m2, C), (X1, X2, C), G)
    exact = [t.detach().double().requires_grad_() for t in (X1, X2, C)]
    ref = torch.autograd.grad(sa.reference.loops(exact[0], exact[1], mu, 5, m1, m2, exact[2]), exact, G.double())
    for got, expected in zip(grads, ref):
        assert got.dtype == dtype
        assert_close_to(got, expected, dtype)
