"""The one thread pool of the numba kernels: tasks of a call on a few Python threads (the kernels release the GIL).

numba's parallel loops (``parallel=True``, ``prange``) would do the same, but compiling them costs about as
much again as the kernel itself. Which rows a task does depends on the shapes alone, never on the threads, so
the results do not depend on how many threads run the tasks. A child process forked after a threaded call
has none of the parent's threads: it makes a pool of its own on its first threaded call.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Sequence

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_workers = 0


def _executor(workers: int) -> ThreadPoolExecutor:
    """A pool of at least ``workers`` threads, made or grown on demand."""
    global _pool, _workers
    with _lock:
        if _pool is None or _workers < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _workers = ThreadPoolExecutor(workers, thread_name_prefix="sparse-accumulation"), workers
        return _pool


def _forget_pool() -> None:
    global _pool, _workers, _lock
    _pool, _workers, _lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def run_tasks(function: Callable[..., None], tasks: Sequence[tuple], threads: int) -> None:
    """``function(*task)`` for every task, taken in turn by the calling thread and ``threads - 1`` pool threads;
    returns when all are done (raising the first error), so no task still writes when it returns."""
    helpers = min(threads, len(tasks)) - 1
    if helpers <= 0:
        for task in tasks:
            function(*task)
        return
    pending = iter(tasks)
    taking = threading.Lock()

    def work():
        while True:
            with taking:
                task = next(pending, None)
            if task is None:
                return
            function(*task)

    futures = [_executor(helpers).submit(work) for _ in range(helpers)]
    try:
        work()
    finally:
        wait(futures)
    for future in futures:
        future.result()


def run(function: Callable[[int, int], None], tasks: int, threads: int) -> None:
    """``function(first, last)`` for ``threads`` contiguous ranges that cover ``range(tasks)``, one per thread."""
    threads = max(1, min(threads, tasks))
    bounds = [tasks * i // threads for i in range(threads + 1)]
    run_tasks(function, list(zip(bounds[:-1], bounds[1:])), threads)
