"""Several Python threads calling the op at once get the same results as one thread."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import random_rule

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN


@pytest.mark.parametrize("implementation", ["numba", "torch"])
def test_concurrent_calls(generator, implementation):
    problems = []
    for size in (3, 5, 7, 9):
        m1, m2, mu, C = random_rule(generator, size, size, size, nnz=4 * size, dtype=torch.float32)
        X1 = torch.randn(2000, size, generator=generator).requires_grad_()
        X2 = torch.randn(2000, size, generator=generator)
        problems.append((X1, X2, mu, size, m1, m2, C))

    def run(problem):
        X1, X2, mu, size, m1, m2, C = problem
        out = sa.accumulate(X1, X2, mu, size, m1, m2, C, implementation=implementation)
        (grad,) = torch.autograd.grad(out.square().sum(), X1)
        return out.detach(), grad

    expected = [run(p) for p in problems]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, problems * 6))
    for i, (out, grad) in enumerate(results):
        assert torch.equal(out, expected[i % len(problems)][0])
        assert torch.equal(grad, expected[i % len(problems)][1])
