"""Compiling Triton kernels in worker processes, for :func:`.build.precompile`.

Compiling a generated kernel is mostly Python (Triton's code generator) and MLIR passes that hold the GIL, so
configurations compiled in threads of one process wait on each other. :class:`ProcessExecutor` is the
executor Triton's asynchronous compile mode submits its compile calls to: each call's kernel is compiled by a
worker process (:mod:`.compile_worker`, which imports Triton only) into Triton's disk cache, then the call
itself runs in this process, where it finds the kernel on disk and only loads it. Where a job cannot be
described to a worker (another Triton) or a worker fails, the call compiles here, as in a thread; if a
worker's kernel is not the one this process then loads (a different cache key), workers are turned off for
the rest of the process.

Workers start on first use (up to ``SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS``, default the CPU count, at
most 16; ``0`` turns them off) and exit after two idle minutes or with this process, which reaps them. Compiles
ahead of need (:meth:`ProcessExecutor.prefetch`) run in as many more workers at a lower CPU priority (``nice``
10), so that a compile someone waits for gets the cores first.
"""
from __future__ import annotations

import atexit
import hashlib
import inspect
import os
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

try:  # Triton 3.4 on: compiling in an executor
    from triton.runtime._async_compile import AsyncCompileMode as _AsyncCompileMode
except ImportError:  # pragma: no cover - older Triton compiles configurations one by one
    _AsyncCompileMode = None

from . import compile_worker

_WORKER_SCRIPT = os.path.abspath(compile_worker.__file__)


#: seconds a closed worker has to exit before it is killed
EXIT_SECONDS = 5.0


def worker_count() -> int:
    """How many worker processes may compile at once (0: none, compile in threads)."""
    value = os.environ.get("SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS")
    if value is not None and value.strip():
        return max(0, int(value))
    return min(16, os.cpu_count() or 1)


class _Worker:
    def __init__(self, niceness: int):
        self.process = subprocess.Popen([sys.executable, _WORKER_SCRIPT, str(niceness)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        self.ready = False

    def ask(self, job):
        """The worker's answer to ``job``; None if the worker is gone (exited, idle or killed)."""
        try:
            if not self.ready:
                if compile_worker.read_message(self.process.stdout) is None:
                    return None
                self.ready = True
            compile_worker.write_message(self.process.stdin, job)
            return compile_worker.read_message(self.process.stdout)
        except (OSError, ValueError, EOFError):
            return None

    def close(self) -> None:
        """End the worker's input (an idle worker then exits), reap it (killed if it has not exited within
        :data:`EXIT_SECONDS`) and close its pipes."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


class _Pool:
    """Up to ``size`` worker processes of one CPU priority (``niceness``, as ``nice``), started when needed,
    one job at a time each."""

    def __init__(self, size: int, niceness: int = 0):
        self.size, self.niceness = size, niceness
        self.idle = []
        self.started = 0
        self.condition = threading.Condition()

    def _acquire(self) -> _Worker:
        with self.condition:
            while not (self.idle or self.started < self.size):
                self.condition.wait()
            if self.idle:
                return self.idle.pop()
            self.started += 1
        try:
            return _Worker(self.niceness)
        except OSError:
            self._release(None)
            raise

    def _release(self, worker) -> None:
        with self.condition:
            if worker is None:
                self.started -= 1
            else:
                self.idle.append(worker)
            self.condition.notify_all()

    def run(self, job):
        """The answer of a worker to ``job`` (a fresh worker is tried once if the first one is gone); None
        where no worker answers."""
        for _ in range(2):
            worker = self._acquire()
            answer = worker.ask(job)
            if answer is not None:
                self._release(worker)
                return answer
            worker.close()
            self._release(None)
        return None

    def close_idle(self) -> None:
        with self.condition:
            while self.idle:
                self.idle.pop().close()
                self.started -= 1


def _in_cache(job) -> bool:
    """Whether Triton's disk cache holds the job's kernel already (then this process loads it faster than a
    worker starts); False where this Triton's cache key cannot be computed here."""
    try:
        from triton.compiler import compiler
        from triton.runtime.cache import get_cache_manager

        source = job["source"]
        backend = compiler.make_backend(job["target"])
        options = backend.parse_options(dict(job["options"], **source.parse_options()))
        key = compiler.get_cache_key(source, backend, options, env_vars=job["env_vars"])
        name = f"{source.name[:150]}.json"
        return name in (get_cache_manager(hashlib.sha256(key.encode()).hexdigest()).get_group(name) or {})
    except Exception:
        return False


def describe(compile_call):
    """The job a worker needs to compile what ``compile_call`` (the function Triton's asynchronous mode
    submits) would, or None where it cannot be read from this Triton's closure."""
    try:
        found = inspect.getclosurevars(compile_call).nonlocals
        source, target, options, env_vars = (found[k] for k in ("src", "target", "options", "env_vars"))
        function = source.fn.fn
        return {"source": source, "path": os.path.abspath(inspect.getsourcefile(function)),
                "module": function.__module__, "name": function.__name__, "do_not_specialize": list(source.fn.do_not_specialize),
                "signature": dict(source.signature), "constants": dict(source.constants),
                "attrs": dict(source.attrs), "target": target, "options": dict(vars(options)),
                "env_vars": dict(env_vars)}
    except Exception:  # another Triton's closure: compile in this process
        return None


def _wire(job) -> dict:
    """The job as a worker reads it (without the source object, which the worker makes again)."""
    return {k: v for k, v in job.items() if k != "source"}


def _job_key(job) -> str:
    return repr(sorted((k, v) for k, v in _wire(job).items()))


class _Prefetched(Exception):
    """The outcome, to Triton, of a compile call that :meth:`ProcessExecutor.prefetch` handed to a worker."""


class ProcessExecutor:
    """An executor for ``triton.runtime._async_compile.AsyncCompileMode``: each submitted compile call is
    compiled by a worker process first (see the module docstring), then run here.

    :meth:`prefetch` hands a kernel's compiles to workers without waiting for them: a later launch of the
    kernel then waits for (or finds on disk) what they compiled instead of compiling it again."""

    #: the CPU priority of workers that compile ahead of need: below those someone waits for
    AHEAD_NICENESS = 10

    def __init__(self, workers: int):
        self.pool = _Pool(workers)
        self.ahead_pool = _Pool(workers, self.AHEAD_NICENESS)
        # urgent compiles and prefetched ones wait for workers in threads of their own
        self.threads = ThreadPoolExecutor(max_workers=max(1, workers),
                                          thread_name_prefix="sparse_accumulation_triton_compile")
        self.prefetch_threads = ThreadPoolExecutor(max_workers=max(1, workers),
                                                   thread_name_prefix="sparse_accumulation_triton_prefetch")
        # urgent compiles nobody waits on in a thread (see :meth:`prefetch`) ask workers from threads of their own
        self.start_threads = ThreadPoolExecutor(max_workers=max(1, workers),
                                                thread_name_prefix="sparse_accumulation_triton_start")
        self.enabled = True
        self.compiled_by_workers = 0
        self._jobs = {}
        self._lock = threading.Lock()
        atexit.register(self.close_idle)

    def submit(self, compile_call):
        return self.threads.submit(self._compile, compile_call)

    def _job(self, compile_call):
        """The job for a worker, or None where this process should compile (workers off, the call not
        readable, the kernel already on disk)."""
        if not self.enabled:
            return None
        job = describe(compile_call)
        return None if job is None or _in_cache(job) else job

    def _claim(self, job):
        """``(future, owner)``: the future of ``job``'s answer, and whether this caller asks the worker (the first
        caller of a job does; later ones wait for its answer)."""
        key = _job_key(job)
        with self._lock:
            future = self._jobs.get(key)
            if future is not None:
                return future, False
            future = self._jobs[key] = Future()
            return future, True

    def _ask(self, job, urgent: bool, future: Future) -> None:
        answer = None
        try:
            answer = (self.pool if urgent else self.ahead_pool).run(_wire(job))
        except OSError:  # no worker could start: compile here from now on
            self.enabled = False
        finally:
            future.set_result(answer)  # whatever happened, nobody waits for this job forever

    def _fill_cache(self, job, urgent: bool):
        """A worker's answer to ``job``, asked once per job: later requests for it wait for that answer."""
        future, owner = self._claim(job)
        if owner:
            self._ask(job, urgent, future)
        return future.result()

    def _start(self, job, urgent: bool) -> Future:
        """Ask a worker for ``job`` without waiting (once per job); the future of its answer."""
        future, owner = self._claim(job)
        if owner:
            (self.start_threads if urgent else self.prefetch_threads).submit(self._ask, job, urgent, future)
        return future

    def _compile(self, compile_call):
        job = self._job(compile_call)
        answer = self._fill_cache(job, urgent=True) if job is not None else None
        kernel = compile_call()
        if answer is not None and answer[0] == "ok":
            if answer[1] == getattr(kernel, "hash", None):
                self.compiled_by_workers += 1
            else:
                self.enabled = False  # the worker's cache key differs from this process's: stop the double work
        return kernel

    def prefetch(self, warmups, urgent: bool = False) -> list:
        """Hand to workers, without waiting, the compiles that ``warmups()`` (calls of ``JITFunction.warmup``)
        would make; the futures of the workers' answers (none for kernels already compiled). ``urgent``:
        compiled at this process's priority (someone waits for them), else below it."""
        if not self.enabled or _AsyncCompileMode is None:
            return []
        recorder = _Recorder(self, urgent)
        with _AsyncCompileMode(recorder, ignore_errors=True):
            warmups()
        for outcome in recorder.outcomes:
            # Triton raised it to see the outcome: its traceback holds the frames of this call and, through
            # theirs, of every caller up the stack (a model's whole step), in a reference cycle with the
            # outcome's future that would keep their tensors and autograd graphs until a garbage collection
            outcome.exception().__traceback__ = None
        return recorder.futures

    def prefetch_submit(self, compile_call, urgent: bool = False, futures=None) -> Future:
        """Hand ``compile_call``'s kernel to a worker without waiting (its answer's future appended to
        ``futures``); the future returned fails at once, so that Triton keeps nothing in memory for the call
        (the kernel is loaded from disk when launched)."""
        job = self._job(compile_call)
        if job is not None:
            started = self._start(job, urgent)
            if futures is not None:
                futures.append(started)
        future = Future()
        future.set_exception(_Prefetched())
        return future

    def close_idle(self) -> None:
        """Let the idle workers exit (at this process's exit too)."""
        self.pool.close_idle()
        self.ahead_pool.close_idle()

    def shutdown(self) -> None:
        """Wait for the compiles under way, then let the idle workers exit."""
        self.threads.shutdown(wait=True)
        self.prefetch_threads.shutdown(wait=True)
        self.start_threads.shutdown(wait=True)
        self.close_idle()
        atexit.unregister(self.close_idle)


class _Recorder:
    """The executor of a prefetch (see :meth:`ProcessExecutor.prefetch_submit`); keeps the futures of the jobs
    it started."""

    def __init__(self, owner: ProcessExecutor, urgent: bool):
        self.owner, self.urgent, self.futures, self.outcomes = owner, urgent, [], []

    def submit(self, compile_call) -> Future:
        outcome = self.owner.prefetch_submit(compile_call, self.urgent, self.futures)
        self.outcomes.append(outcome)
        return outcome
