"""Fixtures shared by the whole suite: fresh random seeds that are reported when a test fails."""
import pytest
import torch


@pytest.fixture
def generator(request):
    """A torch generator with a fresh seed for every test; the seed is printed if the test fails."""
    g = torch.Generator()
    g.seed()
    request.node.random_seed = g.initial_seed()
    return g


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item, "random_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("random seed", f"torch.Generator().manual_seed({seed})"))
