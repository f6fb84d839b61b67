"""torch.library.opcheck on every registered op, and torch.compile(fullgraph=True) without graph breaks."""
import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import assert_close_to, random_rule

KERNELS = ["numba", "torch"]


def _operands(generator, permuted, requires_grad, rows=6, M1=4, M2=3, O=5):
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=15)
    if permuted:
        X1 = torch.randn(M1, rows, generator=generator, dtype=torch.float64).T
        X2 = torch.randn(M2, rows, generator=generator, dtype=torch.float64).T
    else:
        X1 = torch.randn(rows, M1, generator=generator, dtype=torch.float64)
        X2 = torch.randn(rows, M2, generator=generator, dtype=torch.float64)
    for t in (X1, X2, C):
        t.requires_grad_(requires_grad)
    return X1, X2, C, m1, m2, mu, O


@pytest.mark.parametrize("implementation", KERNELS)
@pytest.mark.parametrize("permuted", [False, True])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_indexed_ops(generator, implementation, permuted, requires_grad):
    X1, X2, C, m1, m2, mu, O = _operands(generator, permuted, requires_grad)
    X1, X2 = X1.unsqueeze(1), X2.unsqueeze(1)
    torch.library.opcheck(torch.ops.sparse_accumulation.accumulate_indexed.default,
                          (X1, X2, C, m1, m2, mu, O, implementation))
    G = torch.randn(X1.shape[0], 1, O, generator=generator, dtype=torch.float64).requires_grad_(requires_grad)
    for wanted in ((True, True, True), (True, False, False), (False, True, True), (False, False, True)):
        torch.library.opcheck(torch.ops.sparse_accumulation.accumulate_indexed_backward.default,
                              (G, X1, X2, C, m1, m2, mu, implementation, *wanted))


@pytest.mark.parametrize("implementation", ["auto", "torch"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_rule_ops(generator, implementation, weighted, requires_grad):
    """The rule ops on broadcast 3-D operands: X1 [A, B, M1], X2 [A, 1, M2] and W [1, B, Mw]."""
    A, B, M1, M2, Mw, O, nnz = 3, 4, 4, 3, 2, 5, 15
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=nnz)
    w = torch.randint(0, Mw, (nnz,), generator=generator) if weighted else None
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(M1, M2), w=w, weight_size=Mw if weighted else None)
    X1 = torch.randn(A, B, M1, generator=generator, dtype=torch.float64)
    X2 = torch.randn(A, 1, M2, generator=generator, dtype=torch.float64)
    W = torch.randn(1, B, Mw, generator=generator, dtype=torch.float64) if weighted else None
    for t in (X1, X2, C, W):
        if t is not None:
            t.requires_grad_(requires_grad)
    torch.library.opcheck(torch.ops.sparse_accumulation.accumulate.default, (X1, X2, W, C, rule.key, implementation))
    G = torch.randn(A, B, O, generator=generator, dtype=torch.float64).requires_grad_(requires_grad)
    for wanted in ((True, True, True, True), (True, False, False, False), (False, True, weighted, True),
                   (False, False, False, True)):
        torch.library.opcheck(torch.ops.sparse_accumulation.accumulate_backward.default,
                              (G, X1, X2, W, C, rule.key, implementation, *wanted))


@pytest.mark.parametrize("implementation", KERNELS)
def test_compile_fullgraph_forward_and_backward(generator, implementation):
    torch._dynamo.reset()
    m1, m2, mu, C = random_rule(generator, 5, 4, 6, nnz=20)
    C.requires_grad_()

    def model(X1, X2, C):
        out = sa.accumulate(X1.sin(), X2, mu, 6, m1, m2, C, implementation=implementation)
        return (out * out).sum(dim=-1)

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for rows in (7, 13):
        X1 = torch.randn(rows, 5, generator=generator, dtype=torch.float64, requires_grad=True)
        X2 = torch.randn(rows, 4, generator=generator, dtype=torch.float64, requires_grad=True)
        expected = model(X1, X2, C)
        got = compiled(X1, X2, C)
        assert_close_to(got, expected, torch.float64)
        G = torch.randn(rows, generator=generator, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad(got, (X1, X2, C), G), torch.autograd.grad(expected, (X1, X2, C), G)):
            assert_close_to(a, b, torch.float64)


def test_compile_inductor_module(generator):
    """The default backend (inductor) compiles a module using the op; results match eager."""
    torch._dynamo.reset()
    module = sa.CGCalculatorSingle(2, 1, 2, dtype=torch.float64)
    compiled = torch.compile(module, fullgraph=True)
    X1 = torch.randn(11, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    X2 = torch.randn(11, 3, generator=generator, dtype=torch.float64)
    got, expected = compiled(X1, X2), module(X1, X2)
    assert_close_to(got, expected, torch.float64)
    assert_close_to(torch.autograd.grad(got.sum(), X1)[0], torch.autograd.grad(expected.sum(), X1)[0],
                    torch.float64)


def test_compiled_tensor_api_holds_the_traced_rule_and_checks_the_indices(generator):
    """Compiled, the tensor API reads its index tensors when the graph is traced (range checks included) and the
    graph holds their rule; called later with other index values, it raises instead of using the old rule."""
    torch._dynamo.reset()
    m1, m2, mu, C = random_rule(generator, 3, 3, 3, nnz=8)
    compiled = torch.compile(lambda X1, X2, mu: sa.accumulate(X1, X2, mu, 3, m1, m2, C), fullgraph=True,
                             backend="aot_eager")
    X = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(compiled(X, X, mu), sa.accumulate(X, X, mu, 3, m1, m2, C), rtol=1e-12, atol=1e-12)
    other = mu.clone()
    other[0] = (other[0] + 1) % 3
    with pytest.raises(RuntimeError, match="m1, m2, mu changed since the compiled graph was traced"):
        compiled(X, X, other)
    bad = mu.clone()
    bad[0] = 3
    with pytest.raises(IndexError, match="mu contains index 3"):
        torch.compile(lambda X1, X2, mu: sa.accumulate(X1, X2, mu, 3, m1, m2, C), fullgraph=True,
                      backend="aot_eager")(X, X, bad)


def test_double_backward_under_compile_fails_loudly(generator):
    """torch.compile (AOTAutograd) has no double backward: force-style training must raise, not return wrong values."""
    torch._dynamo.reset()
    m1, m2, mu, C = random_rule(generator, 3, 3, 3, nnz=8)
    C.requires_grad_()
    compiled = torch.compile(lambda X1, X2, C: sa.accumulate(X1, X2, mu, 3, m1, m2, C).pow(2).sum(),
                             fullgraph=True, backend="aot_eager")
    X1 = torch.randn(4, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    X2 = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    (forces,) = torch.autograd.grad(compiled(X1, X2, C), X1, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        forces.pow(2).sum().backward()
