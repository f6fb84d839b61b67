"""MACE's own tests on converted models: the test files mace-torch 0.3.16 installs beside its package
(``site-packages/tests``) run in a child pytest in which every model MACE's constructors build is converted by
:func:`sparse_accumulation.mace.accelerate` as the constructor returns (``mace_suite/sitecustomize.py``, in the
child and in the processes it starts: MACE's calculator tests train models with its ``run_train.py``). Each file
must pass, with models converted; the tests that download foundation models are left out (no network)."""
import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

pytest.importorskip("mace.calculators")
pytest.importorskip("e3nn")

HERE = os.path.dirname(os.path.abspath(__file__))
#: MACE's test file -> the tests left out (they download MACE-MP / MACE-OFF foundation models); the files that
#: take a minute or more (test_models scripts models, the calculator's trains them with run_train.py, test_compile
#: compiles them) are marked ``long``, left out of CI's slow selection: ``python -m pytest -m long`` runs them
FILES = {
    "test_models.py": (),
    "test_lora.py": (),
    "test_calculator.py": ("test_mace_mp", "test_mace_off", "test_mace_mp_stresses", "test_mace_mp_energies"),
    "test_compile.py": (),
}
LONG = ("test_models.py", "test_calculator.py", "test_compile.py")


def _maces_tests() -> str:
    spec = importlib.util.find_spec("mace")
    folder = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "tests")
    if not os.path.isfile(os.path.join(folder, "test_models.py")):
        pytest.skip(f"MACE's test files are not installed beside its package ({folder})")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.long) if name in LONG else name
                                  for name in FILES])
def test_maces_own_test_file_passes_with_every_model_converted(name, tmp_path):
    for package in ("prettytable", "configargparse", "git", "hostlist", "yaml"):  # what run_train.py imports
        pytest.importorskip(package)
    folder = _maces_tests()
    log, report = tmp_path / "converted.txt", tmp_path / "report.xml"
    env = dict(os.environ, SPARSE_ACCUMULATION_CONVERT_MACE="1", SPARSE_ACCUMULATION_CONVERT_MACE_LOG=str(log),
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(HERE, "mace_suite"), os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_ADDOPTS", None)
    left_out = FILES[name]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", folder,
               os.path.join(folder, name), f"--junitxml={report}"]
    if left_out:
        command += ["-k", "not (" + " or ".join(left_out) + ")"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
    assert int(suite.get("failures")) == int(suite.get("errors")) == 0, tail
    assert tests - skipped > 0, tail
    converted = log.read_text().split() if log.exists() else []
    assert converted, f"no model was converted while MACE's {name} ran"
