"""How ``bench`` times a call: from the kernels alone to one compiled training step.

The timings (:data:`TIMINGS`), each for the forward and for the forward + backward of ``sum(out * G)``:

``kernel``
    ``n`` calls back to back, synchronised once, total time / ``n``: the throughput of the kernels, what
    ``triton.testing.do_bench`` measures when the host keeps ahead of the device. Forward inputs do not
    require gradients.
``call``
    one call at a time, as a training step makes it: inputs requiring gradients, gradients reset to
    ``None`` before each step, synchronised around each call (CUDA events around ONE call on CUDA,
    ``time.perf_counter`` on the CPU). When the host is slower than the kernels, this is the host's time.
``compiled``
    the same step with the forward under ``torch.compile(fullgraph=True)`` (the backward is the compiled
    graph's); a graph break is an error, reported, not a silent fallback.
``reduce-overhead``
    the same with ``torch.compile(mode="reduce-overhead", fullgraph=True)``: steps replayed from CUDA graphs
    (CUDA only), the inputs marked static (``torch._dynamo.mark_static_address``), as activations inside a
    captured training step are: no copy into the graph's buffers per replay.
``host``
    host microseconds per call: a loop of ``call`` steps without synchronising, divided by the count.
"""
from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from typing import Callable, Iterable, Optional

import torch

from .. import backends

__all__ = [
    "TIMINGS", "EAGER_TIMINGS", "COMPILED_TIMINGS", "normalize_timings", "timing_unavailable", "unit",
    "synchronize", "elapsed_ms", "make_step", "compile_forward", "measure", "copy_bandwidth",
    "compiled_kernels_only", "waits_for_compiles",
]

TIMINGS = ("kernel", "call", "compiled", "reduce-overhead", "host")
#: The timings without compilation: seconds in all, where every compiled one costs seconds of compile time.
EAGER_TIMINGS = ("kernel", "call", "host")
#: ``torch.compile`` options of the compiled timings.
COMPILED_TIMINGS = {"compiled": {"fullgraph": True},
                    "reduce-overhead": {"fullgraph": True, "mode": "reduce-overhead"}}
_BATCH_SECONDS = 0.02  # a kernel or host batch runs about this long
_MAX_BATCH = 100


def compiled_kernels_only() -> None:
    """From now on, in this process and its children, a GPU kernel launched before it is compiled waits for its
    compile, instead of the call computing with the portable torch kernels meanwhile: for benchmarks, whose
    checks and timings are of the compiled kernels (``benchmarks/cold_start.py`` measures the interim)."""
    os.environ["SPARSE_ACCUMULATION_TRITON_WAIT"] = "1"
    launch = backends.triton_launch()
    if launch is not None:  # else no triton: no GPU kernels to wait for
        launch.WAIT_FOR_COMPILES = True


def waits_for_compiles(function: Callable) -> Callable:
    """``function`` with every GPU launch of the process waiting for its kernel's compile while it runs
    (:func:`sparse_accumulation.kernels.triton.launch.waiting`): what ``bench`` and ``check`` time and check are
    the compiled kernels, not the portable interim."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        launch = backends.triton_launch()
        with contextlib.nullcontext() if launch is None else launch.waiting():
            return function(*args, **kwargs)

    return wrapper


def normalize_timings(names: Iterable[str]) -> tuple:
    """The timing names in :data:`TIMINGS` order, without repeats.

    Raises:
        ValueError: for an unknown name.
    """
    names = list(names)
    for name in names:
        if name not in TIMINGS:
            raise ValueError(f"unknown timing {name!r}; choose from {', '.join(TIMINGS)}")
    return tuple(name for name in TIMINGS if name in names)


def timing_unavailable(timing: str, device) -> Optional[str]:
    """Why ``timing`` cannot run on ``device`` (``None`` when it can)."""
    if timing == "reduce-overhead" and torch.device(device).type != "cuda":
        return "CUDA only"
    return None


def unit(timing: str) -> str:
    """``"us"`` for ``host``, ``"ms"`` for the others."""
    return "us" if timing == "host" else "ms"


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def make_step(forward: Callable, mode: str, X1, X2, C, G, *, requires_grad: bool, grad_c: bool = False,
              before: Optional[Callable] = None, static: bool = False) -> Callable:
    """A call of ``forward(X1, X2, C)`` as one step of a loop; the step returns what it computed.

    Args:
        forward: ``f(X1, X2, C) -> out`` with ``out`` shaped like ``G``.
        mode: ``"forward"`` (the step returns ``out``) or ``"backward"`` (the step runs
            ``out.backward(G)`` and returns the gradients ``(dX1, dX2)``, plus ``dC`` with ``grad_c``).
        requires_grad: run the forward on leaves that require gradients (always so for ``backward``).
            The leaves are made once; their gradients are reset to ``None`` before each step.
        grad_c: ``C`` is a leaf requiring gradient too.
        before: called first in every step (``torch.compiler.cudagraph_mark_step_begin`` for CUDA graphs).
        static: mark the inputs as static addresses for CUDA graphs, as the activations inside a captured
            training step are (otherwise each replay first copies them into the graph's own buffers).
    """
    if mode == "forward" and not requires_grad:
        leaves = ()
        inputs = (X1, X2, C)
    else:
        X1, X2 = (t.detach().requires_grad_(True) for t in (X1, X2))
        leaves = (X1, X2)
        if grad_c:
            C = C.detach().requires_grad_(True)
            leaves += (C,)
        inputs = (X1, X2, C)
    if static:
        for t in inputs:
            torch._dynamo.mark_static_address(t)

    def step():
        for leaf in leaves:
            leaf.grad = None
        if before is not None:
            before()
        out = forward(*inputs)
        if mode == "forward":
            return out
        out.backward(G)
        return tuple(leaf.grad for leaf in leaves)

    return step


def compile_forward(forward: Callable, timing: str) -> tuple:
    """``(compiled forward, before)`` for a compiled timing; ``before`` is ``None`` or marks a CUDA-graph step.

    Resets torch.compile's caches first, so that earlier compilations of other functions (which share this
    code's cache entries) cannot make this one fall back to eager.
    """
    torch.compiler.reset()
    compiled = torch.compile(forward, **COMPILED_TIMINGS[timing])
    before = torch.compiler.cudagraph_mark_step_begin if timing == "reduce-overhead" else None
    return compiled, before


def elapsed_ms(fn: Callable, device) -> float:
    """Milliseconds of ``fn()`` from an idle ``device`` (a :class:`torch.device`) to its work's end (CUDA events
    on CUDA, the host clock on the CPU)."""
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _batch(step: Callable, calls: int) -> Callable:
    def run():
        for _ in range(calls):
            step()
    return run


def measure(timing: str, step: Callable, device, *, repeats: int = 5, warmup: int = 1,
            max_seconds: float = 10.0) -> list:
    """Samples of ``timing`` for ``step`` (ms per call; us per call for ``host``), after ``warmup`` steps.

    ``kernel`` and ``host`` take ``repeats`` batches of back-to-back steps (as many as run in about 20 ms,
    at most 100, sized by the last warm-up step); ``call`` and the compiled timings time single steps,
    ``repeats`` of them or more when a step is shorter than that (up to a batch's worth). Sampling stops early
    once it has run ``max_seconds`` (at least one sample is taken).
    """
    device = torch.device(device)
    for _ in range(warmup - 1):
        step()
    single_ms = elapsed_ms(step, device)  # the last warm-up step (or one more) sizes the batches
    calls = max(1, min(_MAX_BATCH, int(_BATCH_SECONDS * 1e3 / max(single_ms, 1e-6))))
    deadline = time.perf_counter() + max_seconds
    samples = []
    if timing in ("kernel", "host"):
        batch = _batch(step, calls)
        for _ in range(repeats):
            if timing == "kernel":
                samples.append(elapsed_ms(batch, device) / calls)
            else:
                synchronize(device)
                start = time.perf_counter()
                batch()
                samples.append((time.perf_counter() - start) / calls * 1e6)
                synchronize(device)
            if time.perf_counter() > deadline:
                break
        return samples
    for _ in range(max(repeats, calls)):
        samples.append(elapsed_ms(step, device))
        if time.perf_counter() > deadline:
            break
    return samples


def copy_bandwidth(device, n_bytes: Optional[int] = None) -> float:
    """Bytes per second of a device-to-device copy, counting the bytes read and the bytes written.

    Copies ``n_bytes`` (default 64 MiB on the CPU, 256 MiB on CUDA: larger than the caches) five times and
    takes the median.
    """
    device = torch.device(device)
    n_bytes = n_bytes or (2**28 if device.type == "cuda" else 2**26)
    source = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).normal_()
    target = torch.empty_like(source)
    target.copy_(source)
    median_ms = statistics.median(elapsed_ms(lambda: target.copy_(source), device) for _ in range(5))
    return 2 * source.numel() * 4 / (median_ms * 1e-3)
