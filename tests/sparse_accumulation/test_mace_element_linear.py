"""``sparse_accumulation.mace.ElementLinear`` (MACE's skip connections per element) against e3nn's
``FullyConnectedTensorProduct`` it is made from, in float64: outputs and gradients to second order for one-hot,
scaled one-hot, zero, soft and integer node attributes; sizes with several tiles per element and elements without
nodes; its state dict; what it refuses; torch.compile."""
import pytest
import torch

o3 = pytest.importorskip("e3nn.o3")

from sparse_accumulation.mace import ElementLinear  # noqa: E402
from sparse_accumulation.mace import element_linear  # noqa: E402

CASES = [
    # MACE's skip connection (scalars and vectors), every degree to 3 with an output no input reaches (1e), and two
    # inputs of one irrep summed into one output
    ("6x0e + 5x1o", "4x0e + 3x1o", 3),
    ("3x0e + 2x1o + 2x2e + 2x3o", "2x0e + 3x1o + 1x1e + 2x2e + 1x3o", 4),
    ("2x1o + 3x1o + 4x0e", "5x1o + 2x0e", 2),
]


def _made(generator, irreps_in, irreps_out, elements, attributes="0e"):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn's constants in float64 (as MACE builds its models)
    try:
        tp = o3.FullyConnectedTensorProduct(irreps_in, f"{elements}x{attributes}", irreps_out)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        tp.weight.copy_(torch.randn(tp.weight.shape, generator=generator, dtype=torch.float64))
    return tp, ElementLinear(tp)


def _attributes(generator, kind, nodes, elements):
    """Node attributes of a kind; the first element gets no node (a tile table with an empty element)."""
    index = torch.randint(1, elements, (nodes,), generator=generator) if elements > 1 else torch.zeros(
        nodes, dtype=torch.int64)
    one_hot = torch.nn.functional.one_hot(index, elements).double()
    if kind == "one-hot":
        return one_hot, one_hot
    if kind == "integer":
        return index, one_hot
    if kind == "scaled":  # one nonzero per row of any value, zero rows (padding atoms) among them
        y = one_hot * torch.randn(nodes, 1, generator=generator, dtype=torch.float64)
        y[::7] = 0
        return y, y
    y = torch.rand(nodes, elements, generator=generator, dtype=torch.float64)  # soft rows
    return y, y


@pytest.mark.parametrize("irreps_in, irreps_out, elements", CASES)
@pytest.mark.parametrize("kind", ["one-hot", "integer", "scaled", "soft"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_outputs_and_gradients_to_second_order_equal_e3nns(generator, irreps_in, irreps_out, elements, kind, device):
    """150 nodes over the elements but the first: several tiles per element (32 nodes each), a partial last
    tile of each, an element without nodes."""
    tp, ours = _made(generator, irreps_in, irreps_out, elements)
    tp, ours = tp.to(device), ours.to(device)
    nodes = 150
    y, y_e3nn = (a.to(device) for a in _attributes(generator, kind, nodes, elements))
    x = torch.randn(nodes, tp.irreps_in1.dim, generator=generator, dtype=torch.float64).to(device).requires_grad_()
    G = torch.randn(nodes, tp.irreps_out.dim, generator=generator, dtype=torch.float64).to(device)
    H = torch.randn(nodes, tp.irreps_in1.dim, generator=generator, dtype=torch.float64).to(device)

    def derivatives(module, attributes):
        out = module(x, attributes)
        gx, gw = torch.autograd.grad((out * G).sum(), (x, tp.weight), create_graph=True)
        second = torch.autograd.grad((gx * H).sum(), (x, tp.weight), allow_unused=True, materialize_grads=True)
        return [out, gx, gw, *second]

    # out, its gradients (x, weight), and the gradients of gx . H: in x zero (the map is linear in x), in the
    # weight not
    for i, (got, expected) in enumerate(zip(derivatives(ours, y), derivatives(tp, y_e3nn), strict=True)):
        scale = expected.abs().max().item()
        assert (scale == 0) == (i == 3)
        assert torch.allclose(got, expected, rtol=0, atol=1e-12 * max(scale, 1.0))


@pytest.mark.parametrize("kind", ["one-hot", "integer", "scaled", "soft"])
def test_scripted_calls_equal_e3nns(generator, kind):
    """``torch.jit.script`` (MACE's ``jit.compile`` of a converted model): e3nn's sum over every element."""
    tp, ours = _made(generator, *CASES[1][:2], CASES[1][2])
    y, y_e3nn = _attributes(generator, kind, 40, CASES[1][2])
    x = torch.randn(40, tp.irreps_in1.dim, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(torch.jit.script(ours)(x, y), tp(x, y_e3nn), rtol=1e-12, atol=1e-12)


def test_the_weight_is_e3nns_parameter_and_the_state_dict_e3nns(generator):
    tp, ours = _made(generator, "4x0e + 2x1o", "3x0e + 2x1o", 3)
    assert ours.weight is tp.weight
    assert ours.state_dict().keys() == tp.state_dict().keys()
    other, _ = _made(generator, "4x0e + 2x1o", "3x0e + 2x1o", 3)
    ours.load_state_dict(other.state_dict(), strict=True)
    x = torch.randn(40, tp.irreps_in1.dim, generator=generator, dtype=torch.float64)
    y = torch.nn.functional.one_hot(torch.randint(0, 3, (40,), generator=generator), 3).double()
    assert torch.allclose(ours(x, y), other(x, y), rtol=0, atol=1e-12)


def test_a_call_in_inference_mode_then_one_that_trains(generator):
    """The elements prepared for the attributes inside ``torch.inference_mode()`` are not kept for the next call,
    which saves them for its backward (inference tensors cannot be)."""
    tp, ours = _made(generator, "4x0e + 2x1o", "3x0e + 2x1o", 3)
    x = torch.randn(40, tp.irreps_in1.dim, generator=generator, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.one_hot(torch.randint(0, 3, (40,), generator=generator), 3).double()
    with torch.inference_mode():
        assert torch.allclose(ours(x, y), tp(x, y), rtol=0, atol=1e-12)
    got, = torch.autograd.grad(ours(x, y).square().sum(), x)
    expected, = torch.autograd.grad(tp(x, y).square().sum(), x)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12 * expected.abs().max().item())


def test_pseudoscalar_attributes_and_a_single_node(generator):
    tp, ours = _made(generator, "3x0e + 2x1o", "2x0o + 2x1e", 2, attributes="0o")
    x = torch.randn(1, tp.irreps_in1.dim, generator=generator, dtype=torch.float64)
    y = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    expected = tp(x, y)
    assert expected.abs().max() > 0 and torch.allclose(ours(x, y), expected, rtol=0, atol=1e-12)
    assert ours(x[:0], y[:0]).shape == (0, tp.irreps_out.dim)


def test_what_is_refused(generator):
    assert ElementLinear.refusal(o3.Linear("2x0e", "2x0e")).startswith("not e3nn's")
    with pytest.raises(TypeError, match="FullyConnectedTensorProduct"):
        ElementLinear(o3.TensorProduct("2x0e", "2x0e", "2x0e", [(0, 0, 0, "uvw", True)]))
    with pytest.raises(ValueError, match="one irrep of scalars"):
        ElementLinear(o3.FullyConnectedTensorProduct("2x0e", "2x0e + 1x1o", "2x0e"))
    with pytest.raises(ValueError, match="internal and shared"):
        ElementLinear(o3.FullyConnectedTensorProduct("2x0e", "2x0e", "2x0e", shared_weights=False))
    _, ours = _made(generator, "2x0e", "2x0e", 3)
    with pytest.raises(ValueError, match=r"x must be \[nodes, 2\]"):
        ours(torch.zeros(4, 3, dtype=torch.float64), torch.zeros(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="nodes"):
        ours(torch.zeros(4, 2, dtype=torch.float64), torch.zeros(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="num_elements=3"):
        ours(torch.zeros(4, 2, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64))


def test_tile_rows_follow_the_nodes_per_element():
    assert [element_linear.tile_rows(n, 89) for n in (0, 1000, 2000, 3000, 10 ** 6)] == [8, 8, 16, 32, 32]
    assert element_linear.tile_rows(150, 2) == 32 and element_linear.tile_rows(150, 10) == 8


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_compiled_calls_equal_e3nns(generator, device):
    """Under torch.compile (node counts of two sizes: the tile table's shapes follow the node count; on CUDA
    inductor's own code for the tile table)."""
    tp, ours = _made(generator, "4x0e + 3x1o", "4x0e + 3x1o", 3)
    tp, ours = tp.to(device), ours.to(device)
    compiled = torch.compile(ours)
    for nodes in (70, 97):
        x = torch.randn(nodes, tp.irreps_in1.dim, generator=generator, dtype=torch.float64).to(device)
        y = torch.nn.functional.one_hot(torch.randint(0, 3, (nodes,), generator=generator), 3).double().to(device)
        assert torch.allclose(compiled(x, y), tp(x, y), rtol=0, atol=1e-12)


def test_tiles_hold_at_most_their_rows(generator, monkeypatch):
    """With tiles of 4 nodes (many tiles per element) the outputs still equal e3nn's: the tile size is read."""
    monkeypatch.setattr(element_linear, "TILE_ROWS", (4, 4))
    assert element_linear.tile_rows(30, 3) == 4
    tp, ours = _made(generator, "3x0e + 2x1o", "3x0e + 2x1o", 3)
    x = torch.randn(30, tp.irreps_in1.dim, generator=generator, dtype=torch.float64)
    y = torch.nn.functional.one_hot(torch.randint(0, 3, (30,), generator=generator), 3).double()
    assert torch.allclose(ours(x, y), tp(x, y), rtol=0, atol=1e-12)
