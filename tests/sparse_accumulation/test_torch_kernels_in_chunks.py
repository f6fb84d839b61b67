"""The plain-torch kernels (the portable fallback: CUDA while Triton compiles, exported programs) over several
chunks of rows and edges: every chunk's contribution reaches the outputs and the gradients (``+=``, not ``=``),
against the float64 ``loops`` reference, with the chunk size cut so that the small cases span several chunks."""
import pytest
import torch

import sparse_accumulation as sa
from graph_helpers import assert_close_to, random_graph, reference, weighted_rule
from sparse_accumulation.kernels.torch import accumulate as torch_accumulate
from sparse_accumulation.kernels.torch import graph as torch_graph

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN


def _gradients(out, inputs, generator):
    G = torch.randn(out.shape, generator=generator, dtype=out.dtype)
    return torch.autograd.grad(out, inputs, G, materialize_grads=True)


@pytest.mark.parametrize("shapes", [((7, 4), (7, 1), (1, 4)), ((7, 4), (1, 4), (7, 1))])
def test_rows_in_chunks_with_broadcast_operands(generator, monkeypatch, shapes):
    """``[A, B]`` rows in chunks of one or two ``A`` rows; operands broadcast over ``A`` (gradient summed over
    every chunk) and over ``B`` (summed within each chunk's rows); values and the gradients of X1, X2, W, C."""
    rule, C = weighted_rule()
    monkeypatch.setattr(torch_accumulate, "CHUNK_ELEMENTS", 2 * 4 * rule.nnz)  # two A rows a chunk
    lead1, lead2, lead_w = shapes
    X1 = torch.randn(*lead1, 5, generator=generator, dtype=torch.float64)
    X2 = torch.randn(*lead2, 3, generator=generator, dtype=torch.float64)
    W = torch.randn(*lead_w, 3, generator=generator, dtype=torch.float64)
    results = []
    for implementation in ("torch", "loops"):
        leaves = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
        out = sa.accumulate_rule(leaves[0], leaves[1], rule, leaves[3], leaves[2], implementation=implementation)
        results.append([out] + list(_gradients(out, leaves, torch.Generator().manual_seed(3))))
    for ours, theirs in zip(*results):
        assert_close_to(ours, theirs, 1e-12)


@pytest.mark.parametrize("indices", ["gathered and summed", "per edge"])
def test_edges_in_chunks(generator, monkeypatch, indices):
    """Message passing over edges in chunks of three: the output summed by ``dst`` (or one row per edge), the
    gradients of gathered X1, per-edge X2 and W, and C's, whose sum runs over every chunk."""
    rule, C = weighted_rule()
    channels = 2
    monkeypatch.setattr(torch_graph, "CHUNK_ELEMENTS", 3 * rule.nnz * channels)
    nodes, edges = 5, 13
    src, dst = random_graph(generator, nodes, edges)
    index = (src, None, None, dst if indices == "gathered and summed" else None)
    size_out = nodes if index[3] is not None else None
    X1 = torch.randn(nodes, channels, 5, generator=generator, dtype=torch.float64)
    X2 = torch.randn(edges, 1, 3, generator=generator, dtype=torch.float64)
    W = torch.randn(edges, channels, 3, generator=generator, dtype=torch.float64)
    ours_in = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
    ours = sa.accumulate_rule(ours_in[0], ours_in[1], rule, ours_in[3], ours_in[2], indices_1=index[0],
                              indices_out=index[3], size_out=size_out, implementation="torch")
    theirs_in = [t.clone().requires_grad_() for t in (X1, X2, W, C)]
    theirs = reference(*theirs_in[:3], theirs_in[3], rule, index, size_out)
    assert_close_to(ours, theirs, 1e-12)
    for a, b in zip(_gradients(ours, ours_in, torch.Generator().manual_seed(4)),
                    _gradients(theirs, theirs_in, torch.Generator().manual_seed(4))):
        assert_close_to(a, b, 1e-12)
