"""What the first call costs: a cold start (empty kernel caches) and a warm start (kernels cached on disk).

Each measurement runs in a child process of its own with private cache folders, as a new user (or a new
image, a CI runner, a job on a fresh node) meets the library; the cold child starts with empty folders, the
warm one reuses the folders the cold one filled.

On the CPU (numba's cache, ``NUMBA_CACHE_DIR``): import, make a real CG rule, one ``accumulate`` call with
inputs requiring gradients, one ``.backward()``, then a second forward+backward.

    python benchmarks/cold_start.py                                   # 2x2->2, rows 100 x 10, float32
    python benchmarks/cold_start.py --rows 100 10 --rows 1000 200 --repeats 2 --json cold_start.json

On CUDA (Triton's cache ``TRITON_CACHE_DIR``, the generated sources' ``SPARSE_ACCUMULATION_TRITON_CACHE`` and
inductor's ``TORCHINDUCTOR_CACHE_DIR``), one case per child: ``op`` (``accumulate``, 8x8->8, 10^4 x 16 rows,
forward+backward), ``layer`` (the fused e3nn ``TensorProduct`` of ``benchmarks/convolution.py``: 32x0e+32x1o+32x2e
with harmonics l <= 3, 13 "uvu" paths, 10^4 edges, forward+backward), ``contraction`` (MACE's symmetric
contraction, 128x0e+128x1o+128x2e+128x3o -> 128x0e+128x1o, correlation 3, 10 elements, 10^3 nodes,
forward+backward) and ``model-eager``, ``model-default``, ``model-reduce-overhead`` (a training step of the
model of ``benchmarks/model_step.py``, energies and forces, one molecule of 46 atoms): the seconds of the
first call and of the second; then, where eager calls ran on the portable kernels while the GPU kernels
compiled, the seconds from the first call until a call ran on compiled kernels only ("compiled"), and the time
of the call after that ("steady").

    python benchmarks/cold_start.py --device cuda --json cold_start_cuda.json
    python benchmarks/cold_start.py --device cuda --cases layer,model-eager

``--repo DIR`` measures the copy of the library in ``DIR`` instead of the installed one (to compare two
revisions alternately on a noisy machine).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

# the child: prints one JSON line of seconds
_CHILD = r"""
import json, sys, time
start = time.perf_counter()
import torch
import sparse_accumulation as sa
imported = time.perf_counter()
l1, l2, L, A, B, dtype = json.loads(sys.argv[1])
dtype = getattr(torch, dtype)
m1, m2, mu, C = sa.get_cg_transformation_rule(l1, l2, L, dtype=dtype)
generator = torch.Generator().manual_seed(0)
X1 = torch.randn(A, B, 2 * l1 + 1, dtype=dtype, generator=generator).requires_grad_()
X2 = torch.randn(A, B, 2 * l2 + 1, dtype=dtype, generator=generator).requires_grad_()
times = {"import": imported - start}
for step in ("first", "second"):
    X1.grad = X2.grad = None
    t0 = time.perf_counter()
    out = sa.accumulate(X1, X2, mu, 2 * L + 1, m1, m2, C)
    t1 = time.perf_counter()
    out.sum().backward()
    t2 = time.perf_counter()
    times[step + "_forward"], times[step + "_backward"] = t1 - t0, t2 - t1
print(json.dumps(times))
"""


#: the CUDA child: prints one JSON line of seconds (import, first and second call of the case)
_CUDA_CHILD = r"""
import json, sys, time
start = time.perf_counter()
import torch
import sparse_accumulation as sa
imported = time.perf_counter() - start
case, benchmarks = sys.argv[1], sys.argv[2]
sys.path.append(benchmarks)  # after the library measured, which is already imported
device = torch.device("cuda")


def backward_of(f, *inputs):
    def step():
        for t in inputs:
            t.grad = None
        f(*inputs).square().sum().backward()
    return step


if case == "op":
    m1, m2, mu, C = sa.get_cg_transformation_rule(8, 8, 8, device=device)
    X1, X2 = (torch.randn(10_000, 16, 17, device=device, requires_grad=True) for _ in range(2))
    step = backward_of(lambda a, b: sa.accumulate(a, b, mu, 17, m1, m2, C), X1, X2)
elif case == "layer":
    import convolution
    theirs, ours = convolution.make_modules(("32x0e + 32x1o + 32x2e", 3), torch.float32, device)
    edges, nodes = 10_000, 500
    src, dst = torch.randint(0, nodes, (edges,), device=device), torch.randint(0, nodes, (edges,), device=device)
    x = torch.randn(nodes, theirs.irreps_in1.dim, device=device, requires_grad=True)
    Y = torch.randn(edges, theirs.irreps_in2.dim, device=device, requires_grad=True)
    W = torch.randn(edges, theirs.weight_numel, device=device, requires_grad=True)
    step = backward_of(lambda a, b, c: ours(a, b, c, indices_1=src, indices_out=dst.sort().values, size_out=nodes),
                       x, Y, W)
elif case == "contraction":
    from sparse_accumulation.mace import SymmetricContraction
    c = 128
    module = SymmetricContraction(f"{c}x0e+{c}x1o+{c}x2e+{c}x3o", f"{c}x0e+{c}x1o", correlation=3,
                                  num_elements=10).to(device)
    x = torch.randn(1000, c, 16, device=device, requires_grad=True)
    y = torch.randint(0, 10, (1000,), device=device)
    step = backward_of(lambda a: module(a, y), x)
elif case.startswith("model-"):
    import model_step
    example = model_step._example()
    mode = case[len("model-"):]
    batch, src, dst = model_step.make_batch(example, 1, device)
    torch.manual_seed(0)
    model = example.Potential(model_step.CONFIG, "ours").to(device)
    step = model_step.make_step(example, model, "train", mode, batch, src, dst)
else:
    raise SystemExit(f"unknown case {case!r}")
times = {"import": imported}
torch.cuda.synchronize()
began = time.perf_counter()
for name in ("first", "second"):
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    times[name] = time.perf_counter() - t0
try:  # calls that ran on the portable kernels while the GPU kernels compiled
    from sparse_accumulation.kernels.triton import launch
    count = lambda: launch.not_ready_calls
except (ImportError, AttributeError):
    count = None
if count is not None:  # step on until a step runs on compiled kernels only: then the one after it is timed
    before = count() - 1
    while count() != before and time.perf_counter() - began < 300:
        before = count()
        step()
        torch.cuda.synchronize()
    times["compiled_after"] = time.perf_counter() - began
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    times["steady"] = time.perf_counter() - t0
print(json.dumps(times))
"""

#: the CUDA cases, in the order they run
CUDA_CASES = ("op", "layer", "contraction", "model-eager", "model-default", "model-reduce-overhead")


def _run_child(code: str, argv: list, env: dict, repo: str | None) -> dict:
    if repo:
        env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True,
                            cwd=repo or tempfile.gettempdir())
    if result.returncode:
        raise RuntimeError(f"the child failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def child(case: list, cache: str, repo: str | None) -> dict:
    """Seconds of the stages of one CPU child process with ``NUMBA_CACHE_DIR=cache``."""
    return _run_child(_CHILD, [json.dumps(case)], dict(os.environ, NUMBA_CACHE_DIR=cache), repo)


def cuda_child(case: str, cache: str, repo: str | None) -> dict:
    """Seconds of one CUDA case in a child process whose kernel caches live under ``cache``."""
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(cache, "triton"),
               SPARSE_ACCUMULATION_TRITON_CACHE=os.path.join(cache, "sources"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"), NUMBA_CACHE_DIR=os.path.join(cache, "numba"))
    return _run_child(_CUDA_CHILD, [case, os.path.dirname(os.path.abspath(__file__))], env, repo)


def versions() -> dict:
    import numba
    import numpy
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__, "numba": numba.__version__,
            "numpy": numpy.__version__, "machine": platform.machine(), "cpus": os.cpu_count()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--l", nargs=3, type=int, default=[2, 2, 2], metavar=("L1", "L2", "L"))
    parser.add_argument("--rows", nargs=2, type=int, action="append", metavar=("A", "B"),
                        help="input shape [A, B, 2l+1] (repeatable; default 100 10)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=1, help="cold and warm children per row shape")
    parser.add_argument("--repo", help="measure the library in this directory (default: the one installed)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", default=",".join(CUDA_CASES), help="CUDA: comma-separated, from "
                        + ", ".join(CUDA_CASES))
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        return main_cuda(args, parser)
    rows = args.rows or [[100, 10]]
    results = []
    print(f"# {versions()}")
    print(f"{'rule':8} {'rows':>10} {'start':5} {'import s':>9} {'1st fwd s':>10} {'1st bwd s':>10} "
          f"{'2nd fwd ms':>11} {'2nd bwd ms':>11}")
    for A, B in rows:
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
                for start in ("cold", "warm"):
                    times = child([*args.l, A, B, args.dtype], cache, args.repo)
                    results.append({"rule": args.l, "rows": [A, B], "dtype": args.dtype, "start": start, **times})
                    print(f"{'x'.join(map(str, args.l[:2])) + '->' + str(args.l[2]):8} {f'{A}x{B}':>10} "
                          f"{start:5} {times['import']:9.2f} {times['first_forward']:10.2f} "
                          f"{times['first_backward']:10.2f} {times['second_forward'] * 1e3:11.2f} "
                          f"{times['second_backward'] * 1e3:11.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"versions": versions(), "results": results}, indent=1) + "\n")


def main_cuda(args, parser) -> None:
    import torch

    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CUDA_CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {', '.join(CUDA_CASES)}")
    import triton
    meta = {"versions": {**versions(), "triton": triton.__version__},
            "device": torch.cuda.get_device_name(), "repo": args.repo}
    print(f"# {meta}")
    print(f"{'case':24} {'start':5} {'import s':>9} {'first s':>9} {'second s':>9} {'compiled s':>10} "
          f"{'steady s':>9}")
    results = []
    for case in cases:
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="kernel-caches-") as cache:
                for start in ("cold", "warm"):
                    try:
                        times = cuda_child(case, cache, args.repo)
                    except RuntimeError as error:
                        print(f"{case:24} {start:5} FAILED: {str(error)[-600:]}", flush=True)
                        break
                    results.append({"case": case, "start": start, **times})
                    print(f"{case:24} {start:5} {times['import']:9.2f} {times['first']:9.2f} "
                          f"{times['second']:9.3f} {times.get('compiled_after', float('nan')):10.2f} "
                          f"{times.get('steady', float('nan')):9.3f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
