"""A generated kernel's first launch: every configuration compiled at once (in threads, under Triton's async
compile mode), the autotuner's state read under the kernel's lock, a note on stderr when the first launch
takes long, and the brief timing of a configuration. Stand-in kernels record what they are asked to do, so
these run without a GPU; the timing itself needs one."""
import threading
from concurrent.futures import Future
import time

import pytest
import torch

pytest.importorskip("triton")
import triton  # noqa: E402

from sparse_accumulation.kernels.triton import build, launch  # noqa: E402


class _Function:
    """A stand-in for a JITFunction: records each warm-up (its constexprs and options) and the thread."""

    def __init__(self):
        self.warmed = []

    def warmup(self, *args, grid, **kwargs):
        from triton.runtime._async_compile import active_mode

        self.warmed.append((args, kwargs, active_mode.get() is not None))


class _Autotuned:
    """A stand-in for an autotuned kernel: configurations, the function, and a run that records its call."""

    def __init__(self, configs, seconds=0.0):
        self.configs = configs
        self.fn = _Function()
        self.runs = []
        self.seconds = seconds
        self.best_config = None

    def run(self, *args, grid, warmup):
        time.sleep(self.seconds)
        self.runs.append(args)
        self.best_config = self.configs[len(self.runs) % len(self.configs)]
        return f"compiled {len(self.runs)}"


@pytest.fixture(autouse=True)
def fresh_launch_records(monkeypatch):
    """Stand-ins are freed after each test, and a new object may take a freed one's id: no records carry over."""
    monkeypatch.setattr(launch, "_launched", set())
    monkeypatch.setattr(launch, "_kernel_locks", {})


def _configs():
    return [triton.Config({"BLOCK_R": b}, num_warps=w) for b, w in ((32, 1), (64, 2), (128, 4))]


def test_precompile_warms_every_configuration_in_async_mode(monkeypatch):
    monkeypatch.setattr(build, "interpreting", lambda: False)
    kernel = _Autotuned(_configs())
    args = [torch.zeros(3), 5]
    build.precompile(kernel, args, grid=lambda meta: (1,))
    assert [kwargs["BLOCK_R"] for _, kwargs, _ in kernel.fn.warmed] == [32, 64, 128]
    assert [kwargs["num_warps"] for _, kwargs, _ in kernel.fn.warmed] == [1, 2, 4]
    assert all(in_async_mode for _, _, in_async_mode in kernel.fn.warmed)
    assert all(warmed_args == tuple(args) for warmed_args, _, _ in kernel.fn.warmed)


def test_precompile_skips_single_configurations_the_interpreter_and_when_switched_off(monkeypatch):
    monkeypatch.setattr(build, "interpreting", lambda: False)
    single = _Autotuned(_configs()[:1])
    build.precompile(single, [torch.zeros(3)], grid=lambda meta: (1,))
    assert single.fn.warmed == []
    monkeypatch.setattr(build, "PARALLEL_COMPILE", False)
    several = _Autotuned(_configs())
    build.precompile(several, [torch.zeros(3)], grid=lambda meta: (1,))
    assert several.fn.warmed == []
    monkeypatch.setattr(build, "PARALLEL_COMPILE", True)
    monkeypatch.setattr(build, "interpreting", lambda: True)
    build.precompile(several, [torch.zeros(3)], grid=lambda meta: (1,))
    assert several.fn.warmed == []


def test_first_launch_precompiles_once_per_tuning_key_and_returns_the_configuration_it_ran(monkeypatch):
    precompiled = []
    monkeypatch.setattr(build, "precompile", lambda kernel, args, grid: precompiled.append(args[-1]))
    kernel = _Autotuned(_configs())
    x = torch.zeros(4)
    for tuning in (3, 3, 7):
        compiled, config = launch._run_locked(kernel, lambda meta: (1,), [x, tuning], tuning)
        assert compiled == f"compiled {len(kernel.runs)}"
        assert config is kernel.best_config
    assert precompiled == [3, 7]
    # another dtype is another first launch
    launch._run_locked(kernel, lambda meta: (1,), [x.double(), 3], 3)
    assert precompiled == [3, 7, 3]


def test_threads_launching_one_kernel_take_turns(monkeypatch):
    monkeypatch.setattr(build, "precompile", lambda kernel, args, grid: None)
    kernel = _Autotuned(_configs(), seconds=0.01)
    inside, overlaps = [], []
    original = kernel.run

    def run(*args, **kwargs):
        if inside:
            overlaps.append(True)
        inside.append(True)
        try:
            return original(*args, **kwargs)
        finally:
            inside.pop()

    kernel.run = run
    threads = [threading.Thread(target=launch._run_locked, args=(kernel, lambda meta: (1,), [torch.zeros(2), 1], 1))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(kernel.runs) == 8 and not overlaps


def test_a_long_first_launch_says_it_is_compiling(monkeypatch, capsys):
    monkeypatch.setattr(build, "precompile", lambda kernel, args, grid: None)
    monkeypatch.setattr(launch, "NOTE_AFTER_SECONDS", 0.01)
    monkeypatch.setattr(launch, "_noted", threading.Event())
    launch._run_locked(_Autotuned(_configs(), seconds=0.2), lambda meta: (1,), [torch.zeros(2), 11], 11)
    assert "compiling GPU kernels on first use" in capsys.readouterr().err
    # once per process
    launch._run_locked(_Autotuned(_configs(), seconds=0.2), lambda meta: (1,), [torch.zeros(2), 12], 12)
    assert capsys.readouterr().err == ""


def test_a_quick_first_launch_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(build, "precompile", lambda kernel, args, grid: None)
    monkeypatch.setattr(launch, "_noted", threading.Event())
    launch._run_locked(_Autotuned(_configs()), lambda meta: (1,), [torch.zeros(2), 13], 13)
    assert capsys.readouterr().err == ""


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quick_bench_times_a_launch():
    x = torch.randn(1 << 24, device="cuda")
    calls = []

    def call():
        calls.append(1)
        torch.mul(x, 2.0)

    median = build.quick_bench(call)
    median_again, low, high = build.quick_bench(call, quantiles=(0.5, 0.2, 0.8))
    assert 0 < low <= median_again <= high
    assert median > 0.01  # 64 MB read and written: tens of microseconds at least
    assert 4 <= len(calls) <= 52


@pytest.fixture
def background_compiles(monkeypatch):
    """Compiles ahead of need possible (as with compile workers on a GPU machine); the compiles that
    :func:`build.compiled` starts are recorded (kernel, ``urgent``, two futures that the test sets)."""
    monkeypatch.setattr(launch, "_ready", set())
    monkeypatch.setattr(launch, "_noted_background", threading.Event())
    monkeypatch.setattr(launch, "WAIT_FOR_COMPILES", False)
    monkeypatch.setattr(build, "_compiling", {})
    monkeypatch.setattr(build, "prefetching", lambda: True)
    started = []

    def prefetch(kernel, args, grid, urgent=False):
        started.append((kernel, urgent, [Future(), Future()]))
        return started[-1][2]

    monkeypatch.setattr(build, "prefetch", prefetch)
    return started


def test_a_kernel_not_compiled_yet_compiles_in_the_background_until_ready(background_compiles, capsys):
    started = background_compiles
    kernel = _Autotuned(_configs())
    pointers, ints = [torch.zeros(3), torch.zeros(2)], [5]
    assert not launch.ready(kernel, None, pointers, ints)
    assert "compiling in the background" in capsys.readouterr().err
    assert not launch.ready(kernel, None, pointers, ints)
    assert [s[:2] for s in started] == [(kernel, True)]  # started once, at this process's priority
    futures = started[0][2]
    futures[0].set_result(("ok", "hash"))
    assert not launch.ready(kernel, None, pointers, ints)  # one configuration still compiling
    futures[1].set_result(None)  # a worker that failed: the launch compiles it here, as before
    assert launch.ready(kernel, None, pointers, ints) and launch.ready(kernel, None, pointers, ints)
    assert len(started) == 1 and capsys.readouterr().err == ""
    # another dtype is another kernel to compile
    assert not launch.ready(kernel, None, [p.double() for p in pointers], ints)
    assert len(started) == 2


def test_where_a_launch_must_wait_for_its_compile(background_compiles, monkeypatch):
    started = background_compiles
    pointers, ints = [torch.zeros(3)], [5]
    with launch.compile_only():  # a prefetch: the launch itself only hands the kernel to workers
        assert launch.ready(_Autotuned(_configs()), None, pointers, ints)
    monkeypatch.setattr(launch, "_capturing_or_warming_up", lambda tensor: True)  # a capture, or a side stream
    assert launch.ready(_Autotuned(_configs()), None, pointers, ints)
    monkeypatch.setattr(launch, "_capturing_or_warming_up", lambda tensor: False)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert launch.ready(_Autotuned(_configs()), None, pointers, ints)  # the portable kernels add atomically
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: False)
    monkeypatch.setattr(launch, "WAIT_FOR_COMPILES", True)
    assert launch.ready(_Autotuned(_configs()), None, pointers, ints)
    monkeypatch.setattr(launch, "WAIT_FOR_COMPILES", False)
    monkeypatch.setattr(build, "prefetching", lambda: False)  # no workers: compiles cannot run ahead
    monkeypatch.setattr(build, "prefetch", lambda *args, **kwargs: pytest.fail("nothing compiles ahead"))
    assert launch.ready(_Autotuned(_configs()), None, pointers, ints)
    assert started == []


def test_a_first_launch_under_capture_runs_the_first_configuration_untuned(monkeypatch):
    """Timing runs cannot be captured in a CUDA graph: a kernel first launched under capture runs its first
    configuration, and is tuned at its first launch outside the capture."""
    monkeypatch.setattr(build, "precompile", lambda kernel, args, grid: None)
    kernel = _Autotuned(_configs())
    untuned = []
    kernel.fn.run = lambda *args, grid, warmup, **kwargs: untuned.append(kwargs) or "untuned"
    monkeypatch.setattr(launch, "_capturing", lambda tensor: True)
    assert launch._run_locked(kernel, lambda meta: (1,), [torch.zeros(2), 21], 21) == ("untuned", None)
    assert [k["BLOCK_R"] for k in untuned] == [32] and kernel.runs == []
    monkeypatch.setattr(launch, "_capturing", lambda tensor: False)
    compiled, config = launch._run_locked(kernel, lambda meta: (1,), [torch.zeros(2), 21], 21)
    assert compiled == "compiled 1" and config is kernel.best_config and len(untuned) == 1


def test_bench_and_check_run_with_launches_waiting_for_their_compiles(background_compiles):
    """``bench`` and ``check`` time and check the compiled kernels: inside them no launch takes the interim."""
    from sparse_accumulation.bench import run_benchmark, run_check
    from sparse_accumulation.bench.timing import waits_for_compiles

    seen = []
    waits_for_compiles(lambda: seen.append(launch.ready(_Autotuned(_configs()), None, [torch.zeros(3)], [5])))()
    assert seen == [True] and background_compiles == []
    assert not launch.ready(_Autotuned(_configs()), None, [torch.zeros(3)], [5])  # outside it, the interim again
    # the backward of CUDA tensors runs on autograd's threads: they wait too
    in_thread = []

    def other_thread():
        thread = threading.Thread(target=lambda: in_thread.append(
            launch.ready(_Autotuned(_configs()), None, [torch.zeros(3)], [5])))
        thread.start()
        thread.join()

    waits_for_compiles(other_thread)()
    assert in_thread == [True]
    assert run_benchmark.__wrapped__ and run_check.__wrapped__
