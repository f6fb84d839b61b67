"""The ``sparse-accumulation`` command line (bench, check, tables), called in-process on tiny sizes."""
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cg
from sparse_accumulation import backends, bench
from sparse_accumulation.bench import runner
from sparse_accumulation.bench.report import PLOT_HINT
from sparse_accumulation.cli import main
from sparse_accumulation.kernels.numba import accumulate as numba_accumulate

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--rows", "3", "5", "--repeats", "1", "--warmup", "0", "--quiet", "--device", "cpu"]


class Terminal(io.StringIO):
    """A text stream that says it is a terminal, as stderr is when a person runs the command."""

    def isatty(self):
        return True


def _table(text):
    """The bench table as a list of dicts keyed by the header (status keeps its spaces)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("------"))
    head = [cell.strip() for cell in _cells(lines[start - 1], lines[start])]
    rows = []
    for line in lines[start + 1:]:
        if not line[:1].isdigit():
            break
        rows.append(dict(zip(head, (cell.strip() for cell in _cells(line, lines[start])))))
    return rows


def _cells(line, rule):
    """Split ``line`` at the column boundaries of the ``----  ---`` rule line (the last cell runs to the end)."""
    bounds, position = [], 0
    for dashes in rule.split("  "):
        bounds.append(position)
        position += len(dashes) + 2
    return [line[a:b] for a, b in zip(bounds, bounds[1:] + [None])]


def _png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture
def wrong_numba(monkeypatch):
    """Make the numba forward kernel return slightly wrong values."""
    original = numba_accumulate.accumulate

    def wrong(*args, **kwargs):
        out = original(*args, **kwargs)
        out.view(-1)[0] += 1.0
        return out

    monkeypatch.setattr(numba_accumulate, "accumulate", wrong)


@pytest.mark.slow
def test_bench_quick_writes_table_json_and_charts(tmp_path, capsys):
    code = main(["bench", "--quick", "--l", "2", "1", "2", "--l", "1", "1", "1", "--output", str(tmp_path),
                 "--implementations", "numba,torch,dense,sparse,loops,elementwise", "--grad-c", *TINY])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    rows = _table(captured.out)
    implementations = ["index_add", "numba", "torch", "dense", "sparse", "loops", "elementwise"]
    assert len(rows) == 2 * 2 * len(implementations)  # rules x modes x implementations
    assert [r["implementation"] for r in rows[:len(implementations)]] == implementations
    # --quick: the timings without compilation
    assert {"kernel ms", "call ms", "host us"} <= set(rows[0]) and "compiled ms" not in rows[0]
    assert all(r["status"].startswith("ok") for r in rows)
    assert all(r["vs index_add"] == "1.00x" for r in rows if r["implementation"] == "index_add")
    assert all((r["range"] == "-") == (r["vs index_add"] == "-") for r in rows)
    assert all(r["vs index_add"] == "-" and r["max rel err"] == "-" for r in rows
               if r["implementation"] == "elementwise")
    assert "all results checked" in captured.out

    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["command"].startswith("sparse-accumulation bench --quick")
    assert saved["environment"]["torch"] == torch.__version__
    results = saved["results"]
    assert len(results) == len(rows)
    for r in results:
        assert r["status"] == "ok" and set(r["timings"]) == {"kernel", "call", "host"}
        assert all(t["status"] == "ok" and t["median"] > 0 for t in r["timings"].values())
        assert r["primary"] == "kernel" and r["median_ms"] == r["timings"]["kernel"]["median"]
        assert r["floor_ms"] == pytest.approx(r["floor_bytes"] / (r["copy_GBps"] * 1e9) * 1e3)
        if r["speedup"] is not None:  # its range over the repeats holds the median speed-up
            assert r["speedup_range"][0] <= r["speedup"] <= r["speedup_range"][1]
        if r["implementation"] != "elementwise":
            assert r["error"] < 1e-4
            assert r["GBps"] == pytest.approx(r["floor_bytes"] / r["median_ms"] / 1e6)
    # floor bytes: X1, X2 read and the output written, plus the rule
    forward = next(r for r in results if r["rule"] == "2x1->2" and r["mode"] == "forward")
    assert forward["floor_bytes"] == 15 * (5 + 3 + 5) * 4 + forward["nnz"] * (4 + 24)
    width, height = _png_size(tmp_path / "bench.png")
    assert width > 400 and height > 300
    svg = (tmp_path / "bench.svg").read_text()
    assert "numba" in svg and "floor: bytes / copy bandwidth" in svg and "forward + backward" in svg
    for name in ("bench.json", "bench.png", "bench.svg"):
        assert f"wrote {tmp_path / name}" in captured.out


def test_bench_without_matplotlib_writes_json_and_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code = main(["bench", "--l", "1", "1", "1", "--implementations", "numba", "--modes", "fwd",
                 "--timings", "kernel", "--output", str(tmp_path), *TINY])
    out = capsys.readouterr().out
    assert code == 0
    assert (tmp_path / "bench.json").is_file() and not (tmp_path / "bench.png").exists()
    assert [line for line in out.splitlines() if "matplotlib" in line and "wrote" not in line] == [PLOT_HINT]


def test_bench_refuses_a_wrong_implementation(wrong_numba, tmp_path, capsys):
    code = main(["bench", "--l", "2", "2", "2", "--implementations", "numba", "--modes", "forward", *TINY,
                 "--timings", "kernel,call", "--output", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 1
    rows = {r["implementation"]: r for r in _table(captured.out)}
    assert rows["index_add"]["status"] == "ok"
    numba_row = rows["numba"]
    assert numba_row["status"].startswith("FAILED") and "wrong out" in numba_row["status"]
    assert numba_row["kernel ms"] == "-" and numba_row["vs index_add"] == "-"  # not timed
    assert "1 FAILED" in captured.out
    saved = json.loads((tmp_path / "bench.json").read_text())["results"]
    failed = [r for r in saved if r["status"] == "FAILED"]
    assert [r["implementation"] for r in failed] == ["numba"]
    assert failed[0]["median_ms"] is None and failed[0]["timings"] == {}


def test_bench_reports_a_failing_timing_without_failing_the_run(monkeypatch, capsys):
    def no_compiler(forward, timing):
        raise RuntimeError("compiler exploded\nsecond line")

    monkeypatch.setattr(runner, "compile_forward", no_compiler)
    code = main(["bench", "--l", "1", "1", "2", "--implementations", "numba", "--modes", "backward",
                 "--timings", "kernel,compiled,host", *TINY])
    out = capsys.readouterr().out
    assert code == 0, out
    numba_row = next(r for r in _table(out) if r["implementation"] == "numba")
    assert numba_row["compiled ms"] == "FAILED" and numba_row["kernel ms"] not in ("-", "FAILED")
    assert numba_row["status"] == "ok (compiled FAILED: RuntimeError: compiler exploded)"
    assert "all results checked; 2 timing(s) FAILED to run" in out  # numba and index_add


def test_bench_fails_on_a_wrong_compiled_result(monkeypatch, capsys):
    def miscompiled(forward, timing):
        return (lambda X1, X2, C: forward(X1, X2, C) * 1.001), None

    monkeypatch.setattr(runner, "compile_forward", miscompiled)
    code = main(["bench", "--l", "2", "1", "1", "--implementations", "numba", "--modes", "forward",
                 "--timings", "kernel,compiled", *TINY])
    out = capsys.readouterr().out
    assert code == 1
    numba_row = next(r for r in _table(out) if r["implementation"] == "numba")
    assert numba_row["status"].startswith("FAILED (compiled: wrong out")
    assert numba_row["compiled ms"] == "FAILED"


@pytest.mark.slow
def test_bench_compiled_timing_checks_and_times_the_compiled_step(capsys):
    code = main(["bench", "--l", "1", "1", "2", "--implementations", "numba", "--modes", "fwd+bwd",
                 "--timings", "compiled", "--grad-c", *TINY])
    out = capsys.readouterr().out
    assert code == 0, out
    numba_row = next(r for r in _table(out) if r["implementation"] == "numba")
    assert numba_row["status"] == "ok" and float(numba_row["compiled ms"]) > 0
    assert float(numba_row["max rel err"]) < 1e-5


def test_bench_progress_bar_only_on_a_terminal(monkeypatch, capsys):
    argv = ["bench", "--l", "1", "1", "1", "--implementations", "numba", "--modes", "fwd", "--timings",
            "kernel", "--rows", "2", "2", "--repeats", "1", "--device", "cpu"]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal here
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    assert "2/2" in terminal.getvalue()  # numba and the index_add baseline
    terminal.truncate(0)
    assert main(argv + ["-q"]) == 0
    assert terminal.getvalue() == ""


def test_check_passes(capsys, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["check", "--device", "cpu", "--implementations", "numba,torch,triton"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:3] == ["numba", "cpu", "OK"] for line in lines)
    assert any(line.split()[:3] == ["torch", "cpu", "OK"] for line in lines)
    assert any(line.split()[:2] == ["triton", "cpu"] for line in lines)
    assert any(line.split()[:3] == ["auto", "cpu", "->"] for line in lines)
    assert "3/3" in terminal.getvalue()  # progress bar


def test_check_fails_on_wrong_values(wrong_numba, capsys):
    assert main(["check", "--device", "cpu", "--implementations", "numba", "-q"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("numba"))
    assert line.split()[:3] == ["numba", "cpu", "FAILED"] and "forward" in line
    assert "1 FAILED" in out


def test_check_fails_on_a_raising_kernel(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("bad build")

    monkeypatch.setattr(numba_accumulate, "accumulate_backward", broken)
    (result,) = bench.run_check(["numba"], ["cpu"])
    assert result.status == "FAILED" and "ValueError: bad build" in result.detail


def test_check_fails_on_a_broken_numba_install(monkeypatch, capsys):
    real = backends.is_available
    monkeypatch.setattr(backends, "is_available", lambda name, device: name != "numba" and real(name, device))
    monkeypatch.setitem(sys.modules, "sparse_accumulation.kernels.numba.accumulate", None)
    assert main(["check", "--device", "cpu", "--implementations", "numba", "-q"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "cannot import the numba kernels (sparse_accumulation.kernels.numba.accumulate): " \
        "ModuleNotFoundError" in out


def test_check_reports_an_importable_backend_that_calls_itself_unavailable(monkeypatch, capsys):
    real = backends.is_available
    monkeypatch.setattr(backends, "is_available", lambda name, device: name != "numba" and real(name, device))
    assert main(["check", "--device", "cpu", "--implementations", "numba", "-q"]) == 1
    assert "numba reports itself unavailable on cpu" in capsys.readouterr().out


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
    ["bench", "--timings", "kernel,eventually"],
    ["bench", "--timings", ","],
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


@pytest.mark.slow
def test_module_help_in_a_subprocess():
    result = subprocess.run([sys.executable, "-m", "sparse_accumulation", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "bench" in result.stdout and "check" in result.stdout and "tables" in result.stdout


def test_tables_usage_and_errors_name_sparse_accumulation(capsys):
    """``sparse-accumulation tables`` runs ``cg``'s command line under its own name."""
    assert main(["tables", "--help"]) == 0
    usage = " ".join(capsys.readouterr().out.split("\n\n", 1)[0].split())
    assert usage.startswith("usage: sparse-accumulation tables [-h] --lmax LMAX"), usage
    assert main(["tables", "--lmax", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sparse-accumulation: error: ") and "required" in err[0]


@pytest.mark.parametrize("command,usage", [
    (["-m", "sparse_accumulation", "tables", "--help"], "usage: sparse-accumulation tables "),
    (["-m", "cg", "tables", "--help"], "usage: python -m cg tables "),
])
def test_tables_help_of_both_entry_points_in_a_subprocess(command, usage):
    result = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(usage), result.stdout.splitlines()[:1]
