"""``sparse_accumulation.mace.SymmetricContraction`` against MACE's own module (mace-torch 0.3.16,
``mace.modules.symmetric_contraction``) in float64: outputs, gradients of x and of every weight, second
derivatives; the module built from MACE's weights (``from_mace``) and from this library's coupling coefficients.
Skipped without mace-torch (see ``mace_helpers.py``)."""
import copy

import pytest
import torch

from mace_helpers import inputs, mace_contraction, mace_module
from sparse_accumulation.mace import SymmetricContraction

RTOL = 1e-10
ATOL = 1e-14
SMALL = ("2x0e+2x1o", "2x0e+2x1o", 3, 3)
IMPLEMENTATIONS = ["numba", "torch"]


@pytest.fixture(scope="module", autouse=True)
def _mace():
    mace_module()


def assert_close(ours, theirs, what):
    scale = theirs.abs().max().item()
    error = (ours - theirs).abs().max().item()
    # MACE's float64 U tensors leave ~1e-16 where exact arithmetic gives zero (no symmetric path)
    assert error <= RTOL * scale + ATOL, f"{what}: error {error:.3g} for values up to {scale:.3g}"


def _dim(irreps: str) -> int:
    return sum(2 * int(term.split("x")[1][:-1]) + 1 for term in irreps.split("+"))


def _weights_of(module) -> dict:
    """MACE's weights by name (its state also holds U tensors and flags)."""
    return {name: p.detach() for name, p in module.named_parameters()}


def _compare(theirs, ours, generator, nodes=13, y_kind="one-hot", second=True):
    """Outputs, first derivatives (x and every weight, random cotangent) and, with ``second``, derivatives of
    the x-gradient's projection on a random direction: ours equal MACE's."""
    channels = int(theirs.irreps_in[0].mul)
    num_elements = theirs.contractions[0].weights_max.shape[0]
    x, elements, one_hot = inputs(generator, nodes, channels, _dim(str(theirs.irreps_in)), num_elements)
    x.requires_grad_(True)
    expected = theirs(x, one_hot)
    got = ours(x, one_hot if y_kind == "one-hot" else elements)
    assert got.shape == expected.shape and got.dtype == torch.float64
    assert_close(got, expected, "output")
    cotangent = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    names = [name for name, p in theirs.named_parameters() if p.requires_grad]  # not MACE's zeroed weights
    their_params = [theirs.get_parameter(name) for name in names]
    our_params = [ours.get_parameter(name) for name in names]
    g_theirs = torch.autograd.grad(expected, [x, *their_params], cotangent, create_graph=second)
    g_ours = torch.autograd.grad(got, [x, *our_params], cotangent, create_graph=second)
    for i, (a, b) in enumerate(zip(g_ours, g_theirs)):
        assert_close(a, b, f"gradient {i}")
    if second:
        direction = torch.randn(x.shape, generator=generator, dtype=torch.float64)
        h_theirs = _grad((g_theirs[0] * direction).sum(), [x, *their_params])
        h_ours = _grad((g_ours[0] * direction).sum(), [x, *our_params])
        for i, (a, b) in enumerate(zip(h_ours, h_theirs)):
            assert_close(a, b, f"second derivative {i}")


def _grad(value, tensors):
    """Gradients, zeros where ``value`` does not depend on a tensor."""
    found = torch.autograd.grad(value, tensors, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, found)]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("y_kind", ["one-hot", "indices"])
def test_from_mace_equals_mace_to_second_order(generator, implementation, y_kind):
    theirs = mace_contraction(*SMALL, generator)
    ours = SymmetricContraction.from_mace(theirs, implementation=implementation)
    _compare(theirs, ours, generator, y_kind=y_kind)


@pytest.mark.parametrize("irreps_in, irreps_out, correlation", [
    ("2x0e+2x1o", "2x0e+2x1o", 1),
    ("2x0e+2x1o", "2x0e+2x1o+2x2e", 2),
    ("2x0e+2x1o", "2x0e+2x1o", 4),
    # 0o and 1e: no symmetric path at orders 1 and 2 (MACE's zeroed weights); 2e: the output's scale
    ("2x0e+2x1o", "2x0o+2x1e+2x2e", 2),
    ("2x0e+2x1o+2x2e", "2x0e+2x1o", 3),
])
def test_own_couplings_equal_mace(generator, irreps_in, irreps_out, correlation):
    """Built from this library's Clebsch-Gordan coefficients (not MACE's U tensors), with MACE's weights."""
    theirs = mace_contraction(irreps_in, irreps_out, correlation, 3, generator)
    ours = SymmetricContraction(irreps_in, irreps_out, correlation, num_elements=3, dtype=torch.float64)
    assert [name for name, _ in ours.named_parameters()] == [name for name, _ in theirs.named_parameters()]
    ours.load_state_dict(_weights_of(theirs))
    _compare(theirs, ours, generator, second=correlation <= 3)


@pytest.mark.slow
def test_own_couplings_equal_mace_up_to_l3(generator):
    """The issue's irreps (l <= 3, 0e+1o out, correlation 3) on two channels."""
    theirs = mace_contraction("2x0e+2x1o+2x2e+2x3o", "2x0e+2x1o", 3, 4, generator)
    ours = SymmetricContraction(theirs.irreps_in, theirs.irreps_out, 3, num_elements=4, dtype=torch.float64)
    ours.load_state_dict(_weights_of(theirs))
    _compare(theirs, ours, generator, nodes=9)
    _compare(theirs, SymmetricContraction.from_mace(theirs), generator, nodes=9, second=False)


@pytest.mark.parametrize("correlation", [[3, 2], {"0e": 3, "1o": 2}])
def test_correlation_per_output_irrep(generator, correlation):
    """MACE's layer with one correlation per output irrep: its contractions, one per irrep, concatenated."""
    scalars = mace_contraction("2x0e+2x1o", "2x0e", 3, 3, generator)
    vectors = mace_contraction("2x0e+2x1o", "2x1o", 2, 3, generator)
    ours = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", correlation, num_elements=3, dtype=torch.float64)
    assert ours.correlation == [3, 2]
    with torch.no_grad():
        for mine, theirs in zip(ours.contractions, (scalars.contractions[0], vectors.contractions[0])):
            mine.weights_max.copy_(theirs.weights_max)
            for a, b in zip(mine.weights, theirs.weights):
                a.copy_(b)
    x, elements, one_hot = inputs(generator, 11, 2, 4, 3)
    expected = torch.cat([scalars(x, one_hot), vectors(x, one_hot)], dim=-1)
    assert_close(ours(x, elements), expected, "output")


def test_external_weights_equal_mace(generator):
    theirs = mace_contraction(*SMALL, generator)
    ours = SymmetricContraction(*SMALL[:3], num_elements=3, internal_weights=False, shared_weights=False,
                                dtype=torch.float64)
    assert not list(ours.parameters())
    weights = [[c.weights_max.detach().clone().requires_grad_(), *[w.detach().clone() for w in c.weights]]
               for c in theirs.contractions]
    x, elements, one_hot = inputs(generator, 10, 2, 4, 3)
    got = ours(x, elements, weights)
    assert_close(got, theirs(x, one_hot), "output")
    got.sum().backward()
    assert weights[0][0].grad is not None and weights[0][0].grad.abs().sum() > 0


def test_from_mace_float32(generator):
    """A float32 MACE module: float32 weights and output, equal to MACE's to float32 rounding."""
    theirs = copy.deepcopy(mace_contraction(*SMALL, generator)).float()
    ours = SymmetricContraction.from_mace(theirs)
    assert ours.contractions[0].weights_max.dtype == torch.float32
    x, elements, one_hot = inputs(generator, 12, 2, 4, 3)
    expected = theirs(x.float(), one_hot.float())
    got = ours(x.float(), elements)
    assert got.dtype == torch.float32
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


def test_from_mace_refuses_other_modules():
    with pytest.raises(TypeError, match="module must be MACE's SymmetricContraction"):
        SymmetricContraction.from_mace(torch.nn.Linear(2, 2))


def test_from_mace_refuses_a_module_without_its_weights(generator):
    theirs = copy.deepcopy(mace_contraction(*SMALL, generator))
    theirs.contractions[0].weights_max = None
    with pytest.raises(ValueError, match="no internal weights"):
        SymmetricContraction.from_mace(theirs)
