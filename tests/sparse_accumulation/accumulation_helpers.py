"""Shared test helpers: an independent float64 oracle, random rules, and a counter of dispatched ops."""
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    """Records the names of the ``sparse_accumulation`` ops dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "sparse_accumulation":
            self.calls.append(func._opname)
        return func(*args, **(kwargs or {}))


def oracle(X1, X2, mu, output_size, m1, m2, C):
    """Brute-force float64 numpy loop over nonzeros, active dimension last (the op's definition)."""
    x1 = X1.detach().double().cpu().numpy()
    x2 = X2.detach().double().cpu().numpy()
    c = C.detach().double().cpu().numpy()
    out = np.zeros(x1.shape[:-1] + (output_size,))
    for k in range(len(c)):
        out[..., int(mu[k])] += x1[..., int(m1[k])] * x2[..., int(m2[k])] * c[k]
    return torch.from_numpy(out)


def random_rule(generator, M1, M2, output_size, nnz, dtype=torch.float64, index_dtype=torch.int64,
                duplicates=True):
    """An unsorted random rule; with ``duplicates`` the first nonzeros repeat at the end."""
    def draw(size):
        return torch.randint(0, size, (nnz,), generator=generator)

    m1, m2, mu = draw(M1), draw(M2), draw(output_size)
    if duplicates and nnz >= 4:
        for t in (m1, m2, mu):
            t[-2:] = t[:2]
    C = torch.randn(nnz, generator=generator, dtype=torch.float64).to(dtype)
    return m1.to(index_dtype), m2.to(index_dtype), mu.to(index_dtype), C


TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def assert_close_to(actual, expected, dtype):
    """Relative max-norm error within the dtype's tolerance, NaN never passing."""
    actual = actual.detach().double().cpu()
    expected = expected.detach().double().cpu()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), "non-finite values in result"
    scale = max(expected.abs().max().item(), 1e-30) if expected.numel() else 1.0
    error = (actual - expected).abs().max().item() / scale if expected.numel() else 0.0
    assert error <= TOLERANCE[dtype], f"relative error {error:.3g} above {TOLERANCE[dtype]:.1g} for {dtype}"
