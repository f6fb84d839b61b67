"""Message passing on paths no other test reaches, against the independent float64 reference of
``graph_helpers`` (gathered rows by plain indexing, products by the ``loops`` reference, rows summed by
``index_add``):

* the threaded numba path (``numba_graph._run_tasks`` with work >= ``SERIAL_WORK`` and more than one thread):
  segments of an unsorted index read through their ``order``, every grid row computed by exactly one task;
* operands without index that hold ONE row read by every edge: their gradient is the sum over the edges;
* ``gradgradcheck`` of every pattern of gathered / shared operands, on the numba and torch kernels.
"""
import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation.kernels.numba import graph as numba_graph
from graph_helpers import PATTERNS, assert_close_to, pattern_case, random_graph, reference, weighted_rule

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

IMPLEMENTATIONS = ("numba", "torch")


def _call(X1, X2, W, C, rule, indices, size_out, implementation):
    return sa.accumulate_rule(X1, X2, rule, C, W, indices_1=indices[0], indices_2=indices[1],
                              indices_w=indices[2], indices_out=indices[3], size_out=size_out,
                              implementation=implementation)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The ``(first, last)`` grid-row ranges of every numba graph kernel call made during the test."""
    calls = []
    original = numba_graph._kernel

    def spy(first, last, *args):
        calls.append((int(first), int(last)))
        return original(first, last, *args)

    monkeypatch.setattr(numba_graph, "_kernel", spy)
    return calls


def _threaded_case(generator, dtype, sorted_dst):
    """Operands of a call whose work (edges x channels x nonzeros) is at least twice ``SERIAL_WORK``: X1
    gathered by ``src``, the output summed by ``dst`` (unsorted: its segments need their order)."""
    rule, C = weighted_rule()
    nodes, edges, channels = 97, 5000, 8
    assert edges * channels * rule.nnz >= 2 * numba_graph.SERIAL_WORK
    src, dst = random_graph(generator, nodes, edges, sorted_dst)
    X1 = torch.randn(nodes, channels, 5, generator=generator, dtype=torch.float64).to(dtype)
    X2 = torch.randn(edges, 1, 3, generator=generator, dtype=torch.float64).to(dtype)
    W = torch.randn(edges, channels, 3, generator=generator, dtype=torch.float64).to(dtype)
    return X1, X2, W, C.to(dtype), rule, (src, None, None, dst), nodes


def _ran_in_tasks(calls, rows):
    """The kernel ran over ``rows`` grid rows in several tasks (the threaded path), not in one call."""
    return sum(1 for first, last in calls if last - first < rows) > 1


@pytest.mark.parametrize("sorted_dst", [False, True])
def test_threaded_path_sums_every_segment_through_its_order(generator, threads, kernel_calls, sorted_dst):
    """Above ``SERIAL_WORK`` with two threads the grid rows (segments of ``dst`` for the output, of ``src``
    for the gradient of X1) are cut into tasks; each segment must still sum the edges ``order`` lists for it
    (not the edges at its positions) and every row must be computed: values and all gradients equal the
    float64 reference."""
    X1, X2, W, C, rule, indices, size_out = _threaded_case(generator, torch.float64, sorted_dst)
    inputs = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
    ours = _call(*inputs[:3], inputs[3], rule, indices, size_out, "numba")
    assert _ran_in_tasks(kernel_calls, size_out), kernel_calls  # the forward ran in tasks
    leaves = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
    theirs = reference(*leaves[:3], leaves[3], rule, indices, size_out)
    assert_close_to(ours, theirs, 1e-12)
    G = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    kernel_calls.clear()
    grads = torch.autograd.grad(ours, inputs, G)
    assert _ran_in_tasks(kernel_calls, X1.shape[0]), kernel_calls  # dX1 by segments of src, in tasks
    for a, b in zip(grads, torch.autograd.grad(theirs, leaves, G)):
        assert_close_to(a, b, 1e-12)


def test_threaded_path_computes_every_edge_of_a_per_edge_output(generator, threads, kernel_calls):
    """Without ``indices_out`` the grid rows are the edges (no segments), cut into equal ranges: every edge's
    output row, the last one included, equals the float64 reference (a forward under ``no_grad``)."""
    X1, X2, W, C, rule, indices, _ = _threaded_case(generator, torch.float64, False)
    per_edge = (indices[0], None, None, None)
    with torch.no_grad():
        ours = _call(X1, X2, W, C, rule, per_edge, None, "numba")
    edges = X2.shape[0]
    assert _ran_in_tasks(kernel_calls, edges), kernel_calls
    assert {last for _, last in kernel_calls} >= {edges}  # the range that ends at the last edge ran
    theirs = reference(X1, X2, W, C, rule, per_edge, None)
    assert ours.shape == theirs.shape and ours.shape[0] == edges
    assert_close_to(ours, theirs, 1e-12)
    assert_close_to(ours[-1:], theirs[-1:], 1e-12)


#: relative tolerance (of the largest value) against the float64 reference of the same rounded inputs: a few
#: roundings of the compute dtype (float32; 16-bit inputs are computed in float32, then rounded once)
TOLERANCES = {torch.float32: 2e-6, torch.float16: 3e-3}


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_threaded_path_keeps_the_accuracy_of_the_dtype(generator, threads, kernel_calls, dtype):
    """The threaded path in float32 and float16 (computed in float32): within a few roundings of the dtype of
    the float64 reference of the same (rounded) inputs, values and the gradient of the gathered X1."""
    X1, X2, W, C, rule, indices, size_out = _threaded_case(generator, dtype, False)
    x1 = X1.clone().requires_grad_()
    ours = _call(x1, X2, W, C, rule, indices, size_out, "numba")
    assert _ran_in_tasks(kernel_calls, size_out), kernel_calls
    x1_ref = X1.double().requires_grad_()
    theirs = reference(x1_ref, X2.double(), W.double(), C.double(), rule, indices, size_out)
    assert ours.dtype == dtype
    assert_close_to(ours, theirs, TOLERANCES[dtype])
    G = torch.randn(ours.shape, generator=generator, dtype=torch.float64).to(dtype)
    (ours_grad,) = torch.autograd.grad(ours, x1, G)
    (their_grad,) = torch.autograd.grad(theirs, x1_ref, G.double())
    assert_close_to(ours_grad, their_grad, TOLERANCES[dtype])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_one_row_operands_get_the_gradient_summed_over_the_edges(generator, implementation):
    """X2 ``[1, 1, 3]`` and W ``[1, channels, 3]`` without index: ONE row that every edge reads. The output equals
    the reference with the row repeated for every edge, and the row's gradient is the sum of every edge's
    contribution (not the first edge's), to second order."""
    rule, C = weighted_rule()
    nodes, edges, channels = 6, 23, 3
    src, dst = random_graph(generator, nodes, edges)
    X1 = torch.randn(nodes, channels, 5, generator=generator, dtype=torch.float64)
    X2 = torch.randn(1, 1, 3, generator=generator, dtype=torch.float64)
    W = torch.randn(1, channels, 3, generator=generator, dtype=torch.float64)
    indices = (src, None, None, dst)
    inputs = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
    ours = _call(*inputs[:3], inputs[3], rule, indices, nodes, implementation)
    leaves = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
    repeated = [leaves[0], leaves[1].expand(edges, -1, -1), leaves[2].expand(edges, -1, -1)]
    theirs = reference(*repeated, leaves[3], rule, indices, nodes)
    assert_close_to(ours, theirs, 1e-12)
    G = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    ours_grads = torch.autograd.grad(ours, inputs, G, create_graph=True)
    their_grads = torch.autograd.grad(theirs, leaves, G, create_graph=True)
    assert ours_grads[1].shape == (1, 1, 3) and ours_grads[2].shape == (1, channels, 3)
    for a, b in zip(ours_grads, their_grads):
        assert_close_to(a, b, 1e-12)
    # second order: the gradient of <dX2, V> (a one-row cotangent) reaches X1, W and C through every edge
    V2 = torch.randn(1, 1, 3, generator=generator, dtype=torch.float64)
    VW = torch.randn(1, channels, 3, generator=generator, dtype=torch.float64)
    ours_second = torch.autograd.grad((ours_grads[1] * V2).sum() + (ours_grads[2] * VW).sum(), inputs)
    their_second = torch.autograd.grad((their_grads[1] * V2).sum() + (their_grads[2] * VW).sum(), leaves)
    for a, b in zip(ours_second, their_second):
        assert_close_to(a, b, 1e-12)


# ----------------------------------------------------------------------------------------------------------
# gradgradcheck of every pattern


@pytest.mark.parametrize("fast_mode", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_gradgradcheck_of_every_pattern(generator, implementation, pattern, fast_mode):
    """Values equal the float64 reference, and first and second derivatives with respect to every operand and
    C match finite differences, for each pattern: X1 gathered alone, X2 gathered, W gathered, all four indices,
    a rule without weights, one-row X2 and W read by every edge, operands shared by the channels
    ([rows, 1, M] against [rows, B, M]). ``fast_mode`` checks random projections of the Jacobians (every
    entry: the slow selection)."""
    operands, C, rule, indices, size_out = pattern_case(generator, pattern)
    inputs = tuple(t.requires_grad_() for t in operands + [C] if t is not None)
    weighted = operands[2] is not None

    def f(*args):
        W = args[2] if weighted else None
        return _call(args[0], args[1], W, args[-1], rule, indices, size_out, implementation)

    assert_close_to(f(*inputs), reference(*operands[:3], C, rule, indices, size_out), 1e-12)
    assert torch.autograd.gradcheck(f, inputs, fast_mode=fast_mode)
    assert torch.autograd.gradgradcheck(f, inputs, fast_mode=fast_mode)
