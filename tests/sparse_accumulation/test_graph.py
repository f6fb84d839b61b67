"""Message passing (``accumulate_rule`` with row indices, :mod:`sparse_accumulation.ops.graph`) on the CPU kernels
(numba, torch) against an independent float64 reference: gathered rows, summed rows, gradients to second
order, edge cases and bad input."""
import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation import Index, accumulate_graph
from graph_helpers import random_graph, reference, weighted_rule

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

IMPLEMENTATIONS = ("numba", "torch")
TOLERANCES = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def _call(X1, X2, W, C, rule, indices, size_out, implementation, reduction=None):
    return sa.accumulate_rule(X1, X2, rule, C, W, indices_1=indices[0], indices_2=indices[1],
                              indices_w=indices[2], indices_out=indices[3], size_out=size_out,
                              implementation=implementation, reduction=reduction)


def _relative(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def _case(generator, dtype, channels, pattern, sorted_dst, nodes=7, edges=40):
    """Operands and indices of a random message-passing call: ``pattern`` says which operands are gathered
    (``1``: X1, ``2``: X2, ``w``: W, ``o``: the output summed by destination)."""
    rule, C = weighted_rule()
    src, dst = random_graph(generator, nodes, edges, sorted_dst)
    other = torch.randint(0, 3, (edges,), generator=generator)
    rows = {"1": nodes, "2": 3, "w": 4}
    shapes = {"1": (channels, 5), "2": (1, 3), "w": (channels, 3)}

    def operand(key):
        n = rows[key] if key in pattern else edges
        return torch.randn(n, *shapes[key], generator=generator, dtype=torch.float64).to(dtype)

    X1, X2, W = operand("1"), operand("2"), operand("w")
    indices = (src if "1" in pattern else None, other if "2" in pattern else None,
               torch.randint(0, 4, (edges,), generator=generator) if "w" in pattern else None,
               dst if "o" in pattern else None)
    return X1, X2, W, C.to(dtype), rule, indices, nodes if "o" in pattern else None


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("pattern,sorted_dst", [("1o", False), ("1o", True), ("12wo", False), ("o", False),
                                                ("1", False), ("2w", False)])
def test_values_and_gradients_match_the_reference(generator, implementation, pattern, sorted_dst):
    X1, X2, W, C, rule, indices, size_out = _case(generator, torch.float64, 4, pattern, sorted_dst)
    inputs = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
    ours = _call(*inputs[:3], inputs[3], rule, indices, size_out, implementation)
    theirs = reference(X1.requires_grad_(), X2.requires_grad_(), W.requires_grad_(), C.requires_grad_(), rule,
                       indices, size_out)
    assert ours.shape == theirs.shape
    assert _relative(ours, theirs) < 1e-12
    G = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(ours, inputs, G), torch.autograd.grad(theirs, (X1, X2, W, C), G)):
        assert _relative(a, b) < 1e-12


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_gradcheck_and_gradgradcheck(generator, implementation):
    X1, X2, W, C, rule, indices, size_out = _case(generator, torch.float64, 2, "1o", False, nodes=4, edges=9)
    inputs = tuple(t.requires_grad_() for t in (X1, X2, W, C))

    def f(a, b, w, c):
        return _call(a, b, w, c, rule, indices, size_out, implementation)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_other_dtypes(generator, dtype):
    X1, X2, W, C, rule, indices, size_out = _case(generator, dtype, 4, "1o", False)
    ours = _call(X1, X2, W, C, rule, indices, size_out, "numba")
    assert ours.dtype == dtype
    assert _relative(ours, reference(X1, X2, W, C, rule, indices, size_out)) < TOLERANCES[dtype]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_empty_repeated_and_missing_rows(generator, implementation):
    rule, C = weighted_rule()
    X1 = torch.randn(6, 2, 5, generator=generator, dtype=torch.float64)
    W = torch.randn(5, 2, 3, generator=generator, dtype=torch.float64)
    X2 = torch.randn(5, 1, 3, generator=generator, dtype=torch.float64)
    src = torch.tensor([3, 3, 3, 0, 5])
    dst = torch.tensor([2, 2, 4, 2, 0])  # rows 1, 3, 5 receive nothing; edges repeat
    indices = (src, None, None, dst)
    ours = _call(X1, X2, W, C, rule, indices, 6, implementation)
    assert _relative(ours, reference(X1, X2, W, C, rule, indices, 6)) < 1e-12
    assert (ours[[1, 3, 5]] == 0).all()
    empty = torch.zeros(0, dtype=torch.int64)
    none = _call(X1, X2[:0], W[:0], C, rule, (empty, None, None, empty), 6, implementation)
    assert none.shape == (6, 2, 5) and (none == 0).all()


def test_results_are_bitwise_reproducible(generator):
    X1, X2, W, C, rule, indices, size_out = _case(generator, torch.float32, 8, "1o", False, nodes=50, edges=3000)
    first = _call(X1, X2, W, C, rule, indices, size_out, "numba")
    assert torch.equal(first, _call(X1, X2, W, C, rule, indices, size_out, "numba"))


def test_atomic_reduction_gives_the_same_sums_on_the_cpu(generator):
    X1, X2, W, C, rule, indices, size_out = _case(generator, torch.float64, 4, "1o", False)
    segment = _call(X1, X2, W, C, rule, indices, size_out, "numba")
    assert torch.equal(segment, _call(X1, X2, W, C, rule, indices, size_out, "numba", reduction="atomic"))


def test_prepared_index_objects(generator):
    X1, X2, W, C, rule, (src, _, _, dst), size_out = _case(generator, torch.float64, 4, "1o", False)
    prepared = (Index(src, 7), None, None, Index(dst, 7))
    assert not prepared[3].sorted
    assert Index(dst.sort().values, 7).sorted
    offsets, order = prepared[3].segments()
    assert torch.equal(dst[order], dst.sort(stable=True).values)
    assert torch.equal(offsets, torch.searchsorted(dst.sort().values, torch.arange(8)))
    ours = _call(X1, X2, W, C, rule, prepared, size_out, "numba")
    assert torch.equal(ours, _call(X1, X2, W, C, rule, (src, None, None, dst), size_out, "numba"))


def test_the_sorted_flag_never_skips_work_it_cannot_verify(generator):
    """``sorted=True`` is checked (with ``check``) and refused for unsorted values; without ``check`` nothing is
    read and the index is sorted anyway: the sums are right either way."""
    X1, X2, W, C, rule, (src, _, _, dst), size_out = _case(generator, torch.float64, 4, "1o", False)
    assert not bool((dst[1:] >= dst[:-1]).all())
    with pytest.raises(ValueError, match="index is not sorted"):
        Index(dst, 7, sorted=True)
    unchecked = Index(dst, 7, sorted=True, check=False)
    assert not unchecked.sorted
    expected = reference(X1, X2, W, C, rule, (src, None, None, dst), size_out)
    got = _call(X1, X2, W, C, rule, (src, None, None, unchecked), size_out, "numba")
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    ordered = dst.sort().values
    assert Index(ordered, 7, sorted=True).sorted and not Index(ordered, 7, sorted=False).sorted


def test_an_index_changed_in_place_after_it_was_made_is_refused(generator):
    X1, X2, W, C, rule, (src, _, _, dst), size_out = _case(generator, torch.float64, 4, "1o", False)
    prepared = Index(dst, 7)
    assert prepared.tensor is dst  # an int64 contiguous index is held, not copied
    dst[0] = (dst[0] + 1) % 7
    with pytest.raises(ValueError, match="indices_out: the index tensor was changed in place"):
        _call(X1, X2, W, C, rule, (src, None, None, prepared), size_out, "numba")


@pytest.mark.parametrize("bad,error,match", [
    ({"indices_1": "high"}, IndexError, "indices_1 contains row 7"),
    ({"indices_out": "negative"}, IndexError, "indices_out contains a negative"),
    ({"indices_1": "float"}, TypeError, "indices_1 must have an integer dtype"),
    ({"indices_1": "short"}, ValueError, "indices_out has 40 entries but indices_1 has 39"),
    ({"indices_1": "2d"}, ValueError, "must be 1-D"),
    ({"size_out": None}, ValueError, "size_out is required"),
    ({"reduction": "sum"}, ValueError, "reduction must be one of"),
])
def test_bad_input_raises_a_clear_error(generator, bad, error, match):
    X1, X2, W, C, rule, (src, _, _, dst), _ = _case(generator, torch.float64, 4, "1o", False)
    forms = {"high": src.clone().fill_(7), "negative": dst.clone().fill_(-1), "float": src.double(),
             "short": src[:-1], "2d": src[:, None]}
    kwargs = {"indices_1": src, "indices_out": dst, "size_out": 7}
    for key, value in bad.items():
        kwargs[key] = forms.get(value, value)
    with pytest.raises(error, match=match):
        sa.accumulate_rule(X1, X2, rule, C, W, implementation="numba", **kwargs)


def test_operand_rows_must_match_the_edges(generator):
    X1, X2, W, C, rule, (src, _, _, dst), _ = _case(generator, torch.float64, 4, "1o", False)
    with pytest.raises(ValueError, match="W has 39 rows but there are 40 edges"):
        sa.accumulate_rule(X1, X2, rule, C, W[:-1], indices_1=src, indices_out=dst, size_out=7)
    with pytest.raises(ValueError, match="needs a row dimension"):
        sa.accumulate_rule(X1[0, 0], X2[0, 0], rule, C, W[0, 0], indices_out=dst, size_out=7)


def test_channel_rule_api_errors():
    rule, C = weighted_rule()
    crule = sa.ChannelRule.regular(rule, 4, (4, 1, 4, 4))
    X1, X2, W = torch.randn(3, 20), torch.randn(5, 3), torch.randn(5, 12)
    with pytest.raises(ValueError, match="X1 must be \\[rows, 20\\]"):
        accumulate_graph(crule, X1[:, :19], X2, C.float(), W, indices_1=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="W is required"):
        accumulate_graph(crule, X1, X2, C.float(), None, indices_1=torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="C must have the dtype"):
        accumulate_graph(crule, X1, X2, C, W, indices_1=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="one row per edge \\(5\\), got size_out=4"):
        accumulate_graph(crule, X1, X2, C.float(), W, indices_1=torch.zeros(5, dtype=torch.long), size_out=4)


def test_index_on_another_device_is_refused(generator):
    X1, X2, W, C, rule, (src, _, _, dst), _ = _case(generator, torch.float64, 4, "1o", False)
    with pytest.raises(ValueError, match="indices_1 is on meta but the operands are on cpu"):
        sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src.to("meta"), indices_out=dst, size_out=7)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_registered_ops_pass_opcheck(generator, implementation):
    from sparse_accumulation.ops.graph import registered as graph_ops

    X1, X2, W, C, rule, (src, _, _, dst), _ = _case(generator, torch.float64, 2, "1o", False, nodes=4, edges=9)
    crule = sa.ChannelRule.regular(rule, 2, (2, 1, 2, 2))
    operands = [X1.reshape(4, -1).requires_grad_(), X2.reshape(9, -1).requires_grad_(),
                W.reshape(9, -1).requires_grad_(), None]
    args = (*operands, C.requires_grad_(), [src, None, None, dst], [None] * 4, [None] * 4, crule.key, [3],
            [4, 9, 9, 4], 9, implementation, "segment")
    torch.library.opcheck(graph_ops.graph_accumulate, args)
    sums = (*operands[:3], torch.randn(4, crule.maps[3].width, generator=generator, dtype=torch.float64),
            [src, None, None, dst], crule.key, 9, implementation)
    torch.library.opcheck(graph_ops.graph_coefficient_sums, sums)


def test_compiled_calls_match_eager(generator):
    X1, X2, W, C, rule, indices, size_out = _case(generator, torch.float64, 4, "1o", False)

    def f(a, b, w):
        return _call(a, b, w, C, rule, indices, size_out, "numba")

    torch.compiler.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    inputs = [t.clone().requires_grad_() for t in (X1, X2, W)]
    ours, theirs = compiled(*inputs), f(X1, X2, W)
    assert torch.equal(ours, theirs)
    G = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    eager_inputs = [t.clone().requires_grad_() for t in (X1, X2, W)]
    for a, b in zip(torch.autograd.grad(ours, inputs, G), torch.autograd.grad(f(*eager_inputs), eager_inputs, G)):
        assert torch.equal(a, b)


def test_registered_op_gradients_inside_a_checkpoint(generator):
    """Under a dispatch mode (calls take the registered ops) inside ``torch.utils.checkpoint``, whose backward may
    unpack each saved tensor once: the gradients equal those of a plain call (float64)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    nodes, edges = 6, 25
    m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1, dtype=torch.float64)
    rule = sa.Rule(m1, m2, mu, 3)
    edge_index = torch.randint(0, nodes, (2, edges), generator=generator)
    x = torch.randn(nodes, 2, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    y = torch.randn(edges, 2, 3, generator=generator, dtype=torch.float64, requires_grad=True)

    def call(x, y):
        return sa.accumulate_rule(x, y, rule, C, indices_1=edge_index[0], indices_out=edge_index[1], size_out=nodes)

    expected = torch.autograd.grad(call(x, y).pow(2).sum(), (x, y))
    with Passthrough():
        got = torch.autograd.grad(checkpoint(call, x, y, use_reentrant=False).pow(2).sum(), (x, y))
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(g, e, rtol=1e-12, atol=1e-12)
