"""``sparse-accumulation warmup``: every kernel variant of every compute dtype, and afterwards a new process
compiles nothing."""
import json
import os
import subprocess
import sys

import pytest
import torch

from sparse_accumulation import cli, warmup
from sparse_accumulation.kernels.numba import accumulate_kernel

# in a child: calls of every kind, then the numba dispatchers of the kernel modules that compiled anything
_CALLS = r"""
import json, sys, torch, numba
import sparse_accumulation as sa
from sparse_accumulation import warmup
from sparse_accumulation import kernels
import sparse_accumulation.kernels.numba
dtype = getattr(torch, sys.argv[1])
for label, function in warmup.steps([dtype]):
    with torch.enable_grad():
        function()
compiled = []
import importlib, pkgutil
from sparse_accumulation.kernels.numba import accumulate_kernel
for info in pkgutil.iter_modules(kernels.numba.__path__, "sparse_accumulation.kernels.numba."):
    module = importlib.import_module(info.name)
    for name, value in vars(module).items():
        if isinstance(value, numba.core.dispatcher.Dispatcher) and value.stats.cache_misses:
            compiled.append(f"{info.name}.{name}")
for dispatcher in accumulate_kernel._variants.values():
    if dispatcher.stats.cache_misses:
        compiled.append(dispatcher.py_func.__name__)
print(json.dumps(compiled))
"""


def test_steps_cover_every_variant_once_per_compute_dtype():
    labels = [label for label, _ in warmup.steps([torch.float16, torch.float32, torch.bfloat16, torch.float64])]
    assert len(labels) == len(set(labels))
    for name in ("float32", "float64"):
        accumulation = [label for label in labels if label.startswith(f"accumulate {name}")]
        assert len(accumulation) == len(accumulate_kernel.all_variants()) == 4
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


# in a child: the warm-up steps, then calls that public functions make (MACE's contraction and the graph with
# every operand gathered, to the second derivative; 16-bit inputs), then the signatures those calls added
_REACHABLE = r"""
import importlib, json, pkgutil, torch, numba
import sparse_accumulation as sa
from sparse_accumulation import kernels, warmup
import sparse_accumulation.kernels.numba
from sparse_accumulation.mace import SymmetricContraction

def signatures():
    from sparse_accumulation.kernels.numba import accumulate_kernel
    found = {}
    for info in pkgutil.iter_modules(kernels.numba.__path__, "sparse_accumulation.kernels.numba."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, numba.core.dispatcher.Dispatcher):
                found[f"{info.name}.{name}"] = set(map(str, value.signatures))
    for key, dispatcher in accumulate_kernel._variants.items():
        found[str(key)] = set(map(str, dispatcher.signatures))
    return found

for label, function in warmup.steps([torch.float32, torch.float64]):
    with torch.enable_grad():
        function()
before = signatures()

def second_order(output, inputs):
    grads = torch.autograd.grad(output.square().sum(), inputs, create_graph=True)
    sum(g.square().sum() for g in grads).backward()

for dtype in (torch.float16, torch.float32, torch.float64):
    compute = torch.float32 if dtype == torch.float16 else dtype
    module = SymmetricContraction("3x0e + 3x1o + 3x2e", "3x0e + 3x1o", correlation=3, num_elements=3, dtype=compute)
    x = torch.randn(80, 3, 9, dtype=compute, requires_grad=True)
    for y in (torch.randint(0, 3, (80,)), torch.nn.functional.one_hot(torch.randint(0, 3, (80,)), 3).to(compute),
              0.5 * torch.nn.functional.one_hot(torch.randint(0, 3, (80,)), 3).to(compute),
              torch.rand(80, 3, dtype=compute, requires_grad=True)):
        second_order(module(x, y), [x] + ([y] if y.requires_grad else []))
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 2, dtype=dtype)
    rule = sa.Rule(m1, m2, mu, 5, w=torch.arange(len(C)) % 3, weight_size=3)
    x, y, w = (torch.randn(rows, channels, size, dtype=dtype, requires_grad=True)
               for rows, channels, size in ((7, 4, 5), (6, 1, 3), (5, 4, 3)))
    edges = 40
    src, other, weights, dst = (torch.randint(0, n, (edges,)) for n in (7, 6, 5, 7))
    for indices in ((src, None, None, dst), (src, other, weights, dst), (None, None, None, dst)):
        operands = [t if i is not None else t[:1].expand(edges, *t.shape[1:]) for t, i in zip((x, y, w), indices)]
        out = sa.accumulate_rule(*operands[:2], rule, C, operands[2], indices_1=indices[0], indices_2=indices[1],
                                 indices_w=indices[2], indices_out=indices[3], size_out=7)
        second_order(out, [x, y, w])
    X1, X2 = torch.randn(50, 5, dtype=dtype, requires_grad=True), torch.randn(50, 3, dtype=dtype, requires_grad=True)
    second_order(sa.accumulate(X1, X2, mu, 5, m1, m2, C), [X1, X2])
    s, z = torch.randn(30, 3, dtype=dtype, requires_grad=True), torch.randn(6, 4, dtype=dtype, requires_grad=True)
    second_order(sa.envsum(s, z, torch.randint(0, 6, (30,)), torch.randint(0, 6, (30,))), [s, z])

after = signatures()
print(json.dumps({name: sorted(after[name] - before.get(name, set())) for name in after
                  if after[name] - before.get(name, set())}))
"""


@pytest.mark.slow
def test_warmup_covers_every_cpu_kernel_public_functions_reach():
    """After the warm-up steps, MACE's contraction (element, scaled and per-node attributes), message passing
    with every operand gathered and the other families, to the second derivative and with 16-bit inputs, add no
    compiled kernel signature: a warmed-up cache serves them all."""
    child = subprocess.run([sys.executable, "-c", _REACHABLE], capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.strip().splitlines()[-1]) == {}
