"""The ``python -m cg`` command line, called in-process."""
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cg
from cg.cli import main


class Terminal(io.StringIO):
    """A text stream that says it is a terminal, as stderr is when a person runs the command."""

    def isatty(self):
        return True


def test_tables_writes_loadable_file(tmp_path, capsys, monkeypatch):
    out = tmp_path / "real3.npz"
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["tables", "--lmax", "3", "--basis", "complex", "--output", str(out)]) == 0
    assert "34/34" in terminal.getvalue()  # a progress bar on a terminal
    assert str(out) in capsys.readouterr().out
    table = cg.CoefficientTable.load(out, basis="complex")
    assert table.lmax == 3 and len(table) == 34
    np.testing.assert_array_equal(table.rule(2, 1, 2)[3], cg.transformation_rule(2, 1, 2, basis="complex")[3])


def test_tables_quiet(tmp_path, capsys, monkeypatch):
    assert main(["tables", "--lmax", "1", "--output", str(tmp_path / "x.npz")]) == 0
    assert capsys.readouterr().err == ""  # no bar when stderr is not a terminal
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["tables", "--lmax", "1", "--output", str(tmp_path / "x.npz"), "--quiet"]) == 0
    assert terminal.getvalue() == ""


def test_show_prints_sample_rows(capsys):
    assert main(["show", "2", "1", "2", "--basis", "real"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = [l for l in lines if not l.startswith("#")][0].split()
    assert header == ["m1", "m2", "mu", "i1", "i2", "imu", "C"]
    rows = [l.split() for l in lines if not l.startswith("#")][1:]
    assert len(rows) == len(cg.transformation_rule(2, 1, 2)[3])
    table = {(int(r[0]), int(r[1]), int(r[2])): (int(r[3]), int(r[4]), int(r[5]), float(r[6])) for r in rows}
    for (m1, m2, mu), value in [((-2, -1, -1), -0.408248), ((-2, 0, 2), -0.816497), ((-1, 1, 0), 0.707107)]:
        i1, i2, imu, c = table[(m1, m2, mu)]
        assert (i1, i2, imu) == (m1 + 2, m2 + 1, mu + 2)
        assert c == pytest.approx(value, abs=1e-6)
    # the columns are aligned: every row has the same width as the header
    widths = {len(l) for l in lines if not l.startswith("#")}
    assert len(widths) == 1


def test_show_exact(capsys):
    assert main(["show", "1", "1", "0", "--exact"]) == 0
    out = capsys.readouterr().out
    assert out.count("-sqrt(3)/3") == 3


@pytest.mark.parametrize(
    "argv,match",
    [
        (["show", "1", "1", "5"], "L=5 is outside"),
        (["show", "-1", "1", "1"], "l1 must be a non-negative integer"),
        (["show", "1", "1"], "required"),
        (["show", "1", "x", "1"], "invalid int value"),
        (["show", "1", "1", "1", "--basis", "polar"], "invalid choice"),
        (["tables", "--lmax", "-2", "--output", "x.npz"], "lmax must be a non-negative integer"),
        (["tables", "--lmax", "2"], "required"),
        (["frobnicate"], "invalid choice"),
        ([], "a command is required"),
    ],
)
def test_bad_arguments_exit_2_one_line(argv, match, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and lines[0].startswith("python -m cg: error:")
    assert "Traceback" not in captured.err


def test_unwritable_output_exit_2(tmp_path, capsys):
    assert main(["tables", "--lmax", "1", "-q", "--output", str(tmp_path / "no" / "such" / "dir.npz")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "tables" in capsys.readouterr().out


def _usage_line(text: str) -> str:
    return " ".join(text.split("\n\n", 1)[0].split())  # argparse wraps a long usage line


@pytest.mark.parametrize("prog", [None, "sparse-accumulation"])
def test_usage_and_errors_name_the_calling_program(prog, capsys):
    """``python -m cg`` by default; ``sparse-accumulation tables`` passes its own name through."""
    kwargs = {} if prog is None else {"prog": prog}
    name = prog or "python -m cg"
    assert main(["tables", "--help"], **kwargs) == 0
    assert _usage_line(capsys.readouterr().out).startswith(f"usage: {name} tables [-h] --lmax LMAX")
    assert main(["--help"], **kwargs) == 0
    assert _usage_line(capsys.readouterr().out).startswith(f"usage: {name} [-h]")
    assert main(["tables", "--lmax", "2"], **kwargs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{name}: error: ") and "required" in err[0]


def test_module_tables_help_in_a_subprocess():
    root = str(Path(cg.__file__).resolve().parents[1])
    res = subprocess.run([sys.executable, "-m", "cg", "tables", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=root)
    assert res.returncode == 0, res.stderr
    assert _usage_line(res.stdout).startswith("usage: python -m cg tables [-h] --lmax LMAX")


def test_main_documents_its_exit_status_as_the_return_value():
    """Napoleon reads ``Returns: Word: text`` as a return type named ``Word``; the docstring of ``main`` says
    what it returns without that, so the API reference shows ``Return type: int`` (the annotation)."""
    napoleon = pytest.importorskip("sphinx.ext.napoleon")
    import inspect

    import cg.cli

    rendered = str(napoleon.GoogleDocstring(inspect.getdoc(cg.cli.main), napoleon.Config(napoleon_use_rtype=True)))
    assert ":rtype:" not in rendered and ":returns: The exit status, 0 on success" in rendered


def test_module_entry_point_and_no_torch(tmp_path):
    code = (
        "import sys, runpy\n"
        "import cg\n"
        "cg.clebsch_gordan(2, 2, 2, basis='e3nn', exact=True)\n"
        "cg.load_precomputed('e3nn', 2)\n"
        "sys.argv = ['cg', 'show', '1', '1', '1']\n"
        "try:\n"
        "    runpy.run_module('cg', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules and 'e3nn' not in sys.modules, 'cg imported torch/e3nn'\n"
    )
    root = str(Path(cg.__file__).resolve().parents[1])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert res.returncode == 0, res.stderr
    assert "0.707106781187" in res.stdout
    res = subprocess.run(
        [sys.executable, "-m", "cg", "show", "1", "1", "9"], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_sources_do_not_import_torch():
    from pathlib import Path

    for path in Path(cg.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "import torch" not in text and "import e3nn" not in text, path
