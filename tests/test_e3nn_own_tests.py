"""e3nn's own tensor-product tests, unchanged, on ``sparse_accumulation.e3nn``'s classes.

The test files (``tests/o3/tensor_product_test.py`` and ``tensor_product_sub_test.py``, with e3nn's
``tests/conftest.py``) come from the source distribution of the e3nn installed, downloaded with pip once per
process; a plugin puts this library's ``TensorProduct``, ``FullyConnectedTensorProduct``,
``ElementwiseTensorProduct``, ``FullTensorProduct`` and ``TensorSquare`` into ``e3nn.o3`` before they are collected.
They run in shards, one pytest subprocess each, selected by test-function name with ``-k`` (the slowest functions
on their own, ``test_normalized`` in two halves); the last shard takes every function the others do not name, so
the shards together run all of them. Their torch threads wait passively (``OMP_WAIT_POLICY``), so that shards
running side by side do not slow each other down spinning. Skipped where the distribution cannot be downloaded
(no network)."""
import os
import re
import subprocess
import sys
import tarfile
import textwrap

import pytest

pytestmark = pytest.mark.slow

_FILES = ("tests/conftest.py", "tests/o3/tensor_product_test.py", "tests/o3/tensor_product_sub_test.py")

_PLUGIN = textwrap.dedent("""
    import os
    import sys

    from e3nn import o3

    import sparse_accumulation.e3nn as ours

    for name in ("TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
                 "TensorSquare"):
        setattr(o3, name, getattr(ours, name))


    def pytest_collection_finish(session):
        # what the collected test modules hold: the classes they test
        with open(os.environ["CLASSES_SEEN"], "w") as f:
            for module in ("tensor_product_test", "tensor_product_sub_test"):
                f.write(sys.modules[module].FullyConnectedTensorProduct.__module__ + "\\n")
""")


_NAMED = ("test_normalized", "test_bilinear_right_variance_equivariance", "test_optimizations",
          "test_square_normalization")

# run alone under xdist, each worker gets two items first (a test_normalized half, whose time varies most, and a
# short one), then one more whenever it finishes one
_SHARDS = {
    "normalized-element": "test_normalized and element",
    "square-normalization": "test_square_normalization",
    "normalized-other": "test_normalized and not element",
    "rest": f"not ({' or '.join(_NAMED)})",
    "bilinear": "test_bilinear_right_variance_equivariance",
    "optimizations": "test_optimizations",
}


@pytest.fixture(scope="module")
def e3nn_tests(tmp_path_factory):
    """A folder with e3nn's test files and the plugin, from e3nn's source distribution."""
    e3nn = pytest.importorskip("e3nn")
    root = tmp_path_factory.mktemp("e3nn")
    download = subprocess.run([sys.executable, "-m", "pip", "download", f"e3nn=={e3nn.__version__}", "--no-deps",
                               "--no-binary", ":all:", "-q", "-d", str(root)], capture_output=True, text=True,
                              timeout=600)
    archives = [f for f in os.listdir(root) if f.endswith(".tar.gz")]
    if download.returncode or not archives:
        pytest.skip(f"e3nn's source distribution could not be downloaded: {download.stderr[-300:]}")
    run = root / "run"
    with tarfile.open(root / archives[0]) as archive:
        for member in archive.getmembers():
            relative = member.name.split("/", 1)[-1]
            if relative in _FILES:
                (run / os.path.basename(relative)).parent.mkdir(parents=True, exist_ok=True)
                (run / os.path.basename(relative)).write_bytes(archive.extractfile(member).read())
    assert sorted(os.listdir(run)) == sorted(os.path.basename(f) for f in _FILES)
    (root / "swap_e3nn_classes.py").write_text(_PLUGIN)
    return root


# e3nn's statistical normalization tests (test_normalized: forward passes of 10^4 rows for each of 100 weight draws
# per case; test_square_normalization: 10^6 rows) take most of the time: marked ``statistical`` too, so that a run
# can leave them out
_STATISTICAL = ("normalized-element", "normalized-other", "square-normalization")


@pytest.mark.parametrize("keywords", [pytest.param(keywords, id=name, marks=[pytest.mark.statistical] * (
    name in _STATISTICAL)) for name, keywords in _SHARDS.items()])
def test_e3nns_tensor_product_tests_pass_on_this_librarys_classes(e3nn_tests, keywords, tmp_path):
    """The shard's tests pass, at least one runs, and they test this library's classes."""
    path = os.pathsep.join([str(e3nn_tests)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, CLASSES_SEEN=str(tmp_path / "classes_seen"), PYTHONPATH=path)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "swap_e3nn_classes", "-p", "no:cacheprovider",
                             "-k", keywords, "tensor_product_test.py", "tensor_product_sub_test.py"],
                            cwd=e3nn_tests / "run", env=env, capture_output=True, text=True, timeout=1800)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed[1]) > 0 and "failed" not in summary and "error" not in summary, summary
    assert (tmp_path / "classes_seen").read_text().split() == ["sparse_accumulation.e3nn.sub"] * 2
