"""The ``sparse-accumulation`` command line (bench, check, tables), called in-process on tiny sizes."""
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

import cg
from sparse_accumulation import backends, bench
from sparse_accumulation.cli import main
from sparse_accumulation.kernels import numba_cpu

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--rows", "3", "5", "--repeats", "1", "--warmup", "0", "--quiet", "--device", "cpu"]


def _table_rows(text):
    """The data lines of the bench table as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("------"))
    rows = []
    for line in lines[start + 1:]:
        if not line[:1].isdigit():
            break
        rows.append(line.split())
    return rows


def _read_png(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    idat = data.index(b"IDAT")
    length = struct.unpack(">I", data[idat - 4:idat])[0]
    raw = zlib.decompress(data[idat + 4:idat + 4 + length])
    assert len(raw) == height * (1 + 3 * width)
    return width, height


@pytest.fixture
def wrong_numba(monkeypatch):
    """Make the numba forward kernel return slightly wrong values."""
    original = numba_cpu.accumulate

    def wrong(*args):
        out = original(*args)
        out.view(-1)[0] += 1.0
        return out

    monkeypatch.setattr(numba_cpu, "accumulate", wrong)


def test_bench_quick_writes_table_json_and_plot(tmp_path, capsys):
    code = main(["bench", "--quick", "--l", "2", "1", "2", "--l", "1", "1", "1", "--output", str(tmp_path),
                 "--implementations", "numba,torch,dense,sparse,loops", "--grad-c", *TINY])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    rows = _table_rows(captured.out)
    implementations = ["index_add", "numba", "torch", "dense", "sparse", "loops"]
    assert len(rows) == 2 * 2 * len(implementations)  # rules x modes x implementations
    assert {r[4] for r in rows} == set(implementations)
    assert all(r[-1] == "ok" for r in rows)
    assert all(r[7] == "1.00x" for r in rows if r[4] == "index_add")
    assert "all results checked" in captured.out

    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["command"].startswith("sparse-accumulation bench --quick")
    assert saved["environment"]["torch"] == torch.__version__
    results = saved["results"]
    assert len(results) == len(rows)
    for r in results:
        assert r["status"] == "ok" and r["median_ms"] > 0 and r["error"] < 1e-4
        assert r["GBps"] == pytest.approx(r["floor_bytes"] / r["median_ms"] / 1e6)
    # floor bytes: X1, X2 read and the output written, plus the rule
    forward = next(r for r in results if r["rule"] == "2x1->2" and r["mode"] == "forward")
    nnz = forward["nnz"]
    assert forward["floor_bytes"] == 15 * (5 + 3 + 5) * 4 + nnz * (4 + 24)
    assert _read_png(tmp_path / "bench.png")[1] > 50
    assert str(tmp_path / "bench.png") in captured.out


def test_bench_refuses_a_wrong_implementation(wrong_numba, tmp_path, capsys):
    code = main(["bench", "--l", "2", "2", "2", "--implementations", "numba", "--modes", "forward", *TINY,
                 "--output", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    rows = {r[4]: r for r in _table_rows(captured.out)}
    assert rows["index_add"][-1] == "ok"
    numba_row = rows["numba"]
    assert "FAILED" in numba_row and numba_row[6] == "-" and numba_row[7] == "-"  # not timed
    assert "1 FAILED" in captured.out
    saved = json.loads((tmp_path / "bench.json").read_text())["results"]
    failed = [r for r in saved if r["status"] == "FAILED"]
    assert [r["implementation"] for r in failed] == ["numba"]
    assert failed[0]["median_ms"] is None and "wrong out" in failed[0]["note"]


def test_bench_reports_a_raising_implementation(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(numba_cpu, "accumulate_backward", broken)
    cases = [bench.Case(1, 1, 2, (2, 3), torch.float64, "cpu")]
    results = bench.run_benchmark(cases, ["numba"], modes=["forward", "backward"], repeats=1, warmup=0)
    status = {(r["implementation"], r["mode"]): r for r in results}
    assert status[("numba", "forward")]["status"] == "ok"
    failed = status[("numba", "backward")]
    assert failed["status"] == "FAILED" and failed["note"] == "RuntimeError: kernel exploded"
    assert failed["median_ms"] is None and failed["speedup"] is None


def test_bench_checks_e3nn_and_the_coefficient_gradient():
    pytest.importorskip("e3nn")
    cases = [bench.Case(2, 1, 3, (2, 3), torch.float32, "cpu")]
    results = bench.run_benchmark(cases, ["numba", "e3nn"], modes=["backward"], repeats=1, warmup=0,
                                  grad_c=True)
    assert [r["status"] for r in results] == ["ok", "ok", "ok"]
    assert all(r["error"] < 1e-5 for r in results)
    e3nn_row = next(r for r in results if r["implementation"] == "e3nn")
    assert "no dC" in e3nn_row["note"]


def test_bench_skips_what_cannot_run():
    cases = [bench.Case(2, 2, 2, (2, 2), torch.float32, "cpu")]
    results = bench.run_benchmark(cases, ["triton"], modes=["fwd"], repeats=1, warmup=0)
    triton = next(r for r in results if r["implementation"] == "triton")
    if not backends.is_available("triton", "cpu"):
        assert triton["status"] == "skipped" and "not available" in triton["note"]
    big = [bench.Case(8, 8, 8, (1000, 200), torch.float32, "cpu")]
    assert bench._unavailable_reason("loops", big[0], "forward", 361) == "too large for the loop reference"


def test_standard_cases():
    cases = bench.standard_cases(devices=["cpu"])
    assert [c.rule_name for c in cases] == ["8x8->8", "4x4->4", "2x2->2", "3x2->4", "1x1->2"]
    assert all(c.rows == (1000, 200) and c.dtype == torch.float32 for c in cases)
    quick = bench.standard_cases(quick=True, devices=["cpu"], dtypes=[torch.float64])
    assert quick and all(c.n_rows <= 10_000 and c.dtype == torch.float64 for c in quick)


def test_check_passes(capsys):
    assert main(["check", "--device", "cpu", "--implementations", "numba,torch,triton"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert any(line.split()[:3] == ["numba", "cpu", "OK"] for line in lines)
    assert any(line.split()[:3] == ["torch", "cpu", "OK"] for line in lines)
    assert any(line.split()[:2] == ["triton", "cpu"] for line in lines)
    assert any(line.split()[:3] == ["auto", "cpu", "->"] for line in lines)
    assert "3/3" in captured.err  # progress bar


def test_check_fails_on_wrong_values(wrong_numba, capsys):
    assert main(["check", "--device", "cpu", "--implementations", "numba", "-q"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("numba"))
    assert line.split()[:3] == ["numba", "cpu", "FAILED"] and "forward" in line
    assert "1 FAILED" in out


def test_check_fails_on_a_raising_kernel(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("bad build")

    monkeypatch.setattr(numba_cpu, "accumulate_backward", broken)
    (result,) = bench.run_check(["numba"], ["cpu"])
    assert result.status == "FAILED" and "ValueError: bad build" in result.detail


def test_check_fails_on_a_broken_numba_install(monkeypatch, capsys):
    real = backends.is_available
    monkeypatch.setattr(backends, "is_available", lambda name, device: name != "numba" and real(name, device))
    monkeypatch.setitem(sys.modules, "sparse_accumulation.kernels.numba_cpu", None)
    assert main(["check", "--device", "cpu", "--implementations", "numba", "-q"]) == 1
    out = capsys.readouterr().out
    assert "numba" in out and "FAILED" in out and "cannot import the numba kernels" in out


def test_tables_writes_a_loadable_table(tmp_path, capsys):
    path = tmp_path / "real2.npz"
    assert main(["tables", "--lmax", "2", "--output", str(path), "--quiet"]) == 0
    assert str(path) in capsys.readouterr().out
    table = cg.CoefficientTable.load(path, basis="real")
    assert table.lmax == 2
    expected = cg.transformation_rule(2, 1, 2)
    for got, want in zip(table.rule(2, 1, 2), expected):
        assert list(got) == pytest.approx(list(want))


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["bench", "--dtype", "float8"],
    ["bench", "--l", "1", "1", "5"],
    ["bench", "--l", "1", "1", "1", "--lmax", "2"],
    ["bench", "--lmax", "0"],
    ["bench", "--rows", "0", "3"],
    ["bench", "--rows", "3"],
    ["bench", "--implementations", "numba,fastest"],
    ["bench", "--modes", "sideways"],
    ["bench", "--repeats", "0"],
    ["bench", "--repeats", "many"],
    ["check", "--implementations", "index_add"],
    ["check", "--device", "tpu"],
])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparse-accumulation: error: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda(capsys):
    assert main(["bench", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_module_help_in_a_subprocess():
    result = subprocess.run([sys.executable, "-m", "sparse_accumulation", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "bench" in result.stdout and "check" in result.stdout and "tables" in result.stdout


def test_png_writer_draws_bars(tmp_path):
    results = [{"rule": "2x2->2", "device": "cpu", "dtype": "float32", "mode": m, "implementation": i,
                "speedup": s} for m, i, s in [("forward", "numba", 12.5), ("backward", "torch", 0.3)]]
    bench.write_png(tmp_path / "x.png", results)
    width, height = _read_png(tmp_path / "x.png")
    assert width > 500 and height > 50
