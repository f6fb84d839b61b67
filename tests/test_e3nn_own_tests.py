"""e3nn's own tensor-product tests, unchanged, on ``sparse_accumulation.e3nn``'s classes.

The test files (``tests/o3/tensor_product_test.py`` and ``tensor_product_sub_test.py``, with e3nn's
``tests/conftest.py``) come from the source distribution of the e3nn installed, downloaded with pip; a plugin
puts this library's ``TensorProduct``, ``FullyConnectedTensorProduct``, ``ElementwiseTensorProduct``,
``FullTensorProduct`` and ``TensorSquare`` into ``e3nn.o3`` before they are collected. Skipped where the
distribution cannot be downloaded (no network)."""
import os
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


def test_e3nns_tensor_product_tests_pass_on_this_librarys_classes(tmp_path):
    e3nn = pytest.importorskip("e3nn")
    download = subprocess.run([sys.executable, "-m", "pip", "download", f"e3nn=={e3nn.__version__}", "--no-deps",
                               "--no-binary", ":all:", "-q", "-d", str(tmp_path)], capture_output=True, text=True,
                              timeout=600)
    archives = [f for f in os.listdir(tmp_path) if f.endswith(".tar.gz")]
    if download.returncode or not archives:
        pytest.skip(f"e3nn's source distribution could not be downloaded: {download.stderr[-300:]}")
    run = tmp_path / "run"
    with tarfile.open(tmp_path / archives[0]) as archive:
        for member in archive.getmembers():
            relative = member.name.split("/", 1)[-1]
            if relative in _FILES:
                (run / os.path.basename(relative)).parent.mkdir(parents=True, exist_ok=True)
                (run / os.path.basename(relative)).write_bytes(archive.extractfile(member).read())
    assert sorted(os.listdir(run)) == sorted(os.path.basename(f) for f in _FILES)
    (tmp_path / "swap_e3nn_classes.py").write_text(_PLUGIN)
    path = os.pathsep.join([str(tmp_path)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, CLASSES_SEEN=str(tmp_path / "classes_seen"), PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "swap_e3nn_classes", "-p", "no:cacheprovider",
                             "tensor_product_test.py", "tensor_product_sub_test.py"], cwd=run, env=env,
                            capture_output=True, text=True, timeout=1800)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert (tmp_path / "classes_seen").read_text().split() == ["sparse_accumulation.e3nn.sub"] * 2
