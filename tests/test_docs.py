"""The documentation: its Python code blocks run as written, its sample values are right, Sphinx builds with -W."""
import importlib.util
import math
import re
import subprocess
import sys
import textwrap
import types
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
                  "mace.rst", "molecular_dynamics.rst",
                  pytest.param("deploying.rst", marks=pytest.mark.skipif(
                      importlib.util.find_spec("e3nn") is None, reason="the page's examples need e3nn")),
                  pytest.param("hippynn.rst", marks=pytest.mark.skipif(
                      importlib.util.find_spec("hippynn") is None, reason="the page's last example needs hippynn"))]
# MACE's symmetric-contraction module (mace-torch installed with --no-deps), and what MACE's models, data
# pipeline and ASE calculator import besides (the [mace] extra)
MACE_MODULE = ("mace", "e3nn", "opt_einsum_fx")
MACE_PACKAGE = MACE_MODULE + ("ase", "torch_ema", "torchmetrics", "pandas", "matscipy", "h5py", "lmdb", "orjson")
# pages whose later examples need optional packages: without one of them, the page's blocks run up to the first
# that fails to import it, and the test is skipped there; with them installed, every block runs (an ImportError
# then fails the test)
OPTIONAL_PACKAGES = {"mace.rst": MACE_PACKAGE, "molecular_dynamics.rst": MACE_PACKAGE}


def _installed(name: str) -> bool:
    """Whether a top-level package can be imported (MACE's loader leaves a ``mace`` package object without a
    spec in ``sys.modules``, on which ``find_spec`` raises)."""
    if sys.modules.get(name) is not None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:
        return False


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
def test_python_code_blocks_run_as_written(page, capsys, tmp_path, monkeypatch):
    blocks = python_blocks(DOCS / page)
    assert blocks, f"{page} has no python code blocks"
    # the blocks run in a module whose file holds them, each at its place there, so that what reads the source of
    # a definition (TorchScript) finds it
    name = f"docs_{page.split('.')[0]}"
    source = tmp_path / f"{name}.py"
    source.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    module = types.ModuleType(name)
    module.__file__ = str(source)
    monkeypatch.setitem(sys.modules, name, module)
    line = 0
    for number, block in enumerate(blocks, start=1):
        code = compile("\n" * line + block, str(source), "exec")
        line += block.count("\n") + 2
        try:
            exec(code, module.__dict__)  # noqa: S102 - the documentation's own examples
        except ImportError as error:
            missing = [name for name in OPTIONAL_PACKAGES.get(page, ()) if not _installed(name)]
            if not missing:
                raise
            pytest.skip(f"{page} (python block {number}) needs {', '.join(missing)}: {error}")


def test_no_example_hides_an_import_error():
    """A documented example that needs an optional package fails with its ImportError, never skips itself."""
    for page in sorted(DOCS.glob("*.rst")):
        for number, block in enumerate(python_blocks(page), start=1):
            assert not re.search(r"except\b[^:\n]*(ImportError|ModuleNotFoundError)", block), (page.name, number)


def _mace_porting_block() -> str:
    blocks = [b for b in python_blocks(DOCS / "mace.rst") if "from_mace(" in b]
    assert len(blocks) == 1
    return blocks[0]


def test_mace_porting_example_compares_with_maces_module():
    """With mace-torch installed as documented (``--no-deps``, as here and in CI), the porting example builds
    MACE's module and compares with it."""
    missing = [name for name in MACE_MODULE if not _installed(name)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    import torch

    from sparse_accumulation.mace import SymmetricContraction

    namespace = {"torch": torch, "SymmetricContraction": SymmetricContraction}
    exec(compile(_mace_porting_block(), "mace.rst (porting block)", "exec"), namespace)  # noqa: S102
    assert type(namespace["mace_sc"]).__module__ == "mace.modules.symmetric_contraction"
    assert isinstance(namespace["ours"], SymmetricContraction)


def test_mace_porting_example_fails_loudly_without_mace(monkeypatch):
    """Without mace-torch the porting example raises ImportError (it used to skip itself silently)."""
    import torch

    from sparse_accumulation.mace import SymmetricContraction

    for name in [n for n in sys.modules if n == "mace" or n.startswith("mace.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mace", None)  # as if not installed
    namespace = {"torch": torch, "SymmetricContraction": SymmetricContraction}
    with pytest.raises(ImportError, match="mace-torch"):
        exec(compile(_mace_porting_block(), "mace.rst (porting block)", "exec"), namespace)  # noqa: S102


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

    def entry(anchor):  # the text of an object's entry, tags removed
        start = api.index(f'id="{anchor}"')
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", api[start:start + 4000]))

    bases = entry("cg.BASES")
    assert "Built-in immutable sequence" not in bases and "The basis names that every basis= argument" in bases
    assert "Return type: int" in entry("cg.cli.main") and "Exit status" not in entry("cg.cli.main")


def test_readme_set_up_is_two_commands_after_the_cpu_torch_note():
    """The set-up section: a prose note on the CPU build of torch, then exactly the two commands; the main job
    as it is."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    set_up = text.split("## Set up\n", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in set_up.splitlines() if line.startswith("    ")]
    assert commands == ['pip install -e ".[test]"', "python -m pytest"]
    prose = " ".join(line for line in set_up.splitlines() if not line.startswith("    "))
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in prose
    assert prose.index("CPU build") < set_up.index("    pip install -e")
    main_job = text.split("## Main job\n", 1)[1].split("\n## ", 1)[0]
    assert [line.strip() for line in main_job.splitlines() if line.startswith("    ")][0] == \
        "sparse-accumulation bench --quick"


def test_each_page_gives_one_install_recipe_and_the_quickstart_the_readmes():
    """The quickstart installs as the README does (the CPU build of torch first, then the ``test`` extra); the
    MACE page gives its install once."""
    quickstart = (DOCS / "quickstart.rst").read_text(encoding="utf-8")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in quickstart
    assert 'pip install -e ".[test]"' in quickstart
    assert (DOCS / "mace.rst").read_text(encoding="utf-8").count("pip install --no-deps mace-torch") == 1


def test_sub_commands_listed_in_the_docs_are_the_commands_of_the_cli():
    from sparse_accumulation.cli import _build_parser

    choices = next(a.choices for a in _build_parser()._actions if getattr(a, "choices", None))
    text = (DOCS / "benchmarks.rst").read_text(encoding="utf-8")
    numbers = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"has {numbers[len(choices)]} sub-commands" in text
    listed = re.findall(r"^``(\w+)``$", text.split("sub-commands:", 1)[1].split("Exit status", 1)[0], re.M)
    assert sorted(listed) == sorted(choices)


def test_cg_bases_has_its_own_description():
    """``.. autodata:: cg.BASES`` shows the comment above ``BASES`` in ``cg/__init__.py``, not tuple's docstring."""
    analyzer = pytest.importorskip("sphinx.pycode").ModuleAnalyzer.for_module("cg")
    doc = " ".join(analyzer.find_attr_docs()[("", "BASES")])
    assert "basis names" in doc and all(f'``"{name}"``' in doc for name in cg.BASES)
    assert cg.BASES is cg.bases.BASES


def test_readme_example_runs_as_written():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no python example"
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"README.md (python block {number})", "exec"), {"__name__": "readme"})  # noqa: S102


def test_the_package_map_names_files_that_exist():
    """Every file and folder the map of docs/package.rst names (in its first column, under the folder the
    indentation puts it in, and in the descriptions) exists in the package: a module that moves fails this."""
    text = (DOCS / "package.rst").read_text(encoding="utf-8")
    block = text.split("   sparse_accumulation/\n", 1)[1].split("\n\n", 1)[0]
    package = ROOT / "sparse_accumulation"
    everything = {p.relative_to(package).as_posix() for p in package.rglob("*") if "__pycache__" not in p.parts}
    folders, named = {}, 0
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        # a line indented as far as the descriptions continues the description above it
        first, _, description = ("", "", line) if indent > 12 else line.strip().partition("  ")
        parent = next((folders[i] for i in sorted(folders, reverse=True) if i < indent), "")
        for name in re.split(r"[ ,]+", first.strip()):
            if not name or "<" in name or not re.fullmatch(r"[\w/.]+", name):
                continue
            path = (parent + name).rstrip("/")
            assert path in everything, f"{name!r} (as {path}) is on the map of docs/package.rst but not in the package"
            named += 1
            if name.endswith("/") and " " not in first.strip():
                folders = {i: f for i, f in folders.items() if i < indent}
                folders[indent] = parent + name
        for mentioned in re.findall(r"\b[\w/]+\.py\b", description):
            assert any(p == mentioned or p.endswith("/" + mentioned) for p in everything), \
                f"{mentioned} is named on the map of docs/package.rst but not in the package"
    assert named > 30
