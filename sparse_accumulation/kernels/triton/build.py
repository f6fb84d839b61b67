"""Turning generated source into Triton kernels, once per (rule, kernel kind, layout, dtype, strategy).

``triton.jit`` reads a function's source through ``inspect``, so the generated source is written (atomically)
to a file in a cache folder (``SPARSE_ACCUMULATION_TRITON_CACHE``, default a per-user folder in the temporary
directory) and imported from there. Integer arguments (row count, strides) are not specialised on their
values (``do_not_specialize``): what matters of them is in the :class:`~.source.Layout`, which is part of the
source, so one compiled kernel serves every call of a layout and the launcher can reuse it without Triton's
per-call argument analysis. ``triton.jit`` decides when a kernel is created whether it runs under the
interpreter (``TRITON_INTERPRET=1``), so the flag is part of the cache key.

What a kernel's first use costs is mostly Triton compiling each of its configurations and the autotuner timing
them. So (:func:`autotuned`): the configurations of a kernel are compiled at once, in worker processes
(:func:`precompile`, before its first launch for a tuning key; :mod:`.compile_workers`;
``SPARSE_ACCUMULATION_TRITON_PARALLEL_COMPILE=0`` compiles them one by one as Triton does); each is timed by a
few launches (:func:`quick_bench`) rather than Triton's 125 ms or more; and the choice is kept in Triton's disk
cache, so a new process that finds the kernels compiled on disk does not time them again. :func:`prefetch`
hands a kernel's compiles to the workers without waiting (for kernels a later launch will need).
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import torch
import triton

try:  # Triton 3.4 on: compiling in an executor
    from triton.runtime._async_compile import AsyncCompileMode as _AsyncCompileMode
except ImportError:  # pragma: no cover - older Triton compiles configurations one by one
    _AsyncCompileMode = None

from . import compile_workers, configs

_kernels = {}
_lock = threading.Lock()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


_TRUE = frozenset(("1", "true", "on", "yes"))


def cache_dir() -> str:
    path = os.environ.get("SPARSE_ACCUMULATION_TRITON_CACHE")
    if not path:
        try:
            user = str(os.getuid())
        except AttributeError:  # pragma: no cover - not POSIX
            user = "user"
        path = os.path.join(tempfile.gettempdir(), f"sparse_accumulation_triton_{user}")
    os.makedirs(path, exist_ok=True)
    return path


def load_function(source: str, name: str):
    """Write ``source`` to ``<cache>/sparse_accumulation_triton_<hash>.py`` (atomically) and import ``name``."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    module_name = f"sparse_accumulation_triton_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        path = os.path.join(cache_dir(), module_name + ".py")
        current = None
        if os.path.exists(path):
            with open(path) as f:
                current = f.read()
        if current != source:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=module_name, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return getattr(module, name)


def kernel_name(kind: str, key) -> str:
    return f"sparse_accumulation_{kind}_{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"


def cached(key: tuple, build):
    """The kernel of ``key``, built by ``build()`` on first use (``key`` includes the interpreter flag)."""
    key = key + (interpreting(), configs.AUTOTUNE)
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                kernel = _kernels[key] = build()
    return kernel


PARALLEL_COMPILE = os.environ.get("SPARSE_ACCUMULATION_TRITON_PARALLEL_COMPILE", "1") != "0"
#: the options of triton.autotune this Triton has (older ones lack do_bench and cache_results)
_AUTOTUNE_OPTIONS = frozenset(inspect.signature(triton.autotune).parameters)


def quick_bench(kernel_call, quantiles=None):
    """The autotuner's timing of one configuration: the median of a few launches (about a millisecond of them,
    3 to 25) timed with CUDA events, after one untimed launch. Returns ms, or ``[median, 20%, 80%]`` when
    ``quantiles`` are asked for (as Triton's ``do_bench``)."""
    kernel_call()
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kernel_call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        if len(times) >= 3 and sum(times) >= 1.0:
            break
    times.sort()
    median = times[len(times) // 2]
    if quantiles is None:
        return median
    return [median, times[len(times) // 5], times[(4 * len(times)) // 5]]


def autotuned(source: str, name: str, ints, configs, key=("R_BUCKET",), reset_to_zero=None):
    """The generated kernel ``name`` behind Triton's autotuner over ``configs`` (``triton.Config``), keyed on
    the arguments ``key`` (and the argument dtypes); ``ints``: its integer parameters, not specialised.
    With several configurations, they are timed by :func:`quick_bench` and the choice is cached on disk."""
    fn = triton.jit(load_function(source, name), do_not_specialize=list(ints))
    options = {}
    if len(configs) > 1:
        options = {k: v for k, v in (("do_bench", quick_bench), ("cache_results", True)) if k in _AUTOTUNE_OPTIONS}
    return triton.autotune(configs=configs, key=list(key), reset_to_zero=reset_to_zero, **options)(fn)


def autotuned_row_kernel(source: str, name: str, ints, pairs, store_flags):
    """The generated row kernel ``name`` autotuned over ``(BLOCK_R, num_warps)`` pairs and ``STORE_TILE`` flags,
    keyed on the ``R_BUCKET`` argument (and the argument dtypes)."""
    candidates = [triton.Config({"BLOCK_R": b, "STORE_TILE": t}, num_warps=w) for t in store_flags for b, w in pairs]
    return autotuned(source, name, ints, candidates)


def fixed_kernel(source: str, name: str, ints, constexprs: dict, num_warps: int):
    """The generated kernel ``name`` with one fixed configuration (an autotuner of one configuration, so it is
    launched like the row kernels and never benchmarked)."""
    return autotuned(source, name, ints, [triton.Config(constexprs, num_warps=num_warps, num_stages=1)], key=())


_executor = None


def _compile_executor():
    """Where :func:`precompile` compiles: worker processes (:mod:`.compile_workers`), or threads of this
    process with ``SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS=0``."""
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                workers = compile_workers.worker_count()
                if workers:
                    _executor = compile_workers.ProcessExecutor(workers)
                else:
                    _executor = ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1),
                                                   thread_name_prefix="sparse_accumulation_triton_compile")
    return _executor


def _forget_executor() -> None:
    global _executor
    _executor = None  # its threads do not exist in a forked child
    _compiling.clear()  # nor the compiles they waited for


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_executor)


def precompile(kernel, args, grid) -> None:
    """Compile every configuration of the autotuned ``kernel`` for the arguments ``args`` at once (in worker
    processes, see :func:`_compile_executor`), instead of one by one as the autotuner meets them.
    Configurations already compiled (in this process or in Triton's disk cache) cost a cache lookup; one that
    fails to compile is left to the autotuner, which reports or skips it as before."""
    configs = getattr(kernel, "configs", ())
    fn = getattr(kernel, "fn", None)
    if (not PARALLEL_COMPILE or _AsyncCompileMode is None or fn is None or len(configs) < 2 or interpreting()):
        return
    with _AsyncCompileMode(_compile_executor(), ignore_errors=True):
        for config in configs:
            fn.warmup(*args, grid=grid, **config.all_kwargs())


def prefetch(kernel, args, grid, urgent: bool = False) -> list:
    """Start compiling every configuration of the autotuned ``kernel`` for ``args`` in worker processes, and
    return at once (see :meth:`.compile_workers.ProcessExecutor.prefetch`): the futures of the compiles started
    (none for configurations already compiled); nothing where compiles run in threads or under the
    interpreter."""
    fn = getattr(kernel, "fn", None)
    if not prefetching() or fn is None:
        return []
    configs = getattr(kernel, "configs", ())
    return _compile_executor().prefetch(lambda: [fn.warmup(*args, grid=grid, **c.all_kwargs()) for c in configs],
                                        urgent)


def compile_together(kernels_args, grid) -> None:
    """Compile the kernels of ``(kernel, args)`` pairs at once in worker processes and wait for all of them, so
    that their launches load them from Triton's disk cache instead of compiling one after another (nothing
    where compiles cannot run ahead, :func:`prefetching`: each launch then compiles its own)."""
    if prefetching():
        wait([f for kernel, args in kernels_args for f in prefetch(kernel, args, grid, urgent=True)])


#: (kernel, argument dtypes) -> futures of the compiles :func:`compiled` started for it
_compiling = {}


def compiled(kernel, args, grid) -> bool:
    """Whether every configuration of ``kernel`` for ``args`` is compiled, so that a launch only loads and
    times them. Where not, the first call starts compiling them in worker processes at this process's priority
    (:func:`prefetch`) and every call returns False until they are done. True where compiles cannot run
    ahead (no workers, the interpreter)."""
    if not prefetching():
        return True
    key = (id(kernel), tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
    futures = _compiling.get(key)
    if futures is None:
        with _lock:
            futures = _compiling.get(key)
            if futures is None:
                futures = _compiling[key] = prefetch(kernel, args, grid, urgent=True)
    return all(f.done() for f in futures)


def prefetching() -> bool:
    """Whether :func:`prefetch` compiles anything: compile workers on, Triton compiling (not interpreting)."""
    return (PARALLEL_COMPILE and _AsyncCompileMode is not None and not interpreting()
            and isinstance(_compile_executor(), compile_workers.ProcessExecutor))
