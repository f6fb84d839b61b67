"""sparse_accumulation.e3nn.TensorProduct against e3nn's o3.TensorProduct with irreps of multiplicity 0 in the
first input, the second input or the output: values, gradients (x, y, weights) and a double backward in float64,
weight counts and layouts, message passing, and the exception types e3nn raises.

e3nn computes nothing for an instruction on an irrep of multiplicity 0 and checks none of its multiplicities;
its weights count in ``weight_numel`` (nonzero for "uvu" into a ``0x`` output) and are not read. Two defects of
e3nn 0.6.0 shape the references: its generated code gives the instructions after such an instruction (one
whose ``path_shape`` has no 0) the outputs and weights of their predecessors, so those cases are compared with
e3nn given the same instructions with the skipped ones last (and the weights in that order); and its default
einsum optimization fails to build when such an instruction has weights, so e3nn is built with
``_optimize_einsums=False`` throughout (the same values)."""
import pytest
import torch

import sparse_accumulation  # noqa: F401  (registers the ops)

from products_helpers import relative_error

o3 = pytest.importorskip("e3nn.o3")
from sparse_accumulation.e3nn import TensorProduct  # noqa: E402

IMPLEMENTATIONS = ["numba", "torch"]
TOLERANCE = 1e-10

# in1 "2x1o + 2x0e + 0x1e", in2 "1o + 0e + 0x2o", out "2x1e + 0x0e + 2x1o": computed A, B, C; D and E have a 0 in
# path_shape (no weights); F and G write into 0x0e (F's 2 weights are counted, unread)
A, B, C = (0, 0, 0, "uvu", True), (1, 0, 2, "uvu", False), (0, 1, 2, "uvu", True)
D, E = (2, 0, 2, "uvu", True), (0, 2, 0, "uvu", True)
F, G = (0, 0, 1, "uvu", True), (0, 0, 1, "uvu", False)
MIXED = ("2x1o + 2x0e + 0x1e", "1o + 0e + 0x2o", "2x1e + 0x0e + 2x1o")

# id: (irreps_in1, irreps_in2, irreps_out, instructions, e3nn's order of them (None: the same), weight_numel)
CASES = {
    "uvu into 0x0e beside 1e": ("1o", "1o", "0x0e + 1e", [(0, 0, 0, "uvu", True)], None, 1),
    "uvu into 0x0e beside 2x1e": ("2x1o", "1o", "2x1e + 0x0e", [(0, 0, 1, "uvu", True)], None, 2),
    "uuu on 0x1o": ("0x1o + 2x0e", "0x1o + 2x0e", "2x0e + 2x1e",
                    [(0, 0, 0, "uuu", True), (1, 1, 0, "uuu", True), (0, 0, 1, "uuu", False)], None, 2),
    "uuu with in2 0x1o": ("2x1o + 2x0e", "0x1o + 2x0e", "2x0e + 2x1e",
                          [(1, 1, 0, "uuu", True), (0, 0, 1, "uuu", True)], None, 4),
    "mixed, skipped last": (*MIXED, [A, B, C, D, E, F, G], None, 6),
    "mixed, skipped first": (*MIXED, [F, A, G, B, D, C, E], [1, 3, 4, 5, 6, 0, 2], 6),
    "unread per-row weights only": ("2x0e", "2x0e", "2x0e + 0x0e", [(0, 0, 0, "uuu", False), (0, 0, 1, "uvu", True)],
                                    None, 4),
}


def modules(case, implementation, shared_weights=False, internal_weights=False, channels=False):
    """e3nn's TensorProduct (the instructions in its order) and ours (float64 coefficients); ``channels``: ours
    in the channel layout (the one CUDA tensors get), forced on CPU."""
    irreps_in1, irreps_in2, irreps_out, instructions, order, _ = CASES[case]
    kwargs = {"shared_weights": shared_weights, "internal_weights": internal_weights}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn computes its 3j symbols in the default dtype
    try:
        theirs = o3.TensorProduct(irreps_in1, irreps_in2, irreps_out,
                                  [instructions[i] for i in order] if order else instructions,
                                  _optimize_einsums=False, **kwargs)
        ours = TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, implementation=implementation,
                             **kwargs)
        if channels:
            ours = TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, implementation=implementation,
                                 channels=ours.channels, **kwargs)
    finally:
        torch.set_default_dtype(previous)
    if ours.internal_weights:
        ours.weight = theirs.weight  # one leaf for both
    return theirs, ours


def their_weights(ours, weight, order):
    """``weight``, laid out for ``ours`` (its instruction order), reordered for e3nn given the instructions in
    ``order``."""
    if order is None or weight is None:
        return weight
    views = {i: view.flatten(weight.dim() - 1) for i, _, view in ours.weight_views(weight, yield_instruction=True)}
    return torch.cat([views[i] for i in order if i in views], dim=-1)


def randn(generator, *shape):
    return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()


def gradients(out, leaves, G, create_graph=False):
    """``d(sum(out * G)) / d leaves``, zeros for leaves ``out`` does not depend on (an output of zeros included)."""
    if not out.requires_grad:
        return [torch.zeros_like(t) for t in leaves]
    return list(torch.autograd.grad((out * G).sum(), leaves, create_graph=create_graph, allow_unused=True,
                                    materialize_grads=True))


def assert_close(actual, expected, name):
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    assert relative_error(actual, expected) < TOLERANCE, name


def assert_matches(generator, expected_fn, actual_fn, leaves, second_order=False):
    """Values, first gradients and (``second_order``) the gradients of a function of the first gradients."""
    expected, actual = expected_fn(*leaves), actual_fn(*leaves)
    assert actual.dtype == expected.dtype
    assert_close(actual, expected, "value")
    G = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    first_expected = gradients(expected, leaves, G, create_graph=second_order)
    first_actual = gradients(actual, leaves, G, create_graph=second_order)
    for number, (a, b) in enumerate(zip(first_actual, first_expected)):
        assert_close(a, b, f"gradient {number}")
    if second_order:
        H = [torch.randn(g.shape, generator=generator, dtype=torch.float64) for g in first_expected]
        second = [gradients(sum((g * h).sum() for g, h in zip(first, H)), leaves, torch.ones(()))
                  for first in (first_expected, first_actual)]
        for number, (a, b) in enumerate(zip(second[1], second[0])):
            assert_close(a, b, f"second gradient {number}")


@pytest.mark.parametrize("channels", [False, True], ids=["rows", "channels"])
@pytest.mark.parametrize("shared_weights", [True, False], ids=["shared", "per-row"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_e3nn(generator, case, implementation, shared_weights, channels):
    order = CASES[case][4]
    theirs, ours = modules(case, implementation, shared_weights=shared_weights, channels=channels)
    assert ours.weight_numel == theirs.weight_numel == CASES[case][5]
    x, y = randn(generator, 5, theirs.irreps_in1.dim), randn(generator, 5, theirs.irreps_in2.dim)
    weight = randn(generator, *(() if shared_weights else (5,)), ours.weight_numel)
    assert_matches(generator, lambda x, y, w: theirs(x, y, their_weights(ours, w, order)),
                   lambda x, y, w: ours(x, y, w), [x, y, weight], second_order=case.startswith("mixed"))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_internal_weights_into_0x_irrep(generator, implementation):
    """The instruction into 0x0e keeps its 2 internal weights, unread: zeros, and zero gradients."""
    theirs, ours = modules("uvu into 0x0e beside 2x1e", implementation, shared_weights=None, internal_weights=None)
    assert ours.internal_weights and theirs.internal_weights and ours.weight.shape == (2,)
    x, y = randn(generator, 3, 6), randn(generator, 3, 3)
    assert_matches(generator, lambda x, y, w: theirs(x, y), lambda x, y, w: ours(x, y), [x, y, ours.weight])
    assert not ours(x, y).any()


def test_unread_per_row_weights_broadcast_like_e3nn(generator):
    """Per-row weights that no computed instruction reads still set the leading dimensions, as in e3nn."""
    theirs, ours = modules("unread per-row weights only", "numba")
    x, y, weight = randn(generator, 1, 2), randn(generator, 2), randn(generator, 4, 1, 4)
    assert_matches(generator, theirs, ours, [x, y, weight])
    assert ours(x, y, weight).shape == (4, 1, 2)


def test_weight_views_and_repr_match_e3nn(generator):
    theirs, ours = modules("mixed, skipped last", "numba")
    weight = torch.randn(3, theirs.weight_numel, generator=generator, dtype=torch.float64)
    pairs = list(zip(ours.weight_views(weight, yield_instruction=True),
                     theirs.weight_views(weight, yield_instruction=True)))
    assert len(pairs) == 5  # A, C, D, E, F
    for (i, ins, view), (j, their_ins, their_view) in pairs:
        assert i == j and ins.path_shape == their_ins.path_shape and torch.equal(view, their_view)
    for ours_ins, their_ins in zip(ours.instructions, theirs.instructions):
        assert ours_ins.path_weight == pytest.approx(their_ins.path_weight, rel=1e-14)
    assert repr(ours).replace("TensorProduct", "") == repr(theirs).replace("TensorProduct", "")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", ["mixed, skipped first", "uuu with in2 0x1o"])
def test_message_passing_matches_e3nn(generator, case, implementation):
    """``tp(x, y, w, indices_1=src, indices_out=dst, size_out=N)`` against e3nn's product of ``x[src]``,
    scattered into ``dst``."""
    order = CASES[case][4]
    theirs, ours = modules(case, implementation)
    nodes, edges = 4, 11
    src, dst = (torch.randint(0, nodes, (edges,), generator=generator) for _ in range(2))
    x = randn(generator, nodes, theirs.irreps_in1.dim)
    y, weight = randn(generator, edges, theirs.irreps_in2.dim), randn(generator, edges, ours.weight_numel)

    def expected(x, y, w):
        per_edge = theirs(x[src], y, their_weights(ours, w, order))
        return torch.zeros(nodes, per_edge.shape[1], dtype=torch.float64).index_add(0, dst, per_edge)

    assert_matches(generator, expected, lambda x, y, w: ours(x, y, w, indices_1=src, indices_out=dst, size_out=nodes),
                   [x, y, weight], second_order=True)


def test_message_passing_when_nothing_is_computed(generator):
    _, ours = modules("uvu into 0x0e beside 1e", "numba")
    x, y, weight = (torch.randn(*shape, generator=generator, dtype=torch.float64) for shape in ((3, 3), (7, 3), (7, 1)))
    src, dst = torch.randint(0, 3, (7,), generator=generator), torch.randint(0, 3, (7,), generator=generator)
    out = ours(x, y, weight, indices_1=src, indices_out=dst, size_out=3)
    assert out.shape == (3, 3) and not out.any()
    with pytest.raises(ValueError, match="size_out is required"):
        ours(x, y, weight, indices_1=src, indices_out=dst)


IRREPS = "2x0e + 2x1o"
UVU = [(0, 0, 0, "uvu", True)]


def _per_row(cls):
    return cls(IRREPS, "0e", IRREPS, UVU, shared_weights=False)


def _shared(cls):
    return cls(IRREPS, "0e", IRREPS, UVU, shared_weights=True, internal_weights=False)


# (exception type e3nn raises, what our message matches, the failing call given a TensorProduct class)
ERRORS = {
    "no weights": (RuntimeError, "weight is required", lambda cls: _per_row(cls)(torch.randn(3, 8), torch.randn(3, 1))),
    "x's last dimension": (AssertionError, r"x must be \[\.\.\., 8\]",
                           lambda cls: _per_row(cls)(torch.randn(3, 7), torch.randn(3, 1), torch.randn(3, 2))),
    "y's last dimension": (AssertionError, r"y must be \[\.\.\., 1\]",
                           lambda cls: _per_row(cls)(torch.randn(3, 8), torch.randn(3, 2), torch.randn(3, 2))),
    "shared weight shape": (AssertionError, r"weight must be \[2\]",
                            lambda cls: _shared(cls)(torch.randn(3, 8), torch.randn(3, 1), torch.randn(3, 2))),
    "per-row weights without rows": (AssertionError, "at least one batch dimension",
                                     lambda cls: _per_row(cls)(torch.randn(3, 8), torch.randn(3, 1), torch.randn(2))),
    "per-row weight count": (AssertionError, r"weight must be \[\.\.\., 2\]",
                             lambda cls: _per_row(cls)(torch.randn(3, 8), torch.randn(3, 1), torch.randn(3, 3))),
    "leading dimensions": (RuntimeError, "do not broadcast",
                           lambda cls: _per_row(cls)(torch.randn(3, 8), torch.randn(4, 1), torch.randn(3, 2))),
    "parity": (AssertionError, "cannot give", lambda cls: cls(IRREPS, IRREPS, IRREPS, [(0, 1, 0, "uvu", True)])),
    "uuu multiplicities": (AssertionError, "multiplicity", lambda cls: cls("2x0e", "3x0e", "2x0e",
                                                                          [(0, 0, 0, "uuu", True)])),
    "uvu multiplicities": (AssertionError, "multiplicity", lambda cls: cls("2x0e", "3x0e", "3x0e",
                                                                          [(0, 0, 0, "uvu", True)])),
    "index": (IndexError, "i_out=5", lambda cls: cls(IRREPS, IRREPS, IRREPS, [(0, 0, 5, "uvu", True)])),
    "mode": (KeyError, "unknown mode 'xyz'", lambda cls: cls(IRREPS, IRREPS, IRREPS, [(0, 0, 0, "xyz", True)])),
    "irrep_normalization": (AssertionError, "irrep_normalization", lambda cls: cls(IRREPS, IRREPS, IRREPS, UVU,
                                                                                   irrep_normalization="unit")),
    "in1_var": (AssertionError, "in1_var", lambda cls: cls(IRREPS, IRREPS, IRREPS, UVU, in1_var=[1.0])),
    "internal_weights": (AssertionError, "needs shared_weights",
                         lambda cls: cls(IRREPS, IRREPS, IRREPS, UVU, internal_weights=True, shared_weights=False)),
}


@pytest.mark.parametrize("error", list(ERRORS))
def test_errors_have_e3nn_types(error):
    """e3nn's exception type (checked on e3nn itself) and, for existing callers, a ValueError."""
    kind, message, call = ERRORS[error]
    with pytest.raises(kind):
        call(o3.TensorProduct)
    with pytest.raises(kind, match=message) as caught:
        call(TensorProduct)
    assert isinstance(caught.value, ValueError)
