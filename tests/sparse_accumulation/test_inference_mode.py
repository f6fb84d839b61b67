"""Every public function works on inference tensors (molecular-dynamics drivers and data pipelines make their
neighbour lists and inputs under ``torch.inference_mode()``), with the same results as under ``no_grad``, and
what is prepared from inference tensors is never remembered (they have no version counter and may be changed
in place inside inference mode)."""
import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation import indices

IMPLEMENTATIONS = [pytest.param(("numba", "cpu"), id="numba"), pytest.param(("torch", "cpu"), id="torch"),
                   pytest.param(("triton", "cuda"), id="triton-cuda", marks=[
                       pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def _same(call, make_inputs, generator, device="cpu"):
    """``call(*inputs)`` under no_grad with ordinary tensors and under inference_mode with the same values made
    as inference tensors (on ``device``); returns both results."""
    def made(g):
        return [t.to(device) if isinstance(t, torch.Tensor) else t for t in make_inputs(g)]

    state = generator.get_state()
    with torch.no_grad():
        expected = call(*made(generator))
    generator.set_state(state)
    with torch.inference_mode():
        inputs = made(generator)
        assert all(t.is_inference() for t in inputs if isinstance(t, torch.Tensor))
        got = call(*inputs)
    return expected, got


def _assert_equal(expected, got):
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    got = got if isinstance(got, (list, tuple)) else [got]
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("layout", ["last", "first", "middle"])
def test_tensor_api(generator, implementation, layout):
    implementation, device = implementation
    function = {"last": sa.accumulate, "first": sa.accumulate_active_dim_first,
                "middle": sa.accumulate_active_dim_middle}[layout]

    def make(g):
        m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 2)
        shape = {"last": (7, 3, 5), "first": (5, 7, 3), "middle": (7, 5, 3)}[layout]
        shape2 = tuple(3 if s == 5 else s for s in shape)
        return (torch.randn(shape, generator=g), torch.randn(shape2, generator=g), mu.clone(), m1.clone(),
                m2.clone(), C.clone())

    expected, got = _same(lambda X1, X2, mu, m1, m2, C: function(X1, X2, mu, 5, m1, m2, C,
                                                                  implementation=implementation), make, generator,
                          device)
    _assert_equal(expected, got)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("prepared", [False, True], ids=["tensors", "Index"])
def test_rule_api_with_and_without_indices(generator, implementation, prepared):
    implementation, device = implementation
    m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1)
    rule = sa.Rule(m1, m2, mu, 3, w=torch.arange(len(C)) % 2, weight_size=2)
    nodes, edges = 9, 40

    def make(g):
        src, dst = (torch.randint(0, nodes, (edges,), generator=g) for _ in range(2))
        return (torch.randn(nodes, 4, 3, generator=g), torch.randn(edges, 1, 3, generator=g),
                torch.randn(edges, 4, 2, generator=g), src, dst, C.clone())

    def call(x, y, w, src, dst, C):
        plain = sa.accumulate_rule(x[src], y, rule, C, w, implementation=implementation)
        if prepared:
            src, dst = sa.Index(src, nodes), sa.Index(dst, nodes)
        graph = sa.accumulate_rule(x, y, rule, C, w, implementation=implementation, indices_1=src,
                                   indices_out=dst, size_out=nodes)
        return plain, graph

    expected, got = _same(call, make, generator, device)
    _assert_equal(expected, got)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_modules(generator, implementation):
    implementation, device = implementation
    path = sa.CGCalculatorSingle(2, 1, 2, implementation=implementation).to(device)
    product = sa.ClebschGordanProduct(2, 1, lmax_out=2, weights=True, implementation=implementation).to(device)
    iteration = sa.ClebschGordanIteration(1, 3, implementation=implementation).to(device)

    def make(g):
        return torch.randn(6, 4, 5, generator=g), torch.randn(6, 4, 3, generator=g), torch.randn(6, 4, 4, generator=g)

    def call(a, b, c):
        features = {0: c[..., :1], 1: c[..., 1:]}
        return [path(a, b), product({0: a[..., :1], 1: a[..., 1:4], 2: a}, features), *iteration(c)]

    expected, got = _same(call, make, generator, device)
    _assert_equal(expected, got)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_e3nn_tensor_product_with_indices(generator, implementation):
    implementation, device = implementation
    pytest.importorskip("e3nn")
    from sparse_accumulation.e3nn import TensorProduct

    tp = TensorProduct("4x0e + 4x1o", "0e + 1o", "4x0e + 4x1o",
                       [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (1, 0, 1, "uvu", True),
                        (0, 1, 1, "uvu", True)], shared_weights=False, internal_weights=False,
                       implementation=implementation).to(device)
    nodes, edges = 8, 30

    def make(g):
        return (torch.randn(nodes, 16, generator=g), torch.randn(edges, 4, generator=g),
                torch.randn(edges, tp.weight_numel, generator=g),
                *(torch.randint(0, nodes, (edges,), generator=g) for _ in range(2)))

    expected, got = _same(lambda x, y, w, src, dst: tp(x, y, w, indices_1=src, indices_out=dst, size_out=nodes),
                          make, generator, device)
    _assert_equal(expected, got)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("attributes", ["indices", "one-hot", "soft"])
def test_symmetric_contraction(generator, implementation, attributes):
    from sparse_accumulation.mace import SymmetricContraction

    implementation, device = implementation
    module = SymmetricContraction("4x0e + 4x1o", "4x0e + 4x1o", correlation=3, num_elements=3,
                                  implementation=implementation).to(device)

    def make(g):
        elements = torch.randint(0, 3, (10,), generator=g)
        y = {"indices": elements, "one-hot": torch.nn.functional.one_hot(elements, 3).float(),
             "soft": torch.rand(10, 3, generator=g)}[attributes]
        return torch.randn(10, 4, 4, generator=g), y

    expected, got = _same(module, make, generator, device)
    _assert_equal(expected, got)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_interaction_sums(generator, implementation):
    implementation, device = implementation
    def make(g):
        first, second = (torch.randint(0, 6, (25,), generator=g) for _ in range(2))
        return (torch.randn(25, 3, generator=g), torch.randn(6, 4, generator=g), torch.randn(6, 3, 4, generator=g),
                first, second)

    def call(s, z, env, first, second):
        return [sa.envsum(s, z, first, second, implementation=implementation),
                sa.sensesum(env, z, first, second, implementation=implementation),
                sa.featsum(env, s, first, second, implementation=implementation)]

    expected, got = _same(call, make, generator, device)
    _assert_equal(expected, got)


def test_inference_tensors_are_not_remembered_and_edits_inside_inference_mode_count(generator):
    """An index tensor edited in place inside inference mode (no version counter) gives the edited result."""
    indices.clear()
    m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1)
    X1, X2 = torch.randn(5, 3, generator=generator), torch.randn(5, 3, generator=generator)
    nodes, edges = 4, 12
    x = torch.randn(nodes, 3, generator=generator)
    rule = sa.Rule(m1, m2, mu, 3)
    with torch.inference_mode():
        mu_inference, dst = mu.clone(), torch.randint(0, nodes, (edges,), generator=generator)
        y = torch.randn(edges, 3, generator=generator)
        first = sa.accumulate(X1, X2, mu_inference, 3, m1, m2, C)
        graph_first = sa.accumulate_rule(x[:1].expand(edges, 3), y, rule, C, indices_out=dst, size_out=nodes)
        mu_inference[0] = (mu_inference[0] + 1) % 3
        dst[:edges // 2] = (dst[:edges // 2] + 1) % nodes
        second = sa.accumulate(X1, X2, mu_inference, 3, m1, m2, C)
        graph_second = sa.accumulate_rule(x[:1].expand(edges, 3), y, rule, C, indices_out=dst, size_out=nodes)
    assert not any(len(memory) for memory in indices._memories)
    torch.testing.assert_close(first, sa.accumulate(X1, X2, mu, 3, m1, m2, C), rtol=0, atol=0)
    edited = mu.clone()
    edited[0] = (edited[0] + 1) % 3
    torch.testing.assert_close(second, sa.accumulate(X1, X2, edited, 3, m1, m2, C), rtol=0, atol=0)
    per_edge = sa.accumulate_rule(x[:1].expand(edges, 3), y.clone(), rule, C)
    assert not torch.equal(graph_first, graph_second)
    torch.testing.assert_close(graph_second, torch.zeros(nodes, 3).index_add_(0, dst.clone(), per_edge),
                               rtol=1e-6, atol=1e-6)
