"""Choosing implementations: explicit names, the process default, the environment variable, auto fallback."""
import os
import subprocess
import sys

import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation import backends
from accumulation_helpers import assert_close_to, oracle, random_rule


def test_auto_picks_numba_on_cpu():
    assert backends.resolve(None, "cpu") == "numba"
    assert backends.resolve("auto", torch.device("cpu")) == "numba"


def test_set_default_implementation(generator, monkeypatch):
    calls = []
    original = sa.reference.index_add
    monkeypatch.setitem(sa.reference.BY_NAME, "index_add",
                        lambda *args: calls.append(1) or original(*args))
    m1, m2, mu, C = random_rule(generator, 3, 3, 3, nnz=6)
    X = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    try:
        sa.set_default_implementation("index_add")
        assert sa.get_default_implementation() == "index_add"
        out = sa.accumulate(X, X, mu, 3, m1, m2, C)
        assert calls == [1]
        assert_close_to(out, oracle(X, X, mu, 3, m1, m2, C), torch.float64)
        sa.accumulate(X, X, mu, 3, m1, m2, C, implementation="numba")
        assert calls == [1], "an explicit implementation overrides the default"
    finally:
        sa.set_default_implementation(None)
    assert sa.get_default_implementation() == "auto"
    with pytest.raises(ValueError, match="implementation must be one of"):
        sa.set_default_implementation("fast")


def _python(code, **env):
    environment = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120)


@pytest.mark.slow
def test_environment_variable_sets_default():
    result = _python("import sparse_accumulation as sa; print(sa.get_default_implementation())",
                     SPARSE_ACCUMULATION_IMPLEMENTATION="torch")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torch"
    result = _python("import sparse_accumulation", SPARSE_ACCUMULATION_IMPLEMENTATION="nonsense")
    assert result.returncode != 0 and "SPARSE_ACCUMULATION_IMPLEMENTATION" in result.stderr


@pytest.mark.slow
def test_auto_falls_back_with_one_warning_when_numba_is_missing():
    code = (
        "import sys, warnings\n"
        "sys.modules['numba'] = None\n"  # makes 'import numba' fail
        "import torch, sparse_accumulation as sa\n"
        "X = torch.randn(5, 3, dtype=torch.float64)\n"
        "i = torch.tensor([0, 1, 2])\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    a = sa.accumulate(X, X, i, 3, i, i, torch.ones(3, dtype=torch.float64))\n"
        "    b = sa.accumulate(X, X, i, 3, i, i, torch.ones(3, dtype=torch.float64))\n"
        "print(len([w for w in caught if 'falling back' in str(w.message)]))\n"
        "print(torch.allclose(a, X * X))\n"
        "try:\n"
        "    sa.accumulate(X, X, i, 3, i, i, torch.ones(3, dtype=torch.float64), implementation='numba')\n"
        "except RuntimeError as e:\n"
        "    print('raised', 'numba' in str(e))\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "True", "raised", "True"]


def test_kernel_module_finds_each_operations_kernels_and_refuses_what_it_lacks():
    for operation, kernels in backends.KERNELS_OF.items():
        assert backends.kernel_module(operation, kernels[0]).__name__ == \
            f"sparse_accumulation.kernels.{kernels[0]}.{operation}"
    # a backend without kernels of its own for an operation runs the portable ones where the operation has them
    assert backends.kernel_module("activations", "numba") is backends.kernel_module("activations", "torch")
    assert backends.kernel_module("graph", "loops") is backends.kernel_module("graph", "torch")
    for operation, implementation in (("uvw", "numba"), ("uvw", "torch"), ("accumulate", "loops"),
                                      ("graph", "fast")):
        with pytest.raises(ValueError, match=f"no {operation} kernels for implementation '{implementation}'"):
            backends.kernel_module(operation, implementation)
    with pytest.raises(ValueError, match="operation must be one of"):
        backends.kernel_module("convolution", "numba")


def test_integrations_reach_kernels_only_through_the_lookup():
    """e3nn/, mace/, hippynn/, nequip/, allegro/, bench/, export.py and warmup.py import no backend folder
    (kernels/numba, triton, torch): they go through the ops or backends.kernel_module."""
    import ast
    import pathlib

    package = pathlib.Path(sa.__file__).parent
    folders = ("e3nn", "mace", "hippynn", "nequip", "allegro", "bench")
    files = [p for folder in folders for p in (package / folder).glob("*.py")]
    files += [package / "export.py", package / "warmup.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if "kernels" in parts and parts[parts.index("kernels") + 1:parts.index("kernels") + 2] in (
                        ["numba"], ["triton"], ["torch"]):
                    raise AssertionError(f"{path.relative_to(package)} imports {name}, a backend folder")
