"""The public API on CUDA tensors (Triton kernels): values, gradients, layouts, opcheck and torch.compile.

Skipped without a CUDA device; run on the lent GPU machine (see benchmarks/RESULTS.md).
"""
import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import assert_close_to, oracle, random_rule

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _problem(generator, dtype, lead=(40, 3), M1=5, M2=4, O=6, nnz=30):
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=nnz, dtype=dtype)
    X1 = torch.randn(*lead, M1, generator=generator, dtype=torch.float64).to(dtype)
    X2 = torch.randn(*lead, M2, generator=generator, dtype=torch.float64).to(dtype)
    return [t.cuda() for t in (X1, X2, mu, m1, m2, C)], O


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_values_and_layouts(generator, dtype):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, dtype)
    assert sa.is_available("triton", "cuda")
    expected = oracle(X1, X2, mu, O, m1, m2, C)
    out = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    assert out.is_cuda and out.dtype == dtype
    assert_close_to(out, expected, dtype)
    first = sa.accumulate_active_dim_first(X1.movedim(-1, 0).contiguous(), X2.movedim(-1, 0).contiguous(),
                                           mu, O, m1, m2, C)
    assert_close_to(first, expected.movedim(-1, 0), dtype)
    middle = sa.accumulate_active_dim_middle(X1.movedim(-1, 1).contiguous(), X2.movedim(-1, 1).contiguous(),
                                             mu, O, m1, m2, C)
    assert_close_to(middle, expected.movedim(-1, 1), dtype)


def test_gradients_to_second_order(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float64, lead=(6,))
    inputs = [t.requires_grad_() for t in (X1, X2, C)]

    def f(a, b, c):
        return sa.accumulate(a, b, mu, O, m1, m2, c)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_large_rows_fp32_gradients_match_reference(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float32, lead=(300, 170))
    X1.requires_grad_()
    X2.requires_grad_()
    G = torch.randn(300, 170, O, device="cuda")
    got = torch.autograd.grad(sa.accumulate(X1, X2, mu, O, m1, m2, C), (X1, X2), G)
    exact = [t.detach().double().requires_grad_() for t in (X1, X2)]
    expected = torch.autograd.grad(sa.reference.index_add(exact[0], exact[1], mu, O, m1, m2, C.double()), exact,
                                   G.double())
    for a, b in zip(got, expected):
        assert_close_to(a, b, torch.float32)
    again = torch.autograd.grad(sa.accumulate(X1, X2, mu, O, m1, m2, C), (X1, X2), G)
    assert all(torch.equal(a, b) for a, b in zip(got, again)), "results must be deterministic"


def test_opcheck_on_cuda(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float64, lead=(9,))
    for permuted in (False, True):
        a = X1.T.contiguous().T if permuted else X1
        for requires_grad in (False, True):
            args = [t.detach().requires_grad_(requires_grad) for t in (a, X2, C)]
            torch.library.opcheck(torch.ops.sparse_accumulation.accumulate.default,
                                  (args[0], args[1], args[2], m1, m2, mu, O, "triton"))
            G = torch.randn(9, O, device="cuda", dtype=torch.float64)
            torch.library.opcheck(torch.ops.sparse_accumulation.accumulate_backward.default,
                                  (G, args[0], args[1], args[2], m1, m2, mu, "triton", True, True, True))


def test_compile_fullgraph_on_cuda(generator):
    torch._dynamo.reset()
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float32, lead=(64,))

    def model(a, b):
        return sa.accumulate(a.sin(), b, mu, O, m1, m2, C).square().sum(-1)

    compiled = torch.compile(model, fullgraph=True)
    X1.requires_grad_()
    got, expected = compiled(X1, X2), model(X1, X2)
    assert_close_to(got, expected, torch.float32)
    assert_close_to(torch.autograd.grad(got.sum(), X1)[0], torch.autograd.grad(expected.sum(), X1)[0],
                    torch.float32)


def test_runs_on_the_current_stream(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float32)
    expected = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


def test_cuda_graph_replay_of_forward_and_backward(generator):
    """A forward+backward step captured in a CUDA graph (as docs/implementations advises for small calls)
    replays the kernels on new input values and matches the float64 reference."""
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float32, lead=(500, 2))
    X1.requires_grad_()
    X2.requires_grad_()
    G = torch.randn(500, 2, O, device="cuda")

    def step():
        out = sa.accumulate(X1, X2, mu, O, m1, m2, C)
        return (out,) + torch.autograd.grad(out, (X1, X2), G)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (autotuning, rule checks) off the capture, as torch requires
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        X1.copy_(torch.randn(X1.shape, generator=generator).cuda())
        X2.copy_(torch.randn(X2.shape, generator=generator).cuda())
    graph.replay()
    torch.cuda.synchronize()
    exact = [t.detach().double().requires_grad_() for t in (X1, X2)]
    out = sa.reference.index_add(exact[0], exact[1], mu, O, m1, m2, C.double())
    expected = (out,) + torch.autograd.grad(out, exact, G.double())
    for got, want in zip(captured, expected):
        assert_close_to(got, want.detach(), torch.float32)
