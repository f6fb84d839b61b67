"""Sums of edge rows by output row: the graph kernels' ``segment_sum`` (serial and threaded, sorted and unsorted
indices, empty rows) against a float64 loop, and the eager gather / sum pair of the per-edge message passing
(``ops.graph.api.gather_rows`` and ``sum_messages``) to second order."""
import numpy as np
import pytest
import torch

from sparse_accumulation import Index, backends
from sparse_accumulation.kernels.numba import graph as numba_graph
from sparse_accumulation.ops.graph.api import gather_rows, sum_messages

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN


def _loop_sums(Z: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    out = np.zeros((rows, Z.shape[1]))
    for e, r in enumerate(index.tolist()):
        out[r] += Z[e].double().numpy()
    return torch.from_numpy(out)


@pytest.mark.parametrize("implementation", ["numba", "torch"])
@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "unsorted"])
@pytest.mark.parametrize("edges,rows,width", [(50, 9, 7), (3000, 400, 97)], ids=["serial", "threaded"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_segment_sum_kernels(generator, monkeypatch, implementation, sort, edges, rows, width, dtype):
    if edges > 1000:  # the pool's path at a size the tests can afford
        monkeypatch.setattr(numba_graph, "SEGMENT_SUM_SERIAL_VALUES", edges * width)
        if torch.get_num_threads() == 1:
            pytest.skip("one thread: no threaded path")
    # rows 0 and rows - 1 receive nothing: empty segments at both ends and inside
    index = torch.randint(1, rows - 1, (edges,), generator=generator)
    index[index == rows // 2] = rows // 2 + 1
    if sort:
        index = index.sort().values
    Z = torch.randn(edges, width, generator=generator, dtype=torch.float64).to(dtype)
    prepared = Index(index, rows)
    assert prepared.sorted == sort
    got = backends.kernel_module("graph", implementation).segment_sum(Z, prepared.segments(), rows)
    expected = _loop_sums(Z, index, rows)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert got.dtype == dtype and got.shape == (rows, width)
    assert torch.allclose(got.double(), expected, rtol=tolerance, atol=tolerance * float(expected.abs().max()))
    assert not got[0].any() and not got[rows - 1].any() and not got[rows // 2].any()


@pytest.mark.parametrize("edges", [40, 3000], ids=["serial", "threaded"])
def test_gather_and_sum_of_messages_to_second_order(generator, monkeypatch, edges):
    nodes, width = 30, 100
    monkeypatch.setattr(numba_graph, "SEGMENT_SUM_SERIAL_VALUES", 40 * width + 1)
    src = torch.randint(0, nodes, (edges,), generator=generator)
    dst = torch.randint(0, nodes - 1, (edges,), generator=generator)  # the last node receives nothing
    x = torch.randn(nodes, width, generator=generator, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(edges, width, generator=generator, dtype=torch.float64, requires_grad=True)
    src_index, dst_index = Index(src, nodes), Index(dst, nodes)

    def ours(x, scale):
        return sum_messages(gather_rows(x, src_index, None) * scale, dst_index, nodes, None)

    def theirs(x, scale):
        return torch.zeros(nodes, width, dtype=x.dtype).index_add(0, dst, x[src] * scale)

    got = ours(x, scale)
    assert torch.allclose(got, theirs(x, scale), rtol=1e-12, atol=1e-12)
    assert got.grad_fn is not None and "SumByRow" in type(got.grad_fn).__name__
    G = torch.randn(nodes, width, generator=generator, dtype=torch.float64)
    found = torch.autograd.grad(ours(x, scale), (x, scale), G, create_graph=True)
    expected = torch.autograd.grad(theirs(x, scale), (x, scale), G, create_graph=True)
    for a, b in zip(found, expected):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    second = torch.autograd.grad(sum(g.pow(2).sum() for g in found), (x, scale))
    second_expected = torch.autograd.grad(sum(g.pow(2).sum() for g in expected), (x, scale))
    for a, b in zip(second, second_expected):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    if edges == 40:
        small = (x.detach()[:, :3].clone().requires_grad_(), scale.detach()[:, :3].clone().requires_grad_())
        subset = (Index(src, nodes), Index(dst, nodes))

        def f(a, b):
            return sum_messages(gather_rows(a, subset[0], None) * b, subset[1], nodes, None)

        assert torch.autograd.gradcheck(f, small) and torch.autograd.gradgradcheck(f, small)
