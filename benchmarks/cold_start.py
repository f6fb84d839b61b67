"""What the first call costs: a cold start (empty numba cache) and a warm start (kernels cached on disk).

Each measurement runs in a child process of its own with a private ``NUMBA_CACHE_DIR``, as a new user (or a
new image) meets the library: import, make a real CG rule, one ``accumulate`` call with inputs requiring
gradients, one ``.backward()``, then a second forward+backward (kernels compiled and loaded by then). The
cold child starts with an empty cache directory, the warm one reuses the directory the cold one filled.

    python benchmarks/cold_start.py                                   # 2x2->2, rows 100 x 10, float32
    python benchmarks/cold_start.py --rows 100 10 --rows 1000 200 --repeats 2 --json cold_start.json

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


def child(case: list, cache: str, repo: str | None) -> dict:
    """Seconds of the stages of one child process with ``NUMBA_CACHE_DIR=cache``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    if repo:
        env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(case)], env=env, capture_output=True,
                            text=True, cwd=repo or tempfile.gettempdir())
    if result.returncode:
        raise RuntimeError(f"the child failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    main()
