"""Compiling the CPU kernels ahead of time: ``sparse-accumulation warmup [--dtypes ...]``.

numba compiles a kernel on its first call in a process (seconds) and keeps it in its disk cache, from which
every later process loads it (about a second). In an image or on a cluster, run the warm-up once after
installing, with the ``NUMBA_CACHE_DIR`` the jobs will use (by default numba writes next to the package's
sources, in ``__pycache__``), so that no job compiles.

The sparse accumulation kernels are compiled in every variant (with and without weights, with and without
the gradient of ``C``) for each dtype they compute in (16-bit inputs compute in float32); the message-passing,
polynomial (MACE) and HIP-NN kernels by calls of each to the second derivative.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

#: the dtype names warm-up takes; 16-bit dtypes compute in float32 and warm its kernels
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def _accumulation(dtype: torch.dtype, weighted: bool, want_c: bool) -> None:
    """A forward and backward call that runs the kernel variant ``(weighted, want_c)`` in ``dtype``."""
    import sparse_accumulation as sa

    m1, m2, mu = torch.tensor([0, 1, 2]), torch.tensor([1, 0, 2]), torch.tensor([0, 2, 1])
    w = torch.tensor([0, 1, 1]) if weighted else None
    rule = sa.Rule(m1, m2, mu, 3, input_sizes=(3, 3), w=w, weight_size=2 if weighted else None)
    X1, X2 = torch.randn(4, 3, dtype=dtype, requires_grad=True), torch.randn(4, 3, dtype=dtype, requires_grad=True)
    W = torch.randn(4, 2, dtype=dtype, requires_grad=True) if weighted else None
    C = torch.randn(3, dtype=dtype, requires_grad=want_c)
    sa.accumulate_rule(X1, X2, rule, C, W, implementation="numba").sum().backward()


def _message_passing(dtype: torch.dtype) -> None:
    """Forward, backward and double backward calls of the message-passing kernels: gathered X1 with summed
    output rows, and every operand gathered by an index of its own (outputs summed by another index than the
    one the kernel walks: the segment sums)."""
    import sparse_accumulation as sa

    rule = sa.Rule(torch.tensor([0, 1]), torch.tensor([1, 0]), torch.tensor([0, 1]), 2, input_sizes=(2, 2),
                   w=torch.tensor([0, 1]), weight_size=2)
    x = torch.randn(3, 2, 2, dtype=dtype, requires_grad=True)
    y, W = (torch.randn(4, *shape, dtype=dtype, requires_grad=True) for shape in ((1, 2), (2, 2)))
    src, dst = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 0])
    C = torch.ones(2, dtype=dtype)
    out = sa.accumulate_rule(x, y, rule, C, W, implementation="numba", indices_1=src, indices_out=dst, size_out=3)
    out.sum().backward()
    out = sa.accumulate_rule(x, y[:3], rule, C, W[:3], implementation="numba", indices_1=src, indices_2=dst,
                             indices_w=src, indices_out=dst, size_out=3)
    grads = torch.autograd.grad(out.square().sum(), (x, y, W), create_graph=True)
    sum(g.square().sum() for g in grads).backward()


def _symmetric_contraction(dtype: torch.dtype) -> None:
    """MACE's symmetric contraction: forward, backward and double backward of the polynomial kernels, with
    element and per-node weights."""
    from .mace import SymmetricContraction

    module = SymmetricContraction("2x0e + 2x1o", "2x0e + 2x1o", correlation=3, num_elements=2,
                                  implementation="numba", dtype=dtype)
    x = torch.randn(3, 2, 4, dtype=dtype, requires_grad=True)
    for y in (torch.tensor([0, 1, 1]), torch.rand(3, 2, dtype=dtype)):
        (grad,) = torch.autograd.grad(module(x, y).square().sum(), x, create_graph=True)
        grad.square().sum().backward()


def _interaction_sums(dtype: torch.dtype) -> None:
    """HIP-NN's envsum forward and backward (which runs sensesum and featsum)."""
    import sparse_accumulation as sa

    pairs = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2])
    s = torch.randn(4, 2, dtype=dtype, requires_grad=True)
    f = torch.randn(3, 3, dtype=dtype, requires_grad=True)
    sa.envsum(s, f, *pairs, implementation="numba").sum().backward()


def steps(dtypes: Sequence[torch.dtype]) -> list:
    """``(label, function)`` of each warm-up step for the dtypes (each compute dtype once)."""
    from . import backends
    from .kernels import accumulation_dtype

    accumulate_kernels = backends.kernel_module("accumulate", "numba")

    computed = list(dict.fromkeys(accumulation_dtype(d) for d in dtypes))
    out = []
    for dtype in computed:
        name = str(dtype).replace("torch.", "")
        for weighted, want_c in accumulate_kernels.all_variants():
            label = f"accumulate {name}" + (", weights" if weighted else "") + (", dC" if want_c else "")
            out.append((label, lambda d=dtype, a=weighted, b=want_c: _accumulation(d, a, b)))
        out.append((f"message passing {name}", lambda d=dtype: _message_passing(d)))
        out.append((f"symmetric contraction {name}", lambda d=dtype: _symmetric_contraction(d)))
        out.append((f"interaction sums {name}", lambda d=dtype: _interaction_sums(d)))
    return out


def warmup(dtypes: Sequence = ("float32", "float64"), progress=None) -> list:
    """Compile (or load from numba's cache) every CPU kernel for the given dtypes.

    Args:
        dtypes: dtype names (keys of :data:`DTYPES`) or torch dtypes.
        progress: a text stream for a progress bar (``tqdm``), or ``None`` / ``False`` for none.

    Returns:
        ``(label, seconds)`` of each step.

    Raises:
        ValueError: an unknown dtype.
        RuntimeError: numba is not available.
    """
    from . import backends

    resolved = []
    for d in dtypes:
        if isinstance(d, torch.dtype) and d in DTYPES.values():
            resolved.append(d)
        elif isinstance(d, str) and d in DTYPES:
            resolved.append(DTYPES[d])
        else:
            raise ValueError(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    if not backends.is_available("numba", "cpu"):
        raise RuntimeError("numba is not available: there are no CPU kernels to compile")
    work = steps(resolved)
    if progress:
        from tqdm import tqdm

        work = tqdm(work, file=progress, unit="step", desc="warm-up")
    times = []
    with torch.random.fork_rng(devices=[]), torch.enable_grad():  # leaves the caller's random state alone
        for label, function in work:
            if progress:
                work.set_postfix_str(label)
            start = time.perf_counter()
            function()
            times.append((label, time.perf_counter() - start))
    return times
