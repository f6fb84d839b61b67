"""The eager fast path (sparse_accumulation.ops.accumulate.eager) against the registered ops, and when each path is taken."""
import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation.ops.accumulate import registered as ops
from accumulation_helpers import CountOps, random_rule

KERNELS = ["numba", "torch"]


def _operands(generator, lead=(3, 4), M1=5, M2=3, O=6):
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=17)
    X1 = torch.randn(*lead, M1, generator=generator, dtype=torch.float64)
    X2 = torch.randn(*lead, M2, generator=generator, dtype=torch.float64)
    G = torch.randn(*lead, O, generator=generator, dtype=torch.float64)
    return X1, X2, C, m1, m2, mu, O, G


def _first_and_second_derivatives(forward, X1, X2, C, G):
    X1, X2, C = (t.detach().clone().requires_grad_() for t in (X1, X2, C))
    out = forward(X1, X2, C)
    grads = torch.autograd.grad(out, (X1, X2, C), G, create_graph=True)
    second = torch.autograd.grad(sum((g * g).sum() for g in grads), (X1, X2, C))
    return (out,) + grads + second


@pytest.mark.parametrize("implementation", KERNELS)
def test_eager_path_equals_registered_ops_bitwise(generator, implementation):
    """Same kernels, same derivative formulas: forward, gradients and second derivatives agree exactly."""
    X1, X2, C, m1, m2, mu, O, G = _operands(generator)

    def public(a, b, c):
        return sa.accumulate(a, b, mu, O, m1, m2, c, implementation=implementation)

    def registered(a, b, c):
        out = torch.ops.sparse_accumulation.accumulate_indexed(a.reshape(-1, 1, a.shape[-1]),
                                                               b.reshape(-1, 1, b.shape[-1]), c, m1, m2, mu, O,
                                                               implementation)
        return out.reshape(*a.shape[:-1], O)

    for got, want in zip(_first_and_second_derivatives(public, X1, X2, C, G),
                         _first_and_second_derivatives(registered, X1, X2, C, G)):
        assert torch.equal(got, want)


def test_plain_eager_calls_skip_the_dispatcher(generator, monkeypatch):
    X1, X2, C, m1, m2, mu, O, G = _operands(generator)
    expected = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation="numba")

    def fail(*args, **kwargs):
        raise AssertionError("the registered op was called in plain eager mode")

    monkeypatch.setattr(ops, "accumulate", fail)
    monkeypatch.setattr(ops, "accumulate_indexed", fail)
    X1.requires_grad_()
    out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation="numba")
    assert torch.equal(out, expected)
    # one autograd node for the whole call: no view nodes for the reshapes to and from [rows, M]
    assert [type(f).__name__ for f, _ in out.grad_fn.next_functions if f is not None] == ["AccumulateGrad"]
    out.backward(G)
    assert X1.grad is not None


def test_no_grad_calls_record_nothing(generator):
    X1, X2, C, m1, m2, mu, O, G = _operands(generator)
    X1.requires_grad_()
    with torch.no_grad():
        out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation="numba")
    assert out.grad_fn is None and not out.requires_grad


def test_dispatch_modes_see_the_registered_ops(generator):
    """Under a dispatch mode (FLOP counters, tracing) the call goes through the registered ops."""
    X1, X2, C, m1, m2, mu, O, G = _operands(generator)
    X1.requires_grad_()
    with CountOps() as mode:
        out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation="numba")
        out.backward(G)
    assert mode.calls == ["accumulate_indexed", "accumulate_indexed_backward"]
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(X1.shape[-1], X2.shape[-1]))
    with CountOps() as mode:
        sa.accumulate_rule(X1, X2, rule, C, implementation="numba").backward(G)
    assert mode.calls == ["accumulate", "accumulate_backward"]
