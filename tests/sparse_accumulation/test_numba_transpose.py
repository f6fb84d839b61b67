"""Row-block transposition of the numba kernels (vector tiles written as LLVM IR) against numpy, for every width
class (tiles of 8, narrow tiles of 3, 5 and 7 components, element loops), both float dtypes, block lengths
that leave partial tiles, and rows that end exactly at the end of their buffer: nothing outside the rows may be
written."""
import numba
import numpy as np
import pytest

from sparse_accumulation.kernels.numba import transpose as numba_transpose
from sparse_accumulation.kernels.numba.transpose import columns_to_rows, rows_to_columns

WIDTHS = list(range(1, 20))
COUNTS = [0, 1, 7, 8, 9, 23, 64, 77]


@numba.njit
def _gather(x, start, n, scratch):
    rows_to_columns(x, start, n, scratch)


@numba.njit
def _scatter(scratch, start, n, out):
    columns_to_rows(scratch, start, n, out)


@numba.njit
def _tile(source, source_start, source_stride, target, target_start, target_stride):
    numba_transpose.transpose8(source, source_start, source_stride, target, target_start, target_stride)


def _random(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M", WIDTHS)
def test_rows_to_columns(M, dtype):
    rng = np.random.default_rng()
    for n in COUNTS:
        start = int(rng.integers(0, 3)) * M
        x = _random(rng, start + n * M, dtype)  # the rows end where the buffer ends
        scratch = _random(rng, (M, max(n, 1) + 5), dtype)
        before = scratch.copy()
        _gather(x, start, n, scratch)
        np.testing.assert_array_equal(scratch[:, :n], x[start:].reshape(n, M).T)
        np.testing.assert_array_equal(scratch[:, n:], before[:, n:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M", WIDTHS)
def test_columns_to_rows_writes_only_its_rows(M, dtype):
    rng = np.random.default_rng()
    for n in COUNTS:
        start, after = int(rng.integers(0, 3)) * M, int(rng.integers(0, 2)) * 11
        out = _random(rng, start + n * M + after, dtype)
        before = out.copy()
        scratch = _random(rng, (M, max(n, 1) + 5), dtype)
        # the kernel hands over a buffer that ends with the rows, or one with more elements after them
        target = out if after else out[:start + n * M]
        _scatter(scratch, start, n, target)
        np.testing.assert_array_equal(out[start:start + n * M].reshape(n, M), scratch[:, :n].T)
        np.testing.assert_array_equal(out[:start], before[:start])
        np.testing.assert_array_equal(out[start + n * M:], before[start + n * M:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tile_with_strides(dtype):
    rng = np.random.default_rng()
    source = _random(rng, 200, dtype)
    target = _random(rng, 300, dtype)
    expected = target.copy()
    _tile(source, 3, 21, target, 5, 33)
    for i in range(8):
        for j in range(8):
            expected[5 + j * 33 + i] = source[3 + i * 21 + j]
    np.testing.assert_array_equal(target, expected)
