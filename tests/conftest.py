"""Fixtures shared by the whole suite: fresh random seeds that are reported when a test fails."""
import os

import pytest
import torch

# The processes the tests start (scripts, the command line, `python -c`) import this package from the tree under
# test, whether or not it is installed
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))

# A GPU kernel launched before it is compiled waits for its compile here, instead of computing with the portable
# torch kernels meanwhile: the tests of the Triton kernels test those kernels (tests of the portable interim set
# it themselves).
os.environ.setdefault("SPARSE_ACCUMULATION_TRITON_WAIT", "1")

# NequIP's own tests and fixtures run in a child pytest of their own (tests/test_nequip.py): their conftest sets
# process-wide state and needs nequip, so this suite never collects their folder
collect_ignore = ["nequip_suite"]


@pytest.fixture
def generator(request):
    """A torch generator with a fresh seed for every test; the seed is printed if the test fails."""
    g = torch.Generator()
    g.seed()
    request.node.random_seed = g.initial_seed()
    return g


@pytest.fixture
def threads():
    """At least two torch threads for the test (the CPU kernels run threaded paths on as many threads)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(max(2, previous))
    yield torch.get_num_threads()
    torch.set_num_threads(previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item, "random_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("random seed", f"torch.Generator().manual_seed({seed})"))


#: what uninitialised memory holds in the tests that use :func:`sentinel_outputs`: NaN in floating tensors, this
#: in integer ones (a row index no test uses)
INTEGER_SENTINEL = -987654321


def _filled(tensor):
    with torch.no_grad():  # leaves made with requires_grad=True (torch's compilers make such) are filled too
        if tensor.is_floating_point() or tensor.is_complex():
            return tensor.fill_(float("nan"))
        if tensor.dtype != torch.bool and tensor.dtype.itemsize >= 4:
            return tensor.fill_(INTEGER_SENTINEL)
    return tensor


@pytest.fixture
def sentinel_outputs(monkeypatch):
    """Every ``torch.empty``, ``torch.empty_like`` and ``Tensor.new_empty`` made from Python during the test, and
    every CPU output buffer of the numba kernels (:mod:`sparse_accumulation.kernels.numba.buffers`, none reused), comes
    filled with a sentinel (NaN, or :data:`INTEGER_SENTINEL`) instead of whatever memory held: a kernel that
    leaves part of an output unwritten fails the test every time, not only where the memory held garbage.
    (Arrays a compiled numba function makes itself are not reached: they are its scratch space.)"""
    from sparse_accumulation.kernels.numba import buffers

    empty, empty_like, new_empty, buffer = torch.empty, torch.empty_like, torch.Tensor.new_empty, buffers.empty

    def filled_buffer(shape, dtype):
        array = buffer(shape, dtype)
        array.fill(float("nan"))  # (the kernels' buffers are floating point)
        return array

    monkeypatch.setattr(torch, "empty", lambda *a, **k: _filled(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _filled(empty_like(*a, **k)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: _filled(new_empty(self, *a, **k)))
    monkeypatch.setattr(buffers, "empty", filled_buffer)
    buffers.release()
    monkeypatch.setattr(buffers, "MAX_BYTES", 0)  # no output reuses an earlier one's memory


# On a machine with a spare core, a whole-suite run compiles the CPU kernels in a child process
# (`sparse-accumulation warmup`, started by one of pytest-xdist's workers) while the first tests run: the tests
# then load most kernels from numba's disk cache instead of compiling each one when it is first called. Set
# SPARSE_ACCUMULATION_TEST_WARMUP=0 to turn it off; a run of a few tests never starts it.
_WARMUP_MIN_TESTS = 200
_warmup = None


def pytest_collection_finish(session):
    global _warmup
    import importlib.util
    import subprocess
    import sys

    wanted = (os.environ.get("SPARSE_ACCUMULATION_TEST_WARMUP", "1") != "0"
              and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0")
    if (not wanted or len(session.items) < _WARMUP_MIN_TESTS or (os.cpu_count() or 1) < 2
            or importlib.util.find_spec("numba") is None):
        return
    _warmup = subprocess.Popen([sys.executable, "-m", "sparse_accumulation", "warmup", "--quiet"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=(lambda: os.nice(10)) if hasattr(os, "nice") else None)


def pytest_sessionfinish(session, exitstatus):
    if _warmup is not None and _warmup.poll() is None:
        _warmup.terminate()
        _warmup.wait()
