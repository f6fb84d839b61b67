"""Kept CPU output buffers: handed out again only once nothing references them, within the byte limit."""
import numpy as np
import torch

import sparse_accumulation as sa
from sparse_accumulation.kernels.numba import buffers
from accumulation_helpers import assert_close_to, random_rule


def _address(a) -> int:
    return a.__array_interface__["data"][0]


def test_a_buffer_is_reused_only_when_free():
    buffers.release()
    shape = (buffers.MIN_BYTES // 4 + 10, 1)
    first = buffers.empty(shape, np.float32)
    held = torch.from_numpy(first[:5])  # a view of a view keeps the buffer alive
    address = _address(first)
    del first
    second = buffers.empty(shape, np.float32)
    assert _address(second) != address
    del held
    third = buffers.empty(shape, np.float32)
    assert _address(third) == address and third.shape == shape and third.dtype == np.float32
    small = buffers.empty((3, 4), np.float64)
    assert small.shape == (3, 4) and len(buffers._kept) == 2  # small arrays are not kept
    buffers.release()


def test_the_byte_limit_drops_free_buffers_first(monkeypatch):
    buffers.release()
    monkeypatch.setattr(buffers, "MAX_BYTES", 3 * buffers.MIN_BYTES)
    live = [buffers.empty((buffers.MIN_BYTES,), np.uint8) for _ in range(2)]
    for _ in range(4):  # each free buffer of a different size is dropped to make room
        buffers.empty((buffers.MIN_BYTES + 7 * buffers.MIN_BYTES // 10,), np.uint8)
    assert buffers._kept_bytes() <= buffers.MAX_BYTES
    kept = {id(b) for b in buffers._kept.values()}
    assert all(id(v.base) in kept for v in live)  # buffers in use are never dropped
    buffers.release()


def test_results_held_by_the_caller_are_never_overwritten(generator):
    """Outputs of consecutive calls, all kept alive, stay what each call computed."""
    m1, m2, mu, C = random_rule(generator, 5, 5, 5, nnz=20, dtype=torch.float32)
    rows = buffers.MIN_BYTES // 20 + 100
    inputs = [(torch.randn(rows, 5, generator=generator), torch.randn(rows, 5, generator=generator))
              for _ in range(3)]
    outputs = [sa.accumulate(a, b, mu, 5, m1, m2, C, implementation="numba") for a, b in inputs]
    for (a, b), out in zip(inputs, outputs):
        assert_close_to(out, sa.reference.index_add(a.double(), b.double(), mu, 5, m1, m2, C.double()),
                        torch.float32)
