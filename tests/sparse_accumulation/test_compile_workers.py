"""Triton kernels compiled by worker processes into Triton's disk cache, then loaded by this process.

The kernels are compiled for a CUDA target, which Triton does without a GPU (its compiler and ``ptxas`` run on
the host), so these run on the CPU machine; the compile call stands in for the one Triton's asynchronous mode
submits, with the names its closure has (the CUDA selection checks the real one, through a first launch)."""
import gc
import inspect
import os
import subprocess
import sys
import textwrap
import weakref

import pytest

triton = pytest.importorskip("triton")

from sparse_accumulation.kernels.triton import build, compile_workers  # noqa: E402
from sparse_accumulation.kernels.triton.graph_source import segment_sum_source  # noqa: E402


def _compile_call(name: str, num_warps: int, cache_listings: list):
    """A compile call shaped like Triton's (``src``, ``target``, ``options``, ``env_vars`` in its closure) for
    the segment-sum kernel; it records what the cache folder held when it ran."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.compiler.compiler import ASTSource

    function = triton.jit(build.load_function(segment_sum_source(name, "tl.float32", True), name),
                          do_not_specialize=["WIDTH", "SZ", "SO"])
    signature = {"Z": "*fp32", "OFFSETS": "*i64", "ORDER": "*i64", "OUT": "*fp32", "WIDTH": "i32", "SZ": "i32",
                 "SO": "i32", "BLOCK_C": "constexpr"}
    src = ASTSource(function, signature, {(7,): 128}, {})
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": num_warps})
    env_vars = {}

    def async_compile():
        cache_listings.append(sorted(os.listdir(os.environ["TRITON_CACHE_DIR"])))
        return triton.compile(src, target=target, options=options.__dict__, _env_vars=env_vars)

    return async_compile


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("SPARSE_ACCUMULATION_TRITON_CACHE", str(tmp_path / "sources"))
    os.makedirs(tmp_path / "triton")
    listings = []
    try:  # Triton without its NVIDIA backend or ptxas here cannot compile for CUDA at all
        _compile_call("sparse_accumulation_probe", 1, listings)()
    except Exception as error:  # pragma: no cover - depends on the Triton installed
        pytest.skip(f"Triton cannot compile for a CUDA target here: {error}")
    return tmp_path / "triton"


_executors = []


def _executor(workers=2):
    executor = compile_workers.ProcessExecutor(workers)
    _executors.append(executor)
    return executor


@pytest.fixture(autouse=True)
def shut_down_workers():
    yield
    while _executors:
        _executors.pop().shutdown()


def test_a_worker_compiles_into_the_cache_and_this_process_loads_the_same_kernel(private_cache):
    executor = _executor()
    listings = []
    calls = [_compile_call("sparse_accumulation_worker_test", w, listings) for w in (1, 4)]
    assert not any(compile_workers._in_cache(compile_workers.describe(c)) for c in calls)
    kernels = [future.result() for future in [executor.submit(c) for c in calls]]
    assert executor.enabled and executor.compiled_by_workers == 2
    # each call ran after a worker had written its kernel: the cache held more than the probe's entries
    assert all(len(listing) > 1 for listing in listings)
    assert all(compile_workers._in_cache(compile_workers.describe(c)) for c in calls)
    assert executor._job(calls[0]) is None  # on disk: this process loads it, no worker is asked
    again = [c() for c in calls]  # compiled in this process only: found on disk, the same kernels
    assert [k.hash for k in kernels] == [k.hash for k in again]
    assert len({k.hash for k in kernels}) == 2
    assert kernels[0].asm["cubin"] == again[0].asm["cubin"]


def test_what_a_worker_cannot_do_is_compiled_here(private_cache):
    executor = _executor()
    listings = []
    call = _compile_call("sparse_accumulation_worker_error", 2, listings)
    job = compile_workers.describe(call)
    job["path"] = str(private_cache / "missing.py")  # the worker cannot import the kernel's module
    assert executor.pool.run(compile_workers._wire(job))[0] == "error"

    def unreadable():  # no closure Triton's way: not described, compiled here
        return call()

    assert compile_workers.describe(unreadable) is None
    before = sorted(os.listdir(private_cache))
    kernel = executor.submit(unreadable).result()
    assert listings == [before]  # nothing had compiled it before this process did
    assert len(os.listdir(private_cache)) > len(before)
    assert kernel.hash == call().hash and executor.enabled and executor.compiled_by_workers == 0


def test_a_kernel_that_differs_from_the_workers_turns_workers_off(private_cache, monkeypatch):
    executor = _executor()
    monkeypatch.setattr(executor.pool, "run", lambda job: ("ok", "another hash"))
    executor.submit(_compile_call("sparse_accumulation_worker_mismatch", 2, [])).result()
    assert not executor.enabled and executor.compiled_by_workers == 0


def test_a_worker_that_is_gone_is_replaced(private_cache):
    executor = _executor(workers=1)
    listings = []
    executor.submit(_compile_call("sparse_accumulation_worker_first", 1, listings)).result()
    (worker,) = executor.pool.idle
    worker.process.kill()
    worker.process.wait()
    executor.submit(_compile_call("sparse_accumulation_worker_second", 1, listings)).result()
    (replacement,) = executor.pool.idle
    assert replacement is not worker and replacement.process.poll() is None
    assert worker.process.stdin.closed and worker.process.stdout.closed  # the gone one's pipes
    assert len(listings[1]) == len(listings[0]) + 1  # the replacement compiled the second kernel before it ran


def test_closed_workers_exit_and_are_reaped_with_their_pipes_closed(private_cache):
    """After ``shutdown`` (and at this process's exit, through the same ``close_idle``) every idle worker has
    exited and been waited for: none is left running or holding a pipe (Python warns of those)."""
    executor = _executor(workers=2)
    calls = [_compile_call("sparse_accumulation_worker_close", w, []) for w in (1, 2)]
    for future in [executor.submit(c) for c in calls]:
        future.result()
    workers = list(executor.pool.idle)
    assert len(workers) == 2 and all(w.process.poll() is None for w in workers)
    executor.shutdown()
    assert executor.pool.idle == [] and executor.pool.started == 0
    for worker in workers:
        assert worker.process.returncode == 0 and worker.process.stdin.closed and worker.process.stdout.closed


def test_the_worker_count_follows_the_environment(monkeypatch):
    monkeypatch.setenv("SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS", "0")
    assert compile_workers.worker_count() == 0
    monkeypatch.setenv("SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS", "3")
    assert compile_workers.worker_count() == 3
    monkeypatch.delenv("SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS")
    assert 1 <= compile_workers.worker_count() <= 16


def test_the_worker_script_imports_neither_torch_nor_this_package():
    code = textwrap.dedent(f"""
        import runpy, sys
        runpy.run_path({compile_workers._WORKER_SCRIPT!r}, run_name="not_main")
        import triton
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "sparse_accumulation")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _asks_recorded(executor, monkeypatch) -> list:
    """The ``urgent`` flag of each job the executor's pools are asked for, in order."""
    asked = []
    for pool, urgent in ((executor.pool, True), (executor.ahead_pool, False)):
        monkeypatch.setattr(pool, "run", lambda job, original=pool.run, urgent=urgent: asked.append(urgent)
                            or original(job))
    return asked


def test_a_prefetched_compile_is_asked_of_a_worker_once_at_a_lower_priority(private_cache, monkeypatch):
    executor = _executor()
    asked = _asks_recorded(executor, monkeypatch)
    call = _compile_call("sparse_accumulation_worker_prefetched", 2, [])
    failed = executor.prefetch_submit(call)
    assert failed.exception() is not None  # to Triton, the prefetched call compiled nothing here
    kernel = executor.submit(call).result()  # waits for the prefetch's answer, asks no worker again
    assert asked == [False] and executor.compiled_by_workers == 1 and kernel.hash == call().hash
    (ahead,) = executor.ahead_pool.idle
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, ahead.process.pid) == min(19, ours + executor.AHEAD_NICENESS)


def test_an_urgent_compile_started_ahead_reports_when_it_is_on_disk(private_cache, monkeypatch):
    executor = _executor()
    asked = _asks_recorded(executor, monkeypatch)
    call = _compile_call("sparse_accumulation_worker_started", 2, [])
    futures = []
    assert executor.prefetch_submit(call, urgent=True, futures=futures).exception() is not None
    (started,) = futures
    assert started.result(timeout=120)[0] == "ok" and asked == [True]
    assert compile_workers._in_cache(compile_workers.describe(call))
    again = []
    executor.prefetch_submit(call, urgent=True, futures=again)
    assert again == []  # on disk: nothing more to wait for
    kernel = executor.submit(call).result()
    assert asked == [True] and kernel.hash == call().hash


def test_a_prefetch_keeps_nothing_of_its_callers_alive(private_cache):
    """Triton raises a prefetched call's outcome to see it; the traceback must not keep the frames up the stack
    (a model's step, its tensors and autograd graph) alive until a garbage collection: a graph kept from a
    warm-up step on the default stream makes a later CUDA graph capture of the step fail."""
    from triton.runtime import _async_compile

    executor = _executor()
    call = _compile_call("sparse_accumulation_worker_frames", 1, [])

    class Held:  # stands for a tensor that a caller up the stack holds
        pass

    def caller():
        held = Held()

        def warmups():  # what JITFunction.warmup does in Triton's asynchronous mode
            mode = _async_compile.active_mode.get()
            callbacks = len(inspect.signature(mode.submit).parameters) - 2
            mode.submit("key", call, *[lambda *args: None] * callbacks)

        executor.prefetch(warmups, urgent=True)
        return weakref.ref(held)

    gc.collect()
    gc.disable()
    try:
        assert caller()() is None
    finally:
        gc.enable()


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_a_first_launch_on_cuda_compiles_in_workers_and_a_warm_one_starts_none(tmp_path):
    code = textwrap.dedent("""
        import torch
        import sparse_accumulation as sa
        from sparse_accumulation.kernels.triton import build
        m1, m2, mu, C = sa.get_cg_transformation_rule(3, 3, 3, device="cuda")
        X1, X2 = (torch.randn(1000, 4, 7, device="cuda") for _ in range(2))
        out = sa.accumulate(X1, X2, mu, 7, m1, m2, C, implementation="triton")
        expected = sa.accumulate(X1.cpu(), X2.cpu(), mu.cpu(), 7, m1.cpu(), m2.cpu(), C.cpu(), implementation="torch")
        assert torch.allclose(out.cpu(), expected, atol=1e-5)
        executor = build._compile_executor()
        print(type(executor).__name__, executor.enabled, executor.compiled_by_workers, executor.pool.started)
    """)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"),
               SPARSE_ACCUMULATION_TRITON_CACHE=str(tmp_path / "sources"))
    env.pop("SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS", None)
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            .stdout.split() for _ in range(2)]
    (name, enabled, compiled, started), warm = runs
    assert (name, enabled) == ("ProcessExecutor", "True") and int(compiled) >= 2 and int(started) >= 1
    assert warm == ["ProcessExecutor", "True", "0", "0"]
