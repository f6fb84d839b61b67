"""Helpers for the tests of :mod:`sparse_accumulation.products`: independent oracles, Wigner D matrices
(fitted from spherical harmonics, no code shared with the package) and the distributed-training worker."""
from __future__ import annotations

import math
import os

import numpy as np
import torch

import cg


# --------------------------------------------------------------------------------------------------------
# an independent oracle: one dense einsum per path, paths enumerated here from the documented order


def expand(irreps):
    """Blocks ``[(l, offset)]`` of an ``(n, l)`` description."""
    blocks, offset = [], 0
    for n, l in irreps:
        for _ in range(n):
            blocks.append((l, offset))
            offset += 2 * l + 1
    return blocks


def documented_paths(irreps1, irreps2, keep, parity):
    """``[(i1, l1, i2, l2, L)]`` in the documented output order: by L, then block of X1, then block of X2."""
    paths = []
    for L in keep:
        for i1, (l1, _) in enumerate(expand(irreps1)):
            for i2, (l2, _) in enumerate(expand(irreps2)):
                if abs(l1 - l2) <= L <= l1 + l2 and (parity == "all" or (l1 + l2 + L) % 2 == 0):
                    paths.append((i1, l1, i2, l2, L))
    return paths


def normalization_factor(normalization, l1, l2, L):
    """Closed forms (CG coefficients satisfy sum_{m1 m2 M} C^2 = 2L + 1 in every basis)."""
    if normalization in ("none", "component"):
        return 1.0
    if normalization == "norm":
        return math.sqrt((2 * l1 + 1) * (2 * l2 + 1) / (2 * L + 1))
    return normalization(l1, l2, L)


def product_oracle(X1, X2, irreps1, irreps2, keep, parity="all", basis="real", normalization="none",
                   weights=None):
    """Dense float64 / complex128 product in numpy: concatenation of ``einsum(x1_block, x2_block, CG)``."""
    x1 = X1.detach().cpu().resolve_conj().numpy().astype(np.complex128 if X1.is_complex() else np.float64)
    x2 = X2.detach().cpu().resolve_conj().numpy().astype(x1.dtype)
    b1, b2 = expand(irreps1), expand(irreps2)
    outs = []
    for p, (i1, l1, i2, l2, L) in enumerate(documented_paths(irreps1, irreps2, keep, parity)):
        C = cg.clebsch_gordan(l1, l2, L, basis=basis) * normalization_factor(normalization, l1, l2, L)
        if weights is not None:
            C = C * float(torch.as_tensor(weights)[p].detach())
        o1, o2 = b1[i1][1], b2[i2][1]
        outs.append(np.einsum("...i,...j,ijk->...k", x1[..., o1:o1 + 2 * l1 + 1], x2[..., o2:o2 + 2 * l2 + 1], C))
    return torch.from_numpy(np.concatenate(outs, axis=-1))


def relative_error(actual, expected) -> float:
    actual = actual.detach().cpu().to(torch.complex128 if actual.is_complex() else torch.float64)
    expected = expected.detach().cpu().to(actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-300)).item()


def rotate(x: torch.Tensor, irreps, D: dict) -> torch.Tensor:
    """Apply ``D[l]`` to every block of a ``[..., channels, dim]`` tensor: ``x_block -> D x_block``."""
    parts = []
    for l, offset in expand(irreps):
        d = torch.as_tensor(D[l], dtype=x.dtype)
        parts.append(x[..., offset:offset + 2 * l + 1] @ d.T)
    return torch.cat(parts, dim=-1)


# --------------------------------------------------------------------------------------------------------
# distributed training: a tiny model on the products, trained with DistributedDataParallel (gloo, CPU)

DDP_STEPS = 3
DDP_LR = 0.05
DDP_TIMEOUT_S = 120


def tiny_model():
    """A 3-body invariant regression whose only parameters are the per-path weights of two fused products."""
    from sparse_accumulation.products import ClebschGordanIteration, split

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.iteration = ClebschGordanIteration(2, nu_max=3, lmax_out=2, parity="even", weights=True,
                                                    normalization="norm", dtype=torch.float64)
            generator = torch.Generator().manual_seed(1234)
            with torch.no_grad():
                for product in self.iteration.products:
                    product.weight.copy_(torch.randn(product.n_paths, generator=generator, dtype=torch.float64))

        def forward(self, x):  # x: [batch, channels, 9] -> [batch]
            features = self.iteration(x)
            invariants = [split(f, irreps)[0] for f, irreps in zip(features[1:], self.iteration.irreps[1:])]
            return sum(inv.mean(dim=(-1, -2, -3)) for inv in invariants)

    return Tiny()


def ddp_data():
    generator = torch.Generator().manual_seed(99)
    x = 0.5 * torch.randn(8, 2, 9, generator=generator, dtype=torch.float64)
    y = torch.randn(8, generator=generator, dtype=torch.float64)
    return x, y


def train(model, x, y, steps=DDP_STEPS, lr=DDP_LR):
    """Plain SGD on the mean squared error; returns the gradients of the first step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    first = None
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        if first is None:
            first = [p.grad.detach().clone() for p in model.parameters()]
        optimizer.step()
    return first


def ddp_worker(rank: int, world_size: int, port: int, result_path: str) -> None:
    """One rank: its half of the batch, DDP over gloo on loopback; rank 0 saves gradients and parameters."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        import numba

        numba.set_num_threads(1)
    except Exception:  # pragma: no cover - numba is optional for the torch kernels
        pass
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=DDP_TIMEOUT_S))
    try:
        # the rule buffers are constant: no need to broadcast them before every forward
        import inspect

        parameters = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
        sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in parameters else {"broadcast_buffers": False}
        model = torch.nn.parallel.DistributedDataParallel(tiny_model(), **sync)
        x, y = ddp_data()
        shard = slice(rank * len(x) // world_size, (rank + 1) * len(x) // world_size)
        grads = train(model, x[shard], y[shard])
        if rank == 0:
            torch.save({"grads": grads, "params": [p.detach().clone() for p in model.module.parameters()]},
                       result_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_environment():
    """Environment variables keeping gloo on the loopback interface."""
    return {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}


class PathAndProduct(torch.nn.Module):
    """A CG path and a weighted fused product (a weighted rule, broadcast operands), the way a network holds
    them: ``(X1 [rows, 5], X2 [rows, 3], F [rows, 2, 4]) -> [rows]``, float64."""

    def __init__(self):
        super().__init__()
        import sparse_accumulation as sa

        self.path = sa.CGCalculatorSingle(2, 1, 2, dtype=torch.float64)
        self.product = sa.ClebschGordanProduct(1, 1, lmax_out=1, weights=True, dtype=torch.float64)

    def forward(self, X1, X2, F):
        return self.path(X1, X2).sum(-1) + self.product(F, F).sum((-2, -1))


def path_and_product_inputs(generator, rows=6):
    """Random float64 inputs of :class:`PathAndProduct` with ``rows`` rows."""
    return (torch.randn(rows, 5, generator=generator, dtype=torch.float64),
            torch.randn(rows, 3, generator=generator, dtype=torch.float64),
            torch.randn(rows, 2, 4, generator=generator, dtype=torch.float64))
