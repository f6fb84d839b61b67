"""NequIP models with ``enable_SparseAccumulation`` (``sparse_accumulation.nequip``) and Allegro models with
``enable_SparseAccumulationContracter`` (``sparse_accumulation.allegro``): the checks of ``tests/nequip_suite/``
in a child pytest with NequIP's own fixtures (they change process-wide state: default
dtype, seeds, e3nn's and dynamo's settings), which never load into this suite's processes. The slow selection runs
NequIP's model tests on one configuration in float64 and the modifiers' checks (Allegro's without its AOTInductor
export); ``-m long`` runs every configuration (NequIP's and Allegro's) and dtype, and that export."""
import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

# looked up, not imported: importing NequIP loads lightning and registers its extensions in this process
pytestmark = pytest.mark.skipif(importlib.util.find_spec("nequip") is None, reason="needs nequip")

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nequip_suite")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child_pytest(tmp_path, files, select=None):
    report = tmp_path / "report.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_ADDOPTS", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", SUITE,
               "--confcutdir", SUITE,
               "-o", "python_files=run_*.py", f"--junitxml={report}", *[os.path.join(SUITE, f) for f in files]]
    if select:
        command += ["-k", select]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("failures")) == int(suite.get("errors")) == 0, tail
    assert int(suite.get("tests")) - int(suite.get("skipped")) > 0, tail


@pytest.mark.slow
def test_the_modifier_against_unmodified_nequip_models(tmp_path):
    _child_pytest(tmp_path, ["run_modifier_checks.py"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("allegro") is None, reason="needs nequip-allegro")
def test_the_allegro_modifier_against_unmodified_allegro_models(tmp_path):
    """Its AOTInductor export (a minute of C++ compiling, the same export path as NequIP's checked above) is left to
    ``-m long``."""
    _child_pytest(tmp_path, ["run_allegro_checks.py"], "not aotinductor")


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.skipif(importlib.util.find_spec("allegro") is None, reason="needs nequip-allegro")
def test_an_allegro_model_with_the_modifier_exports_with_aotinductor(tmp_path):
    _child_pytest(tmp_path, ["run_allegro_checks.py"], "aotinductor")


@pytest.mark.slow
def test_nequips_own_model_tests_on_one_configuration(tmp_path):
    _child_pytest(tmp_path, ["run_nequips_model_tests.py"],
                  "TestNequIPOnSparseAccumulation and 16 and features and 3 and layers and float64")


@pytest.mark.slow
@pytest.mark.long
def test_nequips_own_model_tests_on_every_configuration(tmp_path):
    _child_pytest(tmp_path, ["run_nequips_model_tests.py"])


@pytest.mark.slow
@pytest.mark.long
def test_nequips_train_time_compile_of_a_modified_model(tmp_path):
    _child_pytest(tmp_path, ["run_compile_checks.py"])
