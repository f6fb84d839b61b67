"""The benchmark package from Python: cases, checks before timing, the timings, the charts."""
import sys

import pytest
import torch

from sparse_accumulation import backends, bench
from sparse_accumulation.bench import implementations, runner, timing


class RaisingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("kernel exploded")


def test_a_raising_implementation_is_failed_not_fatal(monkeypatch):
    real = implementations.forward_function

    def forward_function(name, case, rule):
        function = real(name, case, rule)
        return (lambda X1, X2, C: RaisingBackward.apply(function(X1, X2, C))) if name == "numba" else function

    monkeypatch.setattr(runner, "forward_function", forward_function)
    cases = [bench.Case(1, 1, 2, (2, 3), torch.float64, "cpu")]
    results = bench.run_benchmark(cases, ["numba"], modes=["forward", "backward"], repeats=1, warmup=0)
    status = {(r["implementation"], r["mode"]): r for r in results}
    assert status[("numba", "forward")]["status"] == "ok"
    assert status[("index_add", "backward")]["status"] == "ok"
    failed = status[("numba", "backward")]
    assert failed["status"] == "FAILED" and failed["note"] == "RuntimeError: kernel exploded"
    assert failed["median_ms"] is None and failed["speedup"] is None and failed["timings"] == {}


def test_e3nn_and_the_coefficient_gradient_are_checked():
    pytest.importorskip("e3nn")
    cases = [bench.Case(2, 1, 3, (2, 3), torch.float32, "cpu")]
    results = bench.run_benchmark(cases, ["numba", "e3nn"], modes=["backward"], timings=["kernel"], repeats=1,
                                  warmup=0, grad_c=True)
    assert [r["status"] for r in results] == ["ok", "ok", "ok"]
    assert all(r["error"] < 1e-5 for r in results)
    e3nn_row = next(r for r in results if r["implementation"] == "e3nn")
    assert "no dC" in e3nn_row["note"]


def test_what_cannot_run_is_skipped():
    cases = [bench.Case(2, 2, 2, (2, 2), torch.float32, "cpu")]
    results = bench.run_benchmark(cases, ["triton"], modes=["fwd"], timings=["kernel", "reduce-overhead"],
                                  repeats=1, warmup=0)
    triton = next(r for r in results if r["implementation"] == "triton")
    if not backends.is_available("triton", "cpu"):
        assert triton["status"] == "skipped" and "not available" in triton["note"]
    index_add = next(r for r in results if r["implementation"] == "index_add")
    assert index_add["timings"]["reduce-overhead"] == {"status": "skipped", "note": "CUDA only", "median": None,
                                                       "samples": [], "unit": "ms"}
    assert index_add["primary"] == "kernel"
    big = bench.Case(8, 8, 8, (1000, 200), torch.float32, "cpu")
    assert implementations.unavailable_reason("loops", big, "forward", 361) == "too large for the loop reference"


def test_standard_cases():
    cases = bench.standard_cases(devices=["cpu"])
    assert [c.rule_name for c in cases] == ["8x8->8", "4x4->4", "2x2->2", "3x2->4", "1x1->2"]
    assert all(c.rows == (1000, 200) and c.dtype == torch.float32 for c in cases)
    quick = bench.standard_cases(quick=True, devices=["cpu"], dtypes=[torch.float64])
    assert quick and all(c.n_rows <= 10_000 and c.dtype == torch.float64 for c in quick)


def test_timing_names():
    assert bench.normalize_timings(["host", "kernel", "host"]) == ("kernel", "host")
    with pytest.raises(ValueError, match="unknown timing 'eventually'"):
        bench.normalize_timings(["eventually"])


def test_a_training_step_resets_the_gradients_it_returns():
    generator = torch.Generator().manual_seed(1)
    X1, X2, C = (torch.randn(4, 3, generator=generator, dtype=torch.float64) for _ in range(3))
    G = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    step = timing.make_step(lambda a, b, c: a * b * c, "backward", X1, X2, C, G, requires_grad=True, grad_c=True)
    step()
    dX1, dX2, dC = step()  # a second step: the gradients of one step, not the sum of two
    torch.testing.assert_close(dX1, G * X2 * C)
    torch.testing.assert_close(dX2, G * X1 * C)
    torch.testing.assert_close(dC, G * X1 * X2)
    forward = timing.make_step(lambda a, b, c: a * b, "forward", X1, X2, C, G, requires_grad=True)
    out = forward()
    assert out.requires_grad
    torch.testing.assert_close(out.detach(), X1 * X2)
    assert not timing.make_step(lambda a, b, c: a * b, "forward", X1, X2, C, G, requires_grad=False)().requires_grad


@pytest.mark.parametrize("name", ["kernel", "call", "host"])
def test_measure_takes_the_requested_samples(name):
    calls = []
    samples = timing.measure(name, lambda: calls.append(1), "cpu", repeats=4, warmup=2, max_seconds=10.0)
    assert all(value > 0 for value in samples)
    if name == "call":
        assert len(samples) >= 4
    else:
        assert len(samples) == 4
    assert len(calls) >= 2 + len(samples)  # warm-up, at least one call per sample


def test_copy_bandwidth_is_positive():
    assert bench.copy_bandwidth("cpu", n_bytes=2**22) > 1e8


def test_plot_times_draws_every_implementation_and_the_floor(tmp_path):
    pytest.importorskip("matplotlib")
    records = [{"case": case, "implementation": name, "mode": mode, "timing": "kernel", "ms": ms,
                "floor_ms": floor}
               for case, floor in (("8x8->8", 0.1), ("2x2->2", 0.03))
               for mode in ("forward", "backward")
               for name, ms in (("ours", 0.2), ("reference", 15.0))]
    records.append({"case": "8x8->8", "implementation": "unmeasured", "mode": "forward", "ms": None})
    records.append({"case": "2x2->2", "implementation": "broken", "mode": "forward", "timing": "kernel",
                    "ms": None, "failed": True})
    paths = bench.plot_times(records, tmp_path / "chart", title="test chart")
    assert paths == [f"{tmp_path / 'chart'}.png", f"{tmp_path / 'chart'}.svg"]
    from matplotlib.image import imread

    image = imread(paths[0])
    assert image.shape[0] > 200 and image.shape[1] > 400 and image[..., :3].std() > 0.05  # not blank
    svg = (tmp_path / "chart.svg").read_text()
    for text in ("ours", "reference", "floor: bytes / copy bandwidth", "test chart", "forward + backward",
                 "broken", ">failed<"):
        assert text in svg
    assert "unmeasured" not in svg  # no time, no bar, no legend entry
    assert bench.plot_times([{"case": "x", "implementation": "y", "mode": "forward", "ms": None}],
                            tmp_path / "empty") == []


def test_plotting_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "matplotlib.figure", raising=False)
    monkeypatch.delitem(sys.modules, "matplotlib.backends.backend_agg", raising=False)
    with pytest.raises(ImportError, match=r'pip install "sparse-accumulation\[plot\]"') as error:
        bench.plot_times([{"case": "x", "implementation": "y", "mode": "forward", "ms": 1.0}], tmp_path / "c")
    assert error.value.name == "matplotlib"
