"""``sparse-accumulation warmup``: every kernel variant of every compute dtype, and afterwards a new process
compiles nothing."""
import json
import os
import subprocess
import sys

import pytest
import torch

from sparse_accumulation import cli, warmup
from sparse_accumulation.kernels import numba_kernels

# in a child: calls of every kind, then the numba dispatchers of the kernel modules that compiled anything
_CALLS = r"""
import json, sys, torch, numba
import sparse_accumulation as sa
from sparse_accumulation import warmup
from sparse_accumulation import kernels
dtype = getattr(torch, sys.argv[1])
for label, function in warmup.steps([dtype]):
    with torch.enable_grad():
        function()
compiled = []
import importlib, pkgutil
for info in pkgutil.iter_modules(kernels.__path__):
    module = importlib.import_module("sparse_accumulation.kernels." + info.name)
    for name, value in vars(module).items():
        if isinstance(value, numba.core.dispatcher.Dispatcher) and value.stats.cache_misses:
            compiled.append(f"{info.name}.{name}")
for dispatcher in kernels.numba_kernels._variants.values():
    if dispatcher.stats.cache_misses:
        compiled.append(dispatcher.py_func.__name__)
print(json.dumps(compiled))
"""


def test_steps_cover_every_variant_once_per_compute_dtype():
    labels = [label for label, _ in warmup.steps([torch.float16, torch.float32, torch.bfloat16, torch.float64])]
    assert len(labels) == len(set(labels))
    for name in ("float32", "float64"):
        accumulation = [label for label in labels if label.startswith(f"accumulate {name}")]
        assert len(accumulation) == len(numba_kernels.all_variants()) == 4
        assert f"message passing {name}" in labels and f"interaction sums {name}" in labels
    assert not any("float16" in label for label in labels)


def test_unknown_dtype(capsys):
    assert cli.main(["warmup", "--dtypes", "float8"]) == 2
    assert "--dtypes" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown dtype"):
        warmup.warmup(["int32"])


@pytest.mark.slow
def test_after_warmup_a_new_process_compiles_nothing(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "sparse_accumulation", "warmup", "--dtypes", "float16"],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "warm-up" in result.stderr  # the progress bar
    assert "steps in" in result.stdout and str(tmp_path) in result.stdout
    assert any(tmp_path.rglob("*.nbi")), "nothing was written to the cache"
    child = subprocess.run([sys.executable, "-c", _CALLS, "float32"], env=env, capture_output=True, text=True,
                           timeout=900)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout.strip().splitlines()[-1]) == []
