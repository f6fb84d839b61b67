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
