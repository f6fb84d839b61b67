"""Index tensors edited in place between calls: what is prepared from them (checked, sorted, turned into a
rule) is remembered by identity AND version counter (:mod:`sparse_accumulation.indices`), so a call after
``t[0] = ...`` or ``t.copy_(...)`` must compute with the new values. Each test calls, edits the index tensor in
place, calls again and compares both results with an independent float64 reference of the indices as they
were at each call: the tensor API's rule (``m1``, ``m2``, ``mu``), message-passing indices (``indices_1``,
``indices_out``, int64 and int32), MACE's elements (indices and one-hot rows) and HIP-NN's pairs."""
import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import oracle, random_rule
from graph_helpers import assert_close_to, random_graph, reference, weighted_rule
from pair_sums_helpers import LOOPS, arguments, random_inputs
from polynomial_helpers import reference as polynomial_reference
from sparse_accumulation.indices import Elements
from sparse_accumulation.mace import SymmetricContraction


def _changed(t, size, generator):
    """New values for index ``t`` in ``[0, size)`` that differ from the old ones in every entry."""
    shift = torch.randint(1, size, t.shape, generator=generator)
    return ((t.long() + shift) % size).to(t.dtype)


@pytest.mark.parametrize("edited", ["m1", "m2", "mu"])
@pytest.mark.parametrize("how", ["item", "copy_"])
def test_tensor_api_uses_the_edited_rule(generator, edited, how):
    """``accumulate(X1, X2, mu, output_size, m1, m2, C)`` after ``mu[0] = ...`` (or ``m1.copy_(...)``) computes
    with the new index values (the remembered rule of the old values is not used), values and gradients."""
    M1, M2, O = 5, 4, 6
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=20)
    X1 = torch.randn(7, 3, M1, generator=generator, dtype=torch.float64, requires_grad=True)
    X2 = torch.randn(7, 3, M2, generator=generator, dtype=torch.float64)
    first = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    assert_close_to(first, oracle(X1, X2, mu, O, m1, m2, C), 1e-12)
    index, size = {"m1": (m1, M1), "m2": (m2, M2), "mu": (mu, O)}[edited]
    new = _changed(index, size, generator)
    if how == "item":
        index[0] = new[0]
    else:
        index.copy_(new)
    second = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    expected = oracle(X1, X2, mu.clone(), O, m1.clone(), m2.clone(), C)
    assert not torch.allclose(first.detach(), expected)  # the edit changes the result
    assert_close_to(second, expected, 1e-12)
    G = torch.randn(second.shape, generator=generator, dtype=torch.float64)
    (ours,) = torch.autograd.grad(second, X1, G)
    x1 = X1.detach().clone().requires_grad_()
    (theirs,) = torch.autograd.grad(sa.reference.loops(x1, X2, mu.clone(), O, m1.clone(), m2.clone(), C), x1, G)
    assert_close_to(ours, theirs, 1e-12)


def _graph_call(X1, X2, W, C, rule, src, dst, nodes, implementation):
    return sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes,
                              implementation=implementation)


@pytest.mark.parametrize("implementation", ["numba", "torch"])
@pytest.mark.parametrize("edited", ["indices_out", "indices_1", "indices_1-int32", "indices_out-sorted"])
def test_graph_indices_edited_in_place(generator, implementation, edited):
    """Message passing after ``dst.copy_(...)`` / ``src.copy_(...)`` sums and gathers by the new values: the
    remembered :class:`Index` (its check, sorting permutation and segments) of the old values is not used.
    Values and the gradient of the gathered X1 (summed by the segments of ``indices_1``) equal the reference."""
    rule, C = weighted_rule()
    nodes, edges, channels = 9, 60, 3
    src, dst = random_graph(generator, nodes, edges, sorted_dst=edited == "indices_out-sorted")
    if edited == "indices_1-int32":
        src = src.to(torch.int32)
    X1 = torch.randn(nodes, channels, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    X2 = torch.randn(edges, 1, 3, generator=generator, dtype=torch.float64)
    W = torch.randn(edges, channels, 3, generator=generator, dtype=torch.float64)
    G = torch.randn(nodes, channels, 5, generator=generator, dtype=torch.float64)

    def check(out):
        x1 = X1.detach().clone().requires_grad_()
        theirs = reference(x1, X2, W, C, rule, (src.long().clone(), None, None, dst.clone()), nodes)
        assert_close_to(out, theirs, 1e-12)
        assert_close_to(torch.autograd.grad(out, X1, G)[0], torch.autograd.grad(theirs, x1, G)[0], 1e-12)
        return theirs.detach()

    before = check(_graph_call(X1, X2, W, C, rule, src, dst, nodes, implementation))
    index = dst if edited.startswith("indices_out") else src
    index.copy_(_changed(index, nodes, generator))
    after = check(_graph_call(X1, X2, W, C, rule, src, dst, nodes, implementation))
    assert not torch.allclose(before, after)


def _contraction(generator):
    module = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", 3, num_elements=3, dtype=torch.float64,
                                  implementation="numba")
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
    return module


def _contraction_reference(module, x, elements):
    """The module's program term by term, node by node, for elements ``elements`` (brute force, float64)."""
    flat = x.reshape(x.shape[0], -1)
    table = module.weight_table().detach()
    return polynomial_reference(module.program, [flat, table], Elements(elements.clone(), module.num_elements))[0]


@pytest.mark.parametrize("form", ["indices", "one-hot"])
def test_mace_elements_edited_in_place(generator, form):
    """``SymmetricContraction(x, y)`` after ``y.copy_(...)`` uses the new elements (the remembered sorted
    :class:`Elements` of the old ``y`` is not used), for element indices and one-hot rows."""
    module = _contraction(generator)
    nodes = 40
    x = torch.randn(nodes, 2, 4, generator=generator, dtype=torch.float64)
    elements = torch.randint(0, 3, (nodes,), generator=generator)
    y = elements.clone() if form == "indices" else torch.nn.functional.one_hot(elements, 3).double()
    with torch.no_grad():
        before = module(x, y)
        assert_close_to(before, _contraction_reference(module, x, elements), 1e-12)
        edited = _changed(elements, 3, generator)
        y.copy_(edited if form == "indices" else torch.nn.functional.one_hot(edited, 3).double())
        after = module(x, y)
    expected = _contraction_reference(module, x, edited)
    assert not torch.allclose(before, expected)
    assert_close_to(after, expected, 1e-12)


@pytest.mark.parametrize("name", ["envsum", "sensesum", "featsum"])
@pytest.mark.parametrize("edited", ["pair_first", "pair_second", "pair_second-int32"])
def test_hippynn_pairs_edited_in_place(generator, name, edited):
    """HIP-NN's interaction sums after ``pair_first.copy_(...)`` (or ``pair_second``) use the new pairs: the
    remembered range check and segments (the pairs sorted by atom) of the old values are not used."""
    index_dtype = torch.int32 if edited.endswith("int32") else torch.int64
    n_atoms = 8
    s, z, env, first, second = random_inputs(generator, n_atoms=n_atoms, n_pairs=45, index_dtype=index_dtype)
    function = getattr(sa, name)
    before = function(*arguments(name, s, z, env, first, second), implementation="numba")
    assert_close_to(before, LOOPS[name](*arguments(name, s, z, env, first, second)), 1e-12)
    index = first if edited == "pair_first" else second
    index.copy_(_changed(index, n_atoms, generator))
    after = function(*arguments(name, s, z, env, first, second), implementation="numba")
    expected = LOOPS[name](*arguments(name, s, z, env, first.clone(), second.clone()))
    assert not torch.allclose(before, expected)
    assert_close_to(after, expected, 1e-12)
