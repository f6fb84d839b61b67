"""``sparse_accumulation.e3nn.Linear`` and ``FullyConnectedNet`` against e3nn's ``o3.Linear`` and
``nn.FullyConnectedNet`` in float64: outputs and gradients to second order, state dicts both ways, the
conversion from e3nn's modules and what is refused."""
import copy

import pytest
import torch

o3 = pytest.importorskip("e3nn.o3")
e3nn_nn = pytest.importorskip("e3nn.nn")

from sparse_accumulation.e3nn import FullyConnectedNet, InvalidArgumentError, Linear, WeightsMissingError  # noqa

LINEAR_CASES = [
    # MACE's sizes in small; repeated irreps summed into one output; an output no input reaches (1e); zero
    # multiplicities on both sides
    ("6x0e + 5x1o + 3x2e", "4x0e + 3x1o + 2x2e", {}),
    ("2x0e + 3x1o + 2x0e + 1x2e + 2x1o", "4x0e + 2x1o + 2x1e", {}),
    ("0x0e + 3x1o + 2x0e", "2x0e + 0x1o + 1x1o", {}),
    ("3x0e + 2x1o", "2x0e + 1x1o + 2x0e", {"biases": True}),
    ("3x0e + 2x1o + 4x0e", "2x0e + 1x1o", {"path_normalization": "path", "instructions": [(0, 0), (1, 1), (2, 0)]}),
    ("3x0e + 2x1o", "2x0e + 1x1o", {"biases": [False, False]}),
]


def _float64(make):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return make()
    finally:
        torch.set_default_dtype(previous)


def _e3nns_with_random_parameters(make, generator):
    """e3nn's module made in float64, every parameter drawn from a normal distribution."""
    module = _float64(make)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
    return module


def _derivatives(module, x, params, call):
    """The output, its gradients (x and every parameter) for a random output gradient, and the gradients of
    gx . H (second order)."""
    out = call(module, x)
    G = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    H = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    first = torch.autograd.grad((out * G).sum(), (x, *params), create_graph=True, materialize_grads=True)
    second = torch.autograd.grad((first[0] * H).sum(), (x, *params), allow_unused=True, materialize_grads=True)
    return [out, *first, *second]


def _assert_all_close(got, expected):
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        scale = max(e.abs().max().item() if e.numel() else 0.0, 1.0)
        assert torch.allclose(g, e, rtol=0, atol=1e-12 * scale), i


@pytest.mark.parametrize("irreps_in, irreps_out, kwargs", LINEAR_CASES)
def test_linear_equals_e3nns_to_second_order(generator, irreps_in, irreps_out, kwargs):
    theirs = _e3nns_with_random_parameters(lambda: o3.Linear(irreps_in, irreps_out, **kwargs), generator)
    ours = Linear.from_e3nn(theirs)
    assert ours.weight is theirs.weight and ours.bias is theirs.bias
    x = torch.randn(4, 7, theirs.irreps_in.dim, generator=generator, dtype=torch.float64, requires_grad=True)
    params = [p for p in theirs.parameters()]
    _assert_all_close(_derivatives(ours, x, params, lambda m, v: m(v)),
                      _derivatives(theirs, x, params, lambda m, v: m(v)))


def test_linear_with_weights_per_row_equals_e3nns(generator):
    theirs = _float64(lambda: o3.Linear("3x0e + 2x1o + 1x0e", "2x0e + 3x1o", shared_weights=False))
    ours = Linear("3x0e + 2x1o + 1x0e", "2x0e + 3x1o", shared_weights=False)
    assert not ours.internal_weights and ours.weight_numel == theirs.weight_numel
    x = torch.randn(9, theirs.irreps_in.dim, generator=generator, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, theirs.weight_numel, generator=generator, dtype=torch.float64, requires_grad=True)
    _assert_all_close(_derivatives(ours, x, [w], lambda m, v: m(v, w)),
                      _derivatives(theirs, x, [w], lambda m, v: m(v, w)))
    with pytest.raises(WeightsMissingError):
        ours(x)


def test_linear_made_from_irreps_has_e3nns_state_and_loads_both_ways(generator):
    theirs = _float64(lambda: o3.Linear("4x0e + 3x1o", "2x0e + 3x1o", biases=True))
    ours = Linear("4x0e + 3x1o", "2x0e + 3x1o", biases=True).double()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    assert [tuple(i) for i in ours.instructions] == [tuple(i) for i in theirs.instructions]
    assert torch.equal(ours.bias, torch.zeros_like(ours.bias))
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(5, theirs.irreps_in.dim, generator=generator, dtype=torch.float64)
    assert torch.allclose(ours(x), theirs(x), rtol=0, atol=1e-13)
    with torch.no_grad():
        ours.weight.normal_()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert torch.allclose(ours(x), theirs(x), rtol=0, atol=1e-13)
    weighted = [i for i, ins in enumerate(theirs.instructions) if ins.i_in != -1]
    for i in weighted:
        assert torch.equal(ours.weight_view_for_instruction(i), theirs.weight_view_for_instruction(i))
    assert [i for i, _, _ in ours.weight_views(yield_instruction=True)] == weighted


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_compiled_converted_linear_converts_no_tensor(generator, dtype):
    """``from_e3nn`` of a layer in ``dtype``: its path weights are a buffer in that dtype, so a compiled graph reads
    the layer's own tensors and its input and converts none (a conversion inside the graph of a tensor kept on the
    host would be a copy to the device, which a CUDA graph cannot capture)."""
    theirs = _e3nns_with_random_parameters(lambda: o3.Linear("4x0e + 2x1o", "3x0e + 2x1o"), generator).to(dtype)
    ours = Linear.from_e3nn(theirs)
    x = torch.randn(5, theirs.irreps_in.dim, generator=generator, dtype=dtype)
    graphs = []

    def recording(graph, inputs):
        graphs.append(graph)
        return graph

    torch._dynamo.reset()
    got = torch.compile(ours, backend=recording, fullgraph=True)(x)
    (graph,) = graphs
    assert not [node for node in graph.graph.nodes if node.target == "to"]
    assert torch.allclose(got, theirs(x), rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-12)


def test_linear_on_empty_rows_and_leading_dimensions():
    ours = Linear("2x0e + 1x1o", "3x0e + 2x1o")
    assert ours(torch.randn(0, 5)).shape == (0, 9)
    assert ours(torch.randn(2, 3, 4, 5)).shape == (2, 3, 4, 9)


@pytest.mark.parametrize("irreps_in", ["3x0e + 1x1o", "0x0e + 2x1o"])
def test_linear_with_no_output_irreps_equals_e3nns(generator, irreps_in):
    """No output irreps (MACE's dipole readout builds ``Linear("16x1o", "")``): e3nn's ``[..., 0]``."""
    theirs = _e3nns_with_random_parameters(lambda: o3.Linear(irreps_in, ""), generator)
    ours = Linear.from_e3nn(theirs)
    x = torch.randn(4, 3, theirs.irreps_in.dim, generator=generator, dtype=torch.float64)
    expected = theirs(x)
    assert expected.shape == (4, 3, 0) and ours(x).shape == expected.shape == torch.jit.script(ours)(x).shape


@pytest.mark.parametrize("irreps_out", ["2x0e + 1x1o", ""])
def test_linear_with_no_input_irreps_gives_its_biases(generator, irreps_out):
    """No input irreps (e3nn itself cannot reshape such inputs): the biases of scalar outputs, zeros elsewhere."""
    ours = Linear("", irreps_out, biases=True).double()
    with torch.no_grad():
        ours.bias.normal_(generator=generator)
    x = torch.randn(4, 3, 0, dtype=torch.float64)
    expected = torch.zeros(4, 3, ours.irreps_out.dim, dtype=torch.float64)
    if ours.bias_numel:
        expected[..., :2] = ours.bias
    for module in (ours, torch.jit.script(ours)):
        assert torch.equal(module(x), expected)


@pytest.mark.parametrize("width", [0, 16, 5])
def test_linear_without_paths_takes_any_input_width_as_e3nns(generator, width):
    """No weighted path (MACE's dipole readout with scalar ``MLP_irreps`` builds ``Linear("16x0e", "1x1o")`` and
    feeds it a ``[n, 0]`` tensor): e3nn reads no input and returns zeros; so do ours, scripted too. A layer
    with paths still checks the width."""
    theirs = _e3nns_with_random_parameters(lambda: o3.Linear("16x0e", "1x1o + 2x0e", instructions=[]), generator)
    ours = Linear.from_e3nn(theirs)
    x = torch.randn(4, 3, width, generator=generator, dtype=torch.float64)
    expected = theirs(x)
    assert expected.shape == (4, 3, 5)
    for module in (ours, torch.jit.script(ours)):
        assert torch.equal(module(x), expected)
    with pytest.raises(InvalidArgumentError, match=r"features: last dimension of shape \[3, 5\]"):
        Linear("16x0e", "1x0e")(torch.randn(3, 5))


@pytest.mark.parametrize("irreps_in, irreps_out, kwargs", LINEAR_CASES)
def test_scripted_linear_equals_e3nns_with_its_exact_path_weights(generator, irreps_in, irreps_out, kwargs):
    """``torch.jit.script`` of the layer (what MACE's ``jit.compile`` does to a converted model): e3nn's outputs
    and gradients to second order; made in float32 and then taken to float64, its path weights are the exact
    ones still."""
    theirs = _e3nns_with_random_parameters(lambda: o3.Linear(irreps_in, irreps_out, **kwargs), generator)
    ours = Linear(irreps_in, irreps_out, **kwargs).float().double()
    ours.load_state_dict(theirs.state_dict())
    scripted = torch.jit.script(ours)
    x = torch.randn(4, 7, theirs.irreps_in.dim, generator=generator, dtype=torch.float64, requires_grad=True)
    for module in (ours, scripted):
        _assert_all_close(_derivatives(module, x, [], lambda m, v: m(v)),
                          _derivatives(theirs, x, [], lambda m, v: m(v)))


def test_linear_called_in_inference_mode_then_in_training(generator):
    """What a call inside ``torch.inference_mode()`` makes (the path weights in float32) is not kept for a later
    call that trains."""
    theirs = _e3nns_with_random_parameters(lambda: o3.Linear("2x0e + 1x1o", "3x0e + 1x1o"), generator).float()
    ours = Linear.from_e3nn(theirs)
    x = torch.randn(4, 5, generator=generator, requires_grad=True)
    with torch.inference_mode():
        assert torch.allclose(ours(x.detach()), theirs(x.detach()), rtol=0, atol=1e-5)
    ours(x).sum().backward()
    assert torch.allclose(x.grad, torch.autograd.grad(theirs(x).sum(), x)[0], rtol=0, atol=1e-5)


def test_linear_refusals():
    with pytest.raises(NotImplementedError, match="f_in"):
        Linear("2x0e", "2x0e", f_in=3, f_out=3)
    with pytest.raises(InvalidArgumentError, match="path_normalization"):
        Linear("2x0e", "2x0e", path_normalization="none")
    with pytest.raises(InvalidArgumentError, match="not the same irrep"):
        Linear("2x0e + 1x1o", "2x0e + 1x1o", instructions=[(0, 1)])
    with pytest.raises(IndexError, match="irreps_out"):
        Linear("2x0e", "2x0e", instructions=[(0, 3)])
    with pytest.raises(InvalidArgumentError, match="scalar"):
        Linear("2x1o", "2x1o", biases=[True])
    with pytest.raises(InvalidArgumentError, match="internal_weights"):
        Linear("2x0e", "2x0e", internal_weights=True, shared_weights=False)
    with pytest.raises(InvalidArgumentError, match="features"):
        Linear("2x0e + 1x1o", "2x0e")(torch.randn(3, 4))
    with pytest.raises(TypeError, match="o3.Linear"):
        Linear.from_e3nn(torch.nn.Linear(2, 2))
    with pytest.raises(NotImplementedError, match="f_in"):
        Linear.from_e3nn(o3.Linear("2x0e", "2x0e", f_in=2, f_out=3))


FC_CASES = [
    ([8, 16, 16, 16, 40], torch.nn.functional.silu, {}),          # MACE's radial network, smaller
    ([3, 5, 4], torch.tanh, {"out_act": True, "variance_out": 2.0}),  # the activation after the last layer too
    ([3, 6, 2], torch.nn.functional.silu, {"variance_in": 2.0, "variance_out": 3.0}),
    ([4, 5, 3], None, {}),                                        # no activation
    ([4, 2], torch.nn.functional.silu, {}),                       # a single layer
]


@pytest.mark.parametrize("hs, act, kwargs", FC_CASES)
def test_fully_connected_net_equals_e3nns_to_second_order(generator, hs, act, kwargs):
    theirs = _e3nns_with_random_parameters(lambda: e3nn_nn.FullyConnectedNet(hs, act, **kwargs), generator)
    ours = FullyConnectedNet.from_e3nn(theirs)
    assert list(ours.parameters()) == list(theirs.parameters())  # the same Parameter objects
    x = torch.randn(30, hs[0], generator=generator, dtype=torch.float64, requires_grad=True)
    params = list(theirs.parameters())
    _assert_all_close(_derivatives(ours, x, params, lambda m, v: m(v)),
                      _derivatives(theirs, x, params, lambda m, v: m(v)))


def test_fully_connected_net_made_from_widths_has_e3nns_state(generator):
    theirs = _float64(lambda: e3nn_nn.FullyConnectedNet([3, 7, 2], torch.nn.functional.silu))
    ours = FullyConnectedNet([3, 7, 2], torch.nn.functional.silu).double()
    assert repr(ours) == "FullyConnectedNet[3, 7, 2]"
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(11, 3, generator=generator, dtype=torch.float64)
    assert torch.allclose(ours(x), theirs(x), rtol=0, atol=1e-13)
    copied = copy.deepcopy(ours)  # layers and folded constants travel together
    assert torch.allclose(copied(x), theirs(x), rtol=0, atol=1e-13)


def test_fully_connected_net_refusals():
    with pytest.raises(TypeError, match="FullyConnectedNet"):
        FullyConnectedNet.from_e3nn(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    net = e3nn_nn.FullyConnectedNet([2, 3, 2], torch.nn.functional.silu)
    net.layer0.act = torch.nn.SiLU()  # an activation e3nn did not normalise
    with pytest.raises(TypeError, match="layer0"):
        FullyConnectedNet.from_e3nn(net)
