"""Ranges of tasks of a numba kernel on a few Python threads (the kernels release the GIL).

numba's parallel loops (``parallel=True``, ``prange``) would do the same, but compiling them costs about as
much again as the kernel itself. Which rows a task does depends on the shapes alone, never on the threads, so
the results do not depend on how many threads run the tasks.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

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
    """After a fork the child has none of the parent's threads: it makes a pool of its own when needed."""
    global _pool, _workers, _lock
    _pool, _workers, _lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def run(function: Callable[[int, int], None], tasks: int, threads: int) -> None:
    """``function(first, last)`` for ``threads`` contiguous ranges that cover ``range(tasks)``: the last range
    on the calling thread, the others on pool threads; returns when all are done (raising the first error)."""
    bounds = [tasks * i // threads for i in range(threads + 1)]
    if threads <= 1:
        function(0, tasks)
        return
    pool = _executor(threads - 1)
    futures = [pool.submit(function, bounds[i], bounds[i + 1]) for i in range(threads - 1)]
    try:
        function(bounds[-2], bounds[-1])
    finally:
        for future in futures:  # wait for every range before the caller's buffers may go
            future.exception()
    for future in futures:
        future.result()
