"""``sparse_accumulation.mace.SymmetricContraction`` without MACE: gradients to second order against finite
differences, element indices and one-hot rows alike, node attributes that are not one-hot (linear in each row),
grad modes, empty and strided inputs, torch.compile without graph breaks, equivariance of the output under
rotations, and bad input."""
import pytest
import torch

from sparse_accumulation.mace import SymmetricContraction

IRREPS_IN, IRREPS_OUT = "2x0e+2x1o", "2x0e+2x1o"


def _module(generator, correlation=3, **kwargs):
    module = SymmetricContraction(IRREPS_IN, IRREPS_OUT, correlation, num_elements=3, dtype=torch.float64,
                                  **kwargs)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
    return module


def _inputs(generator, nodes=6):
    x = torch.randn(nodes, 2, 4, generator=generator, dtype=torch.float64)
    elements = torch.randint(0, 3, (nodes,), generator=generator)
    return x, elements


@pytest.mark.parametrize("implementation", ["numba", pytest.param("torch", marks=pytest.mark.slow)])
def test_gradients_to_second_order_match_finite_differences(generator, implementation):
    module = _module(generator, implementation=implementation)
    x, elements = _inputs(generator, 4)
    x.requires_grad_()
    weights = [[c.weights_max.detach().clone().requires_grad_(), *[w.detach().clone().requires_grad_()
                                                                      for w in c.weights]]
               for c in module.contractions]
    external = SymmetricContraction(IRREPS_IN, IRREPS_OUT, 3, num_elements=3, internal_weights=False,
                                    dtype=torch.float64, implementation=implementation)
    flat = [w for per_irrep in weights for w in per_irrep]

    def function(x, first, last):
        """Differentiable in x, the first irrep's highest-order weights and the last irrep's first-order ones."""
        flat_weights = [first, *flat[1:-1], last]
        it = iter(flat_weights)
        return external(x, elements, [[next(it) for _ in per_irrep] for per_irrep in weights])

    assert torch.allclose(function(x, flat[0], flat[-1]), module(x, elements), rtol=1e-13, atol=1e-13)
    assert torch.autograd.gradcheck(function, (x, flat[0], flat[-1]))
    assert torch.autograd.gradgradcheck(function, (x, flat[0], flat[-1]))


def test_one_hot_rows_and_indices_give_the_same_output(generator):
    module = _module(generator)
    x, elements = _inputs(generator, 20)
    one_hot = torch.nn.functional.one_hot(elements, 3).to(torch.float32)
    assert torch.equal(module(x, elements), module(x, one_hot))
    assert torch.equal(module(x, elements.to(torch.int32)), module(x, one_hot.double()))


def test_empty_and_strided_inputs(generator):
    module = _module(generator)
    x, elements = _inputs(generator, 5)
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert not strided.is_contiguous()
    assert torch.equal(module(strided, elements), module(x, elements))
    empty = module(x[:0].requires_grad_(), elements[:0])
    assert empty.shape == (0, 8)
    empty.sum().backward()


def test_output_is_equivariant(generator):
    """Rotating (and inverting) the input rotates the output: the couplings are right in any basis."""
    o3 = pytest.importorskip("e3nn.o3")
    module = _module(generator)
    x, elements = _inputs(generator, 7)
    inverted = -o3.rand_matrix(dtype=torch.float64)  # a rotation times the inversion: odd irreps change sign
    # x is [nodes, channels, components]; D acts on the components (0e, 1o) of every channel
    D_in = o3.Irreps("0e+1o").D_from_matrix(inverted)
    D_scalar, D_vector = o3.Irreps("0e").D_from_matrix(inverted), o3.Irreps("1o").D_from_matrix(inverted)
    rotated = module(x @ D_in.T, elements)
    out = module(x, elements)
    scalars, vectors = out[:, :2], out[:, 2:].reshape(7, 2, 3)
    assert torch.allclose(rotated[:, :2], scalars * D_scalar[0, 0], atol=1e-12)
    assert torch.allclose(rotated[:, 2:].reshape(7, 2, 3), vectors @ D_vector.T, atol=1e-12)


def _attributes(generator, elements, kind: str) -> torch.Tensor:
    """``[nodes, 3]`` float64 node attributes of the elements: one-hot rows, scaled rows (any sign) with a
    zero row, or mixed rows (several nonzeros) with a zero row."""
    one_hot = torch.nn.functional.one_hot(elements, 3).to(torch.float64)
    if kind == "one-hot":
        return one_hot
    if kind == "scaled":
        y = one_hot * torch.randn(len(elements), 1, generator=generator, dtype=torch.float64)
    else:
        y = one_hot.clone()
        rows = torch.arange(1, len(elements), 2)
        y[rows, (elements[rows] + 1) % 3] = torch.rand(len(rows), generator=generator, dtype=torch.float64) + 0.5
    y[0] = 0
    return y


@pytest.mark.parametrize("kind", ["scaled", "mixed"])
def test_output_is_linear_in_each_row_of_y(generator, kind):
    """Each node's output is ``sum_e y[n, e] * out(x[n], e)``: the scale of scaled rows and the per-node weights
    of mixed rows both count, whether y requires grad or not."""
    module = _module(generator)
    x, elements = _inputs(generator, 12)
    y = _attributes(generator, elements, kind)
    per_element = torch.stack([module(x, torch.full_like(elements, e)) for e in range(3)], 1)  # [nodes, 3, out]
    expected = (y[:, :, None] * per_element).sum(1)
    for got in (module(x, y), module(x, y.clone().requires_grad_())):
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert not module(x, y)[0].any()


@pytest.mark.parametrize("kind", ["one-hot", "scaled", "mixed", "indices", "requires grad"])
def test_grad_modes_give_the_same_output(generator, kind):
    module = _module(generator)
    x, elements = _inputs(generator, 10)
    y = elements if kind == "indices" else _attributes(generator, elements, "mixed" if kind == "requires grad"
                                                       else kind).requires_grad_(kind == "requires grad")
    expected = module(x, y)
    with torch.no_grad():
        assert torch.equal(module(x, y), expected)
    with torch.inference_mode():
        assert torch.equal(module(x.clone(), y if kind == "requires grad" else y.clone()), expected)


def _explained_breaks(module, x, y) -> int:
    torch._dynamo.reset()
    return torch._dynamo.explain(module)(x, y).graph_break_count


def test_one_graph_under_dynamo(generator):
    """No graph break for one-hot rows, element indices and a y that requires grad, nor for weights frozen at
    zero (as MACE freezes them)."""
    module = _module(generator)
    x, elements = _inputs(generator, 8)
    one_hot = _attributes(generator, elements, "one-hot")
    for y in (one_hot, elements, one_hot.clone().requires_grad_()):
        assert _explained_breaks(module, x, y) == 0
    frozen = SymmetricContraction("2x0e+2x1o+2x2e", "2x1e", 4, num_elements=3, dtype=torch.float64)
    assert not all(p.requires_grad for p in frozen.parameters())
    assert _explained_breaks(frozen, torch.randn(8, 2, 9, generator=generator, dtype=torch.float64), one_hot) == 0


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["one-hot", "scaled", "indices", "requires grad"])
def test_compiled_module_equals_eager(generator, backend, kind):
    """Forward, gradient of x (and of y where it requires grad) of the compiled module equal eager mode's."""
    torch._dynamo.reset()
    module = _module(generator)
    x, elements = _inputs(generator, 9)
    y = elements if kind == "indices" else _attributes(generator, elements, "mixed" if kind == "requires grad"
                                                       else kind).requires_grad_(kind == "requires grad")
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    results = []
    for function in (module, compiled):
        features = x.clone().requires_grad_()
        out = function(features, y)
        wrt = [features, y] if kind == "requires grad" else [features]
        results.append([out, *torch.autograd.grad(out.square().sum(), wrt)])
    for expected, got in zip(*results):
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_compiled_module_refuses_rows_with_several_nonzeros(generator):
    """Under torch.compile nothing is read from y: a device-side assertion stops mixed rows (which need eager
    mode or a y that requires grad there)."""
    torch._dynamo.reset()
    module = _module(generator)
    x, elements = _inputs(generator, 6)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    compiled(x, _attributes(generator, elements, "scaled"))
    with pytest.raises(RuntimeError, match="y has rows with several nonzeros"):
        compiled(x, _attributes(generator, elements, "mixed"))


def test_bad_input_is_refused(generator):
    module = _module(generator)
    x, elements = _inputs(generator, 4)
    with pytest.raises(ValueError, match=r"x must be \[nodes, 2, 4\]"):
        module(x[:, :1], elements)
    with pytest.raises(TypeError, match="x has dtype torch.float32"):
        module(x.float(), elements)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        module(x.numpy(), elements)
    with pytest.raises(ValueError, match="y has 3 rows but x has 4 nodes"):
        module(x, elements[:3])
    with pytest.raises(IndexError, match="y contains 3, out of range"):
        module(x, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"y must be \[nodes, num_elements=3\]"):
        module(x, torch.zeros(4, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="a 2-D y must be floating node attributes"):
        module(x, torch.zeros(4, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="weights must be given exactly when"):
        module(x, elements, [[]])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(irreps_out="3x0e"), ValueError, "irreps_out must give every irrep the multiplicity of irreps_in"),
    (dict(irreps_in="2x0e+3x1o"), ValueError, "irreps_in must give every irrep one positive multiplicity"),
    (dict(irreps_in="2x0e+2x1q"), ValueError, "irreps_in: '2x1q'"),
    (dict(correlation=0), ValueError, "correlation must be a positive int"),
    (dict(correlation=[3]), ValueError, r"correlation must give one order per output irrep \(2\)"),
    (dict(correlation={"0e": 2}), ValueError, "correlation has no order for output irreps 1o"),
    (dict(correlation={"0e+1o": 2}), ValueError, "correlation: key '0e\\+1o' is not one irrep"),
    (dict(num_elements=None), ValueError, "num_elements must be a positive int"),
    (dict(irrep_normalization="unit"), ValueError, "irrep_normalization must be one of"),
    (dict(path_normalization="unit"), ValueError, "path_normalization must be one of"),
    (dict(internal_weights=True, shared_weights=False), ValueError, "internal_weights=True needs shared_weights"),
    (dict(use_reduced_cg=True), NotImplementedError, "use_reduced_cg=True"),
    (dict(implementation="cuda"), ValueError, "implementation must be one of"),
])
def test_bad_constructor_arguments_are_refused(kwargs, error, match):
    arguments = dict(irreps_in=IRREPS_IN, irreps_out=IRREPS_OUT, correlation=2, num_elements=3)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        SymmetricContraction(**arguments)
