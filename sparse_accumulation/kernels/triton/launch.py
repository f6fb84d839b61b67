"""Launching the generated kernels: traced for ``torch.compile``, through Triton's launcher, or fast.

* traced: inside the registered ops while ``torch.compile`` / ``torch.export`` trace them, the launch goes
  through ``torch.library.wrap_triton`` so the compiler sees the kernel;
* public: ``kernel[grid](*args)``, Triton's launcher, which analyses every argument and consults the
  autotuner on every call (about 13 to 20 us of host time per launch, measured on an H200 host);
* fast (eager calls on CUDA): once per kernel, tuning key, device and pointer alignment, the public launch
  runs and the compiled kernel and the configuration it used are kept; later calls hand the arguments to the
  compiled kernel's launcher directly (about 5 us); a :class:`Call` (a row kernel with its integer arguments
  and grid fixed, one per call plan) keeps the plans it used, so its later launches skip even that lookup.
  The kernels' integer arguments are not specialised (see
  :mod:`.build`), so only the pointers' dtypes and alignment, and the integers' 32-bit range, decide which
  compiled kernel applies.

An eager launch whose kernel is not compiled yet need not wait: :func:`ready` starts its compile in worker
processes and tells the caller to compute with the portable torch kernels meanwhile (:func:`portable_meanwhile`
does the same by raising :class:`NotCompiled`).

The fast launch uses Triton internals (``CompiledKernel.run``, ``function``, ``packed_metadata``,
``Autotuner.best_config``, ``triton.knobs``); they are touched only here. Where one is missing (the
interpreter, another Triton), where a launch hook is installed (profilers), or with
``SPARSE_ACCUMULATION_TRITON_FAST_LAUNCH=0``, the public launch is used.
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading

import torch

from . import build

try:  # launch hooks (profilers) live in triton.knobs from Triton 3.4 on
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: no fast launch
    _knobs = None

FAST_LAUNCH = os.environ.get("SPARSE_ACCUMULATION_TRITON_FAST_LAUNCH", "1") != "0"

_plans = {}
_unsupported = set()
_lock = threading.Lock()


class _Plan:
    """What a fast launch needs: the compiled kernel's launcher, its handles and the constexpr values."""

    __slots__ = ("launcher", "function", "metadata", "constexprs", "meta")

    def __init__(self, compiled, constexprs, meta):
        self.launcher = compiled.run
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.constexprs = constexprs
        self.meta = meta


def _hooks_active() -> bool:
    if _knobs is None:
        return True
    for hook in (_knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _run_public(kernel, grid, args, device, tuning) -> tuple:
    """``(compiled kernel, configuration used)`` of a launch through Triton's autotuner."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            return _run_locked(kernel, grid, args, tuning)
    return _run_locked(kernel, grid, args, tuning)


#: (kernel, tuning key, argument dtypes) launched in this process
_launched = set()
#: one lock per kernel: the autotuner keeps per-call state (arguments, best configuration), and threads that
#: meet a kernel first at once compile it once
_kernel_locks = {}
#: seconds a first launch may take (loading compiled kernels from disk) before a note says they compile
NOTE_AFTER_SECONDS = 3.0
_noted = threading.Event()


def _kernel_lock(kernel) -> threading.Lock:
    found = _kernel_locks.get(id(kernel))
    if found is None:
        with _lock:
            found = _kernel_locks.setdefault(id(kernel), threading.Lock())
    return found


def _note_compiling() -> None:
    if not _noted.is_set():
        _noted.set()
        print("sparse_accumulation: compiling GPU kernels on first use (kept in Triton's disk cache for later "
              "runs)", file=sys.stderr, flush=True)


def _run_locked(kernel, grid, args, tuning) -> tuple:
    """``kernel.run`` under the kernel's lock; on the first launch of a kernel for a tuning key and dtypes, its
    configurations are compiled in parallel first (:func:`.build.precompile`), with a note on stderr if that
    takes long."""
    key = (id(kernel), tuning, tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
    with _kernel_lock(kernel):
        if key in _launched:
            return kernel.run(*args, grid=grid, warmup=False), getattr(kernel, "best_config", None)
        if _capturing(args[0]):
            # timing runs cannot be captured: the first configuration (the best guess) runs untuned, and the
            # kernel is tuned at its first launch outside a capture
            build.precompile(kernel, args, grid)
            compiled = kernel.fn.run(*args, grid=grid, warmup=False, **kernel.configs[0].all_kwargs())
            _collect_compile_garbage()
            return compiled, None
        timer = None if _noted.is_set() else threading.Timer(NOTE_AFTER_SECONDS, _note_compiling)
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            build.precompile(kernel, args, grid)
            compiled = kernel.run(*args, grid=grid, warmup=False)
        finally:
            if timer is not None:
                timer.cancel()
        _launched.add(key)
        if _capturing_or_warming_up(args[0]):
            _collect_compile_garbage()
        return compiled, getattr(kernel, "best_config", None)


def _collect_compile_garbage() -> None:
    """Free the reference cycles that compiling and tuning a kernel leave, which hold the launch's tensors
    (frames of Triton's compile and tuning path), after a first launch inside a CUDA graph capture or its warm-up:
    torch's CUDA graphs check that the warm-up's tensors are freed when their last reference goes, which a cycle
    defers to the next garbage collection (``reduce-overhead`` of a MACE stress step failed so from an empty
    Triton cache). A full collection (about 0.5 s in a process that has compiled a model; a young one sufficed
    in that case, but the frames live through the tuning and may have aged), only on such a launch."""
    gc.collect()


def _make_plan(kernel, grid, args, device, tuning):
    """Launch through Triton once and keep what a direct launch of the same compiled kernel needs."""
    compiled, config = _run_public(kernel, grid, args, device, tuning)
    if config is None:
        return None
    meta = dict(config.kwargs)
    names = getattr(kernel, "arg_names", None)
    if names is None or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        return None
    constexprs = tuple(meta[name] for name in names[len(args):])
    return _Plan(compiled, constexprs, meta)


def _public_or_first(kernel, grid, pointers, ints, device, tuning, small):
    """Launch through Triton; return the fast plan for later launches of this kernel with pointers of this
    alignment on the current device (None where the fast path does not apply)."""
    if not FAST_LAUNCH or not small or device.type != "cuda" or id(kernel) in _unsupported or _hooks_active():
        _run_public(kernel, grid, pointers + ints, device, tuning)
        return None
    index = torch._C._cuda_getDevice()
    if device.index is not None and device.index != index:
        _run_public(kernel, grid, pointers + ints, device, tuning)
        return None
    key = (id(kernel), index, tuning, _alignment(pointers), pointers[0].dtype, pointers[-1].dtype)
    plan = _plans.get(key)
    if plan is None:
        plan = _make_plan(kernel, grid, pointers + ints, device, tuning)
        if plan is not None:
            _plans.setdefault(key, plan)
        elif not _capturing(pointers[0]):  # an untuned launch under capture makes no plan yet
            _unsupported.add(id(kernel))
        return None
    _launch_plan(plan, grid(plan.meta), index, pointers, ints)
    return plan


def _alignment(pointers) -> int:
    aligned = 0
    for t in pointers:
        aligned = (aligned << 1) | (t.data_ptr() & 15 == 0)
    return aligned


def _launch_plan(plan, grid, index, pointers, ints) -> None:
    x, *rest = grid
    plan.launcher(x, rest[0] if rest else 1, rest[1] if len(rest) > 1 else 1,
                  torch._C._cuda_getCurrentRawStream(index), plan.function, plan.metadata, None, None, None,
                  *pointers, *ints, *plan.constexprs)


_mode = threading.local()


@contextlib.contextmanager
def _mode_set(name: str):
    """A context in which this thread's launch mode ``name`` is on."""
    previous = getattr(_mode, name, False)
    setattr(_mode, name, True)
    try:
        yield
    finally:
        setattr(_mode, name, previous)


def compile_only():
    """Within it, launches launch nothing: each hands its kernel's compiles to worker processes
    (:func:`.build.prefetch`) and returns at once. Outputs are then never written."""
    return _mode_set("compile_only")


def compiling_only() -> bool:
    """Whether launches only compile (inside :func:`compile_only`)."""
    return getattr(_mode, "compile_only", False)


#: ``SPARSE_ACCUMULATION_TRITON_WAIT=1``: a launch whose kernel is not compiled yet waits for it (see :func:`ready`)
WAIT_FOR_COMPILES = os.environ.get("SPARSE_ACCUMULATION_TRITON_WAIT", "0").strip().lower() in build._TRUE
#: (kernel, pointer dtypes) found compiled: :func:`ready` is a set lookup for them
_ready = set()
#: how many times :func:`ready` said "not yet" in this process
not_ready_calls = 0
_noted_background = threading.Event()


def _capturing(tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def _capturing_or_warming_up(tensor) -> bool:
    """Under CUDA graph capture, or on a stream other than the device's default one."""
    return _capturing(tensor) or (tensor.is_cuda and torch.cuda.current_stream(tensor.device)
                                  != torch.cuda.default_stream(tensor.device))


def ready(kernel, grid, pointers, ints) -> bool:
    """Whether :func:`launch` of ``kernel`` with these arguments would run without compiling first.

    Where it would compile, the first call starts the compiles in worker processes and this returns False
    until they are done, so that the caller can compute otherwise (with the portable torch kernels) instead of
    waiting, and launch the compiled kernel from the first call after. True, whatever the cache holds, where
    that cannot or must not happen: inside :func:`compile_only`; during CUDA graph capture (the portable kernels
    cannot be captured) and on a side stream, where captures are warmed up (torch asks for that), so that a
    capture meets tuned kernels; with deterministic algorithms on (the portable kernels add atomically);
    without compile workers (threads, the interpreter); inside :func:`waiting`; with
    ``SPARSE_ACCUMULATION_TRITON_WAIT=1``."""
    global not_ready_calls
    key = (id(kernel), pointers[0].dtype, pointers[-1].dtype)
    if key in _ready:
        return True
    if (WAIT_FOR_COMPILES or compiling_only() or _waiting or not build.prefetching()
            or torch.are_deterministic_algorithms_enabled() or _capturing_or_warming_up(pointers[0])):
        return True
    if build.compiled(kernel, list(pointers) + list(ints), grid):
        _ready.add(key)
        return True
    not_ready_calls += 1
    if not _noted_background.is_set():
        _noted_background.set()
        print("sparse_accumulation: GPU kernels compiling in the background (kept in Triton's disk cache for later "
              "runs); meanwhile the first calls run on slower portable kernels", file=sys.stderr, flush=True)
    return False


class NotCompiled(Exception):
    """Raised by a launch inside :func:`portable_meanwhile` whose kernel is still compiling."""


#: how many :func:`waiting` contexts are open in this process
_waiting = 0


@contextlib.contextmanager
def waiting():
    """While it is open, launches of every thread of this process wait for their kernels' compiles, whatever
    :func:`ready` would say (``bench`` and ``check`` time and check the compiled kernels, not the portable
    interim; the backward of CUDA tensors runs on autograd's own threads, hence process-wide)."""
    global _waiting
    with _lock:
        _waiting += 1
    try:
        yield
    finally:
        with _lock:
            _waiting -= 1


def portable_meanwhile():
    """Within it, a launch (:func:`launch`, :class:`Call`) whose kernel is not compiled yet starts its compile
    and raises :class:`NotCompiled` instead of waiting (see :func:`ready`): the caller, which wrote nothing but
    new outputs, computes the call with the portable kernels instead."""
    return _mode_set("portable")


def _raise_if_compiling(kernel, grid, pointers, ints) -> None:
    if getattr(_mode, "portable", False) and not ready(kernel, grid, pointers, ints):
        raise NotCompiled()


def launch(kernel, grid, pointers, ints, *, device, traceable=False, tuning=None, small=True) -> None:
    """Launch ``kernel`` (a generated kernel behind a ``triton.autotune`` of its configurations) on ``grid``.

    Args:
        kernel: the kernel; its parameters are ``pointers``, then ``ints``, then constexprs that its
            configurations set.
        grid: ``grid(meta) -> (x, y, z)`` from the constexpr values.
        pointers: the tensor arguments, all of one dtype but for the last ones (outputs, buffers).
        ints: the integer arguments.
        device: the device of the tensors.
        traceable: launch through ``torch.library.wrap_triton`` (inside a ``triton_op`` being traced).
        tuning: the value of the autotuning key (part of the fast launch's key).
        small: every integer argument lies in the 32-bit range (Triton then types them all alike).
    """
    if traceable:
        torch.library.wrap_triton(kernel)[grid](*pointers, *ints)
        return
    if compiling_only():
        build.prefetch(kernel, pointers + ints, grid)
        return
    _raise_if_compiling(kernel, grid, pointers, ints)
    _public_or_first(kernel, grid, pointers, ints, device, tuning, small)


class Call:
    """A launch of ``kernel`` with fixed integer arguments and grid (one call plan of a row kernel), which
    remembers its fast plans per device and pointer alignment: a repeated eager launch then costs a dictionary
    lookup and the compiled kernel's launcher. Arguments as for :func:`launch`."""

    __slots__ = ("kernel", "grid", "ints", "tuning", "small", "fast")

    def __init__(self, kernel, grid, ints, *, tuning, small):
        self.kernel, self.grid, self.ints, self.tuning, self.small = kernel, grid, ints, tuning, small
        self.fast = {}

    def __call__(self, pointers, device, traceable=False) -> None:
        if traceable:
            torch.library.wrap_triton(self.kernel)[self.grid](*pointers, *self.ints)
            return
        if compiling_only():
            build.prefetch(self.kernel, list(pointers) + list(self.ints), self.grid)
            return
        if not self.fast:
            _raise_if_compiling(self.kernel, self.grid, pointers, self.ints)
        if FAST_LAUNCH and self.fast and not _hooks_active():
            index = torch._C._cuda_getDevice()
            known = self.fast.get((index, _alignment(pointers)))
            if known is not None and device.index == index:
                _launch_plan(known[0], known[1], index, pointers, self.ints)
                return
        plan = _public_or_first(self.kernel, self.grid, pointers, self.ints, device, self.tuning, self.small)
        if plan is not None:
            self.fast[(torch._C._cuda_getDevice(), _alignment(pointers))] = (plan, self.grid(plan.meta))
