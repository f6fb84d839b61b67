"""Sums of edge rows by output row: the graph kernels' ``segment_sum`` (serial and threaded, sorted and unsorted
indices, empty rows) against a float64 loop (the fused graph op's gradient of gathered operands runs on it)."""
import numpy as np
import pytest
import torch

from sparse_accumulation import Index, backends
from sparse_accumulation.kernels.numba import graph as numba_graph

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
