"""``sparse_accumulation.mace.SymmetricContraction`` against MACE's own module (mace-torch 0.3.16,
``mace.modules.symmetric_contraction``) in float64: outputs, gradients of x and of every weight, second
derivatives; the module built from MACE's weights (``from_mace``) and from this library's coupling coefficients;
the weights MACE freezes at zero; node attributes that are not one-hot. Skipped without mace-torch (see
``mace_helpers.py``)."""
import copy

import pytest
import torch

from mace_helpers import inputs, mace_contraction, mace_module
from sparse_accumulation.mace import SymmetricContraction

RTOL = 1e-10
ATOL = 1e-14
SMALL = ("2x0e+2x1o", "2x0e+2x1o", 3, 3)
# MACE freezes weights[0] (order 2) of 1e, whose order-1 coupling is zero, and both lower orders of 0o
FROZEN = ("2x0e+2x1o+2x2e", "2x0o+2x1e", 3, 3)
# weights[0] (order 3, whose symmetric couplings are not zero) frozen for order 1, so MACE's output lacks order 3
FROZEN_ORDER_THREE = ("2x0e+2x1o+2x2e", "2x1e", 4, 2)
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


def _state_of(module) -> dict:
    """MACE's state without its U tensors: the weights and the flags of the frozen ones, by name."""
    return {name: value for name, value in module.state_dict().items() if ".U_matrix_" not in name}


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
    FROZEN[:3],
])
def test_own_couplings_equal_mace(generator, irreps_in, irreps_out, correlation):
    """Built from this library's Clebsch-Gordan coefficients (not MACE's U tensors), with MACE's weights."""
    theirs = mace_contraction(irreps_in, irreps_out, correlation, 3, generator)
    ours = SymmetricContraction(irreps_in, irreps_out, correlation, num_elements=3, dtype=torch.float64)
    assert [name for name, _ in ours.named_parameters()] == [name for name, _ in theirs.named_parameters()]
    ours.load_state_dict(_state_of(theirs))
    _compare(theirs, ours, generator, second=correlation <= 3)


@pytest.mark.slow
def test_own_couplings_equal_mace_up_to_l3(generator):
    """The issue's irreps (l <= 3, 0e+1o out, correlation 3) on two channels."""
    theirs = mace_contraction("2x0e+2x1o+2x2e+2x3o", "2x0e+2x1o", 3, 4, generator)
    ours = SymmetricContraction(theirs.irreps_in, theirs.irreps_out, 3, num_elements=4, dtype=torch.float64)
    ours.load_state_dict(_state_of(theirs))
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


def test_external_weights_keep_mace_flags_and_are_used_as_passed(generator):
    """internal_weights=False: MACE's flags in the state, nothing frozen, the weights used as passed (MACE's code
    replaces its frozen weights by external ones)."""
    theirs = mace_contraction(*FROZEN_ORDER_THREE, generator)
    ours = SymmetricContraction(*FROZEN_ORDER_THREE[:3], num_elements=2, internal_weights=False,
                                dtype=torch.float64)
    flags = {name: value for name, value in _state_of(theirs).items() if name.endswith("_zeroed")}
    assert list(ours.state_dict()) == list(flags)
    assert all(torch.equal(ours.state_dict()[name], value) for name, value in flags.items())
    weights = [[c.weights_max.detach().clone(), *[w.detach().clone() for w in c.weights]] for c in theirs.contractions]
    x, elements, one_hot = inputs(generator, 8, 2, 9, 2)
    assert_close(ours(x, elements, weights), theirs(x, one_hot), "output")
    frozen = weights[0][1]  # weights[0], frozen in MACE's module: here it counts
    assert not frozen.any()
    frozen.normal_(generator=generator)
    assert not torch.allclose(ours(x, elements, weights), theirs(x, one_hot))


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


def test_from_mace_with_maces_buffers_has_maces_state(generator):
    """``mace_buffers=True``: MACE's state dict key for key, values equal, strict loads both ways (a loaded state's
    weights are then used)."""
    theirs = mace_contraction(*FROZEN, generator)
    ours = SymmetricContraction.from_mace(theirs, mace_buffers=True)
    state, their_state = ours.state_dict(), theirs.state_dict()
    assert set(state) == set(their_state)
    assert all(torch.equal(state[name], their_state[name]) for name in state)
    theirs = mace_contraction(*FROZEN, generator)  # fresh weights
    ours.load_state_dict(theirs.state_dict(), strict=True)
    _compare(theirs, ours, generator, nodes=7, second=False)
    theirs = mace_contraction(*FROZEN, generator)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    _compare(theirs, ours, generator, nodes=7, second=False)


def test_loaded_coupling_tensors_are_computed_with(generator):
    """A state whose U tensors differ from the module's (as another basis would give) rebuilds the couplings:
    the output is MACE's with the loaded U tensors; a module without MACE's buffers is not affected by them."""
    theirs = copy.deepcopy(mace_contraction(*SMALL, generator))
    ours = SymmetricContraction.from_mace(theirs, mace_buffers=True)
    with torch.no_grad():
        for contraction in theirs.contractions:
            for name, buffer in contraction.named_buffers():
                if name.startswith("U_matrix_"):
                    buffer.mul_(torch.rand((), generator=generator, dtype=buffer.dtype) + 0.5)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    _compare(theirs, ours, generator, nodes=7, second=False)
    plain = SymmetricContraction.from_mace(mace_contraction(*SMALL, generator))
    before = plain.couplings.clone()
    plain.load_state_dict(_state_of(theirs), strict=True)
    assert torch.equal(plain.couplings, before)


def _structure(module) -> tuple:
    """Parameter names, shapes, classes' freezing and ``requires_grad``; state-dict keys and flags (without
    MACE's U tensors, which this module does not hold)."""
    parameters = [(name, tuple(p.shape), p.requires_grad) for name, p in module.named_parameters()]
    state = _state_of(module)
    flags = {name: bool(value) for name, value in state.items() if name.endswith("_zeroed")}
    return parameters, list(state), flags


@pytest.mark.parametrize("configuration, counts", [
    (FROZEN, (144, 120)),
    (SMALL, (96, 96)),  # nothing zero
    (("2x0e+2x1o", "2x0o+2x1e+2x2e", 2, 3), (36, 12)),
    (("2x0e+2x1o", "2x0e+2x1e", 1, 3), (12, 6)),  # correlation 1: 1e's weights_max frozen
    (("2x0e+2x1o", "2x0e+2x1e", 4, 2), (88, 72)),  # 1e: weights[0] (order 3) frozen for order 1
    (FROZEN_ORDER_THREE, (76, 12)),
])
def test_frozen_weights_equal_mace(generator, configuration, counts):
    """The weights MACE freezes at zero (its EmptyParam, by its index mapping), its flags in the state dict,
    counts of parameters, for the module built here and the one taken from MACE."""
    theirs = mace_contraction(*configuration, generator)
    built = SymmetricContraction(*configuration[:3], num_elements=configuration[3], dtype=torch.float64)
    for ours in (built, SymmetricContraction.from_mace(theirs)):
        assert _structure(ours) == _structure(theirs)
        total = sum(p.numel() for p in ours.parameters())
        assert (total, sum(p.numel() for p in ours.parameters() if p.requires_grad)) == counts
        ours.requires_grad_(True)  # a no-op on the frozen weights, as on MACE's
        theirs.requires_grad_(True)
        assert _structure(ours) == _structure(theirs)
        for p in ours.parameters():
            assert p.requires_grad or not p.detach().any()
    built.load_state_dict(_state_of(theirs))
    _compare(theirs, built, generator, nodes=7, second=False)


def test_frozen_weights_get_no_gradient_and_survive_copies(generator):
    theirs = mace_contraction(*FROZEN, generator)
    ours = SymmetricContraction.from_mace(theirs)
    frozen = [name for name, p in ours.named_parameters() if not p.requires_grad]
    assert frozen == [name for name, p in theirs.named_parameters() if not p.requires_grad]
    x, elements, one_hot = inputs(generator, 6, 2, 9, 3)
    ours(x, one_hot).square().sum().backward()
    assert all(ours.get_parameter(name).grad is None for name in frozen)
    for copied in (copy.deepcopy(ours), copy.deepcopy(ours).float()):
        copied.requires_grad_(True)
        assert [name for name, p in copied.named_parameters() if not p.requires_grad] == frozen


def _node_attributes(kind: str, one_hot: torch.Tensor, generator) -> torch.Tensor:
    """Node attributes of ``kind`` with the shape of ``one_hot``; every kind but one-hot has a zero row."""
    nodes, num_elements = one_hot.shape
    if kind == "one-hot":
        return one_hot.clone()
    if kind == "scaled":  # at most one nonzero per row, of any sign
        y = one_hot * torch.randn(nodes, 1, generator=generator, dtype=torch.float64)
    elif kind == "soft":  # every entry nonzero
        y = torch.rand(nodes, num_elements, generator=generator, dtype=torch.float64) + 0.1
    else:  # mixed: some rows one-hot, some with two nonzeros
        y = one_hot.clone()
        rows = torch.arange(1, nodes, 2)
        y[rows, (one_hot[rows].argmax(1) + 1) % num_elements] = torch.rand(len(rows), generator=generator,
                                                                           dtype=torch.float64) + 0.5
    y[2] = 0
    return y


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("kind", ["one-hot", "scaled", "soft", "mixed"])
def test_node_attributes_equal_mace(generator, kind, requires_grad):
    """Any floating y, as in MACE (its y is linear): outputs, gradients of x, of the weights and of y."""
    theirs = mace_contraction(*FROZEN, generator)
    ours = SymmetricContraction.from_mace(theirs)
    x, _, one_hot = inputs(generator, 9, 2, 9, 3)
    y = _node_attributes(kind, one_hot, generator).requires_grad_(requires_grad)
    x.requires_grad_(True)
    expected, got = theirs(x, y), ours(x, y)
    assert_close(got, expected, "output")
    if kind != "one-hot":
        assert not got[2].any()
    cotangent = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    names = [name for name, p in theirs.named_parameters() if p.requires_grad]
    wrt = [x, *([y] if requires_grad else [])]
    g_theirs = torch.autograd.grad(expected, wrt + [theirs.get_parameter(name) for name in names], cotangent,
                                   create_graph=requires_grad)
    g_ours = torch.autograd.grad(got, wrt + [ours.get_parameter(name) for name in names], cotangent,
                                 create_graph=requires_grad)
    for i, (a, b) in enumerate(zip(g_ours, g_theirs)):
        assert_close(a, b, f"gradient {i}")
    if requires_grad:  # the derivative of y's gradient with respect to x (forces of an alchemical energy)
        direction = torch.randn(y.shape, generator=generator, dtype=torch.float64)
        assert_close(_grad((g_ours[1] * direction).sum(), [x])[0], _grad((g_theirs[1] * direction).sum(), [x])[0],
                     "second derivative")
