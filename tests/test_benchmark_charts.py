"""benchmarks/plots.py: the recorded JSON files convert to chart records with the right times and floors."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from sparse_accumulation import bench

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def plots():
    spec = importlib.util.spec_from_file_location("plots", BENCHMARKS / "plots.py")
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    spec.loader.exec_module(module)
    sys.path[:] = path  # the script puts the repository root first
    return module


def _load(name):
    return json.loads((BENCHMARKS / name).read_text())


def test_gpu_records_carry_the_recorded_times_and_floors(plots):
    data = _load("gpu_h200.json")
    records = plots.gpu_records(data)
    first = data["results"][0]
    kernel = next(r for r in records if r["case"] == first["case"] and r["implementation"] == "ours: kernel alone")
    assert kernel["mode"] == "forward" and kernel["ms"] == first["ms"]["ours_auto_fwd"]
    assert kernel["floor_ms"] == first["floor_fwd_ms"]
    backward = [r for r in records if r["case"] == first["case"] and r["mode"] == "backward"]
    assert {r["floor_ms"] for r in backward} == {first["floor_fwdbwd_ms"]}
    assert len({r["case"] for r in records}) == len(data["results"])


def test_cpu_records_use_the_floor_bytes_of_bench(plots):
    data = _load("cpu.json")
    records = plots.cpu_records(data, 1e10)
    assert len(records) == 4 * len(data["results"])  # numba and index_add, forward and forward+backward
    r = next(r for r in records if r["case"] == "8x8->8" and r["implementation"] == "numba" and r["mode"] == "backward")
    case = bench.Case(8, 8, 8, tuple(data["rows"]), torch.float32, "cpu")
    assert r["floor_ms"] == pytest.approx(bench.floor_bytes(case, "backward") / 1e10 * 1e3)
    recorded = next(x for x in data["results"] if x["rule"] == "8x8->8")
    assert r["ms"] == recorded["numba"]["forward+backward"]


def test_iteration_records_and_their_chart(plots, tmp_path):
    pytest.importorskip("matplotlib")
    data = _load("iteration_cpu.json")
    records = plots.iteration_records(data)
    assert {r["implementation"] for r in records} == set(data["results"])
    assert len(records) == 2 * len(data["results"])
    paths = bench.plot_times(records, tmp_path / "iteration")
    assert all(Path(p).stat().st_size > 1000 for p in paths)
