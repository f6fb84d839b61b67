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
