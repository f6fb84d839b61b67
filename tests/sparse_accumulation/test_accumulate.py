"""Forward values of every implementation, dtype and layout against the float64 brute-force oracle."""
import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import assert_close_to, oracle, random_rule

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

REFERENCES = ["loops", "index_add", "dense", "sparse"]
CPU_IMPLEMENTATIONS = ["numba", "torch"] + REFERENCES
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
LEADING_SHAPES = [(), (0,), (1,), (7,), (5, 3), (2, 3, 4)]


def _inputs(generator, lead, M1, M2, dtype):
    X1 = torch.randn(*lead, M1, generator=generator, dtype=torch.float64).to(dtype)
    X2 = torch.randn(*lead, M2, generator=generator, dtype=torch.float64).to(dtype)
    return X1, X2


@pytest.mark.parametrize("implementation", CPU_IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_oracle_last(generator, implementation, dtype):
    if implementation in REFERENCES and dtype in (torch.float16, torch.bfloat16):
        pytest.skip("references compute in the input dtype (16-bit accumulation); only the kernels promise "
                    "float32 accumulation for 16-bit inputs")
    M1, M2, O = 5, 7, 9
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=40, dtype=dtype)
    for lead in LEADING_SHAPES:
        X1, X2 = _inputs(generator, lead, M1, M2, dtype)
        out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation=implementation)
        assert out.dtype == dtype and out.shape == (*lead, O) and out.is_contiguous()
        assert_close_to(out, oracle(X1, X2, mu, O, m1, m2, C), dtype)


@pytest.mark.parametrize("implementation", ["numba", "torch", "index_add"])
def test_active_dim_first_and_middle(generator, implementation):
    M1, M2, O = 4, 6, 5
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=25)
    X1, X2 = _inputs(generator, (3, 8), M1, M2, torch.float64)
    expected = oracle(X1, X2, mu, O, m1, m2, C)
    first = sa.accumulate_active_dim_first(X1.movedim(-1, 0).contiguous(), X2.movedim(-1, 0).contiguous(),
                                           mu, O, m1, m2, C, implementation=implementation)
    assert first.shape == (O, 3, 8) and first.is_contiguous()
    assert_close_to(first, expected.movedim(-1, 0), torch.float64)
    middle = sa.accumulate_active_dim_middle(X1.movedim(-1, 1).contiguous(), X2.movedim(-1, 1).contiguous(),
                                             mu, O, m1, m2, C, implementation=implementation)
    assert middle.shape == (3, O, 8) and middle.is_contiguous()
    assert_close_to(middle, expected.movedim(-1, 1), torch.float64)


@pytest.mark.parametrize("implementation", ["numba", "torch"])
def test_non_contiguous_inputs(generator, implementation):
    """Transposed, sliced and broadcast (stride 0) views are read correctly."""
    M1, M2, O = 6, 3, 4
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=30)
    X1 = torch.randn(M1, 50, generator=generator, dtype=torch.float64).T
    X2 = torch.randn(100, 2 * M2, generator=generator, dtype=torch.float64)[::2, ::2]
    assert not X1.is_contiguous() and not X2.is_contiguous()
    out = sa.accumulate(X1, X2, mu, O, m1, m2, C, implementation=implementation)
    assert_close_to(out, oracle(X1, X2, mu, O, m1, m2, C), torch.float64)
    X2_broadcast = torch.randn(1, M2, generator=generator, dtype=torch.float64).expand(50, M2)
    out = sa.accumulate(X1, X2_broadcast, mu, O, m1, m2, C, implementation=implementation)
    assert_close_to(out, oracle(X1, X2_broadcast, mu, O, m1, m2, C), torch.float64)


@pytest.mark.parametrize("index_dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_any_integer_index_dtype(generator, index_dtype):
    m1, m2, mu, C = random_rule(generator, 4, 4, 4, nnz=12, index_dtype=index_dtype)
    X1, X2 = _inputs(generator, (9,), 4, 4, torch.float64)
    out = sa.accumulate(X1, X2, mu, 4, m1, m2, C)
    assert_close_to(out, oracle(X1, X2, mu, 4, m1, m2, C), torch.float64)


@pytest.mark.parametrize("implementation", ["numba", "torch"])
def test_unsorted_and_duplicate_indices_match_sorted_merged(generator, implementation):
    """Sorting the rule by mu or merging duplicates does not change the result (unlike the peer library)."""
    m1, m2, mu, C = random_rule(generator, 5, 5, 5, nnz=60)
    X1, X2 = _inputs(generator, (33,), 5, 5, torch.float64)
    order = torch.argsort(mu, stable=True)
    unsorted = sa.accumulate(X1, X2, mu, 5, m1, m2, C, implementation=implementation)
    sorted_ = sa.accumulate(X1, X2, mu[order], 5, m1[order], m2[order], C[order], implementation=implementation)
    torch.testing.assert_close(unsorted, sorted_, rtol=1e-12, atol=1e-12)
    assert_close_to(unsorted, oracle(X1, X2, mu, 5, m1, m2, C), torch.float64)


@pytest.mark.parametrize("implementation", ["numba", "torch", "index_add"])
def test_empty_rule_and_unused_columns_are_zero(generator, implementation):
    X1, X2 = _inputs(generator, (6,), 3, 3, torch.float64)
    empty = torch.zeros(0, dtype=torch.int64)
    out = sa.accumulate(X1, X2, empty, 4, empty, empty, torch.zeros(0, dtype=torch.float64),
                        implementation=implementation)
    assert out.shape == (6, 4) and torch.equal(out, torch.zeros(6, 4, dtype=torch.float64))
    # A rule that never writes column 2: that column must be exactly zero, the others not.
    m1, m2, mu, C = random_rule(generator, 3, 3, 4, nnz=20)
    mu[mu == 2] = 3
    out = sa.accumulate(X1, X2, mu, 4, m1, m2, C, implementation=implementation)
    assert torch.equal(out[:, 2], torch.zeros(6, dtype=torch.float64))
    assert_close_to(out, oracle(X1, X2, mu, 4, m1, m2, C), torch.float64)


@pytest.mark.parametrize("implementation", ["numba", "torch"])
def test_results_are_deterministic(generator, implementation):
    m1, m2, mu, C = random_rule(generator, 7, 7, 7, nnz=80, dtype=torch.float32)
    X1, X2 = _inputs(generator, (1000,), 7, 7, torch.float32)
    X1.requires_grad_()
    C.requires_grad_()
    results = []
    for _ in range(2):
        out = sa.accumulate(X1, X2, mu, 7, m1, m2, C, implementation=implementation)
        gX1, gC = torch.autograd.grad(out, (X1, C), torch.ones_like(out))
        results.append((out, gX1, gC))
    for a, b in zip(*results):
        assert torch.equal(a, b)
