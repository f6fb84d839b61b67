"""The documentation: its Python code blocks run as written, its sample values are right, Sphinx builds with -W."""
import importlib.util
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cg

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# implementations.rst compiles a function with torch.compile (tens of seconds on a small CPU machine)
EXECUTED_PAGES = ["quickstart.rst", "tutorial.rst", pytest.param("implementations.rst", marks=pytest.mark.slow),
                  "benchmarks.rst",
                  pytest.param("coming_from_e3nn.rst", marks=pytest.mark.skipif(
                      importlib.util.find_spec("e3nn") is None, reason="the page's examples need e3nn")),
                  pytest.param("message_passing.rst", marks=pytest.mark.skipif(
                      importlib.util.find_spec("e3nn") is None, reason="the page's examples need e3nn")),
                  "mace.rst",
                  pytest.param("hippynn.rst", marks=pytest.mark.skipif(
                      importlib.util.find_spec("hippynn") is None, reason="the page's last example needs hippynn"))]


def python_blocks(path: Path) -> list:
    """The bodies of the ``.. code-block:: python`` directives of an rst file, dedented, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() != ".. code-block:: python":
            i += 1
            continue
        i += 1
        while i < len(lines) and re.match(r"^\s+:\w[\w-]*:", lines[i]):  # directive options
            i += 1
        body = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
            body.append(lines[i])
            i += 1
        blocks.append(textwrap.dedent("\n".join(body)).strip("\n"))
    return blocks


@pytest.mark.parametrize("page", EXECUTED_PAGES)
def test_python_code_blocks_run_as_written(page, capsys):
    blocks = python_blocks(DOCS / page)
    assert blocks, f"{page} has no python code blocks"
    namespace = {"__name__": f"docs_{page.split('.')[0]}"}
    for number, block in enumerate(blocks, start=1):
        code = compile(block, f"{page} (python block {number})", "exec")
        exec(code, namespace)  # noqa: S102 - the documentation's own examples


def _sample_rows():
    text = (DOCS / "conventions.rst").read_text(encoding="utf-8")
    table = text.split(".. csv-table::", 1)[1]
    rows = []
    for line in table.splitlines()[3:]:
        if not line.strip():
            if rows:
                break
            continue
        cells = [c.strip().strip('"') for c in line.split(",")]
        rows.append((cells[0], *map(int, cells[1:7]), float(cells[7]), cells[8]))
    return rows


def _exact_value(text: str) -> float:
    match = re.fullmatch(r"(-?)√(\d+)/(\d+)", text)
    assert match, text
    sign, root, denominator = match.groups()
    return (-1 if sign else 1) * math.sqrt(int(root)) / int(denominator)


def test_conventions_sample_values_match_the_cg_package():
    rows = _sample_rows()
    assert len(rows) >= 15 and {r[0] for r in rows} == {"complex", "real", "e3nn"}
    for basis, l1, l2, L, m1, m2, M, value, exact in rows:
        dense = cg.clebsch_gordan(l1, l2, L, basis=basis)
        assert dense[m1 + l1, m2 + l2, M + L] == pytest.approx(value, abs=1e-6), (basis, l1, l2, L, m1, m2, M)
        assert _exact_value(exact) == pytest.approx(value, abs=1e-6)
        rule = cg.transformation_rule(l1, l2, L, basis=basis)
        assert (m1 + l1, m2 + l2, M + L) in set(zip(*(a.tolist() for a in rule[:3])))


def test_conventions_e3nn_rows_match_e3nn():
    o3 = pytest.importorskip("e3nn.o3")
    torch = pytest.importorskip("torch")
    for basis, l1, l2, L, m1, m2, M, value, _ in _sample_rows():
        if basis == "e3nn":
            w3j = o3.wigner_3j(l1, l2, L, dtype=torch.float64).numpy() * np.sqrt(2 * L + 1)
            assert w3j[m1 + l1, m2 + l2, M + L] == pytest.approx(value, abs=1e-6)


@pytest.mark.slow
def test_sphinx_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(tmp_path / "doctrees"),
         str(DOCS), str(tmp_path / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for page in ["index", "quickstart", "tutorial", "conventions", "implementations", "coming_from_e3nn",
                 "benchmarks", "api"]:
        assert (tmp_path / "html" / f"{page}.html").is_file()
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    for name in ["sparse_accumulation.accumulate", "CGCalculatorSingle", "cg.clebsch_gordan", "run_benchmark",
                 "sparse_accumulation.e3nn.TensorProduct"]:
        assert name in api


def test_readme_example_runs_as_written():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no python example"
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"README.md (python block {number})", "exec"), {"__name__": "readme"})  # noqa: S102
