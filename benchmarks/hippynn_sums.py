"""The interaction sums (envsum, sensesum, featsum) against hippynn's own implementations: time and peak memory.

    python benchmarks/hippynn_sums.py --device cpu --sizes medium large
    python benchmarks/hippynn_sums.py --device cuda                          # medium, large and mega

For each of hippynn's simulated systems (``hippynn.custom_kernels.test_env.get_simulated_data``, float32, pairs
in hippynn's order; ``env`` uniform random) and each case:

* ``envsum``, ``sensesum``, ``featsum``: one forward call;
* ``envsum fwd+bwd``: ``envsum(s, z)`` with both inputs requiring gradients, then ``backward(G)``;
* ``double backward``: ``env = envsum(s, z)``, ``dz = grad(env, z, G, create_graph=True)``, then
  ``grad(<dz, H>, s)`` (the path forces take through the layer),

it times ``sparse_accumulation`` (indices cached between calls, as in a forward and its backward), as
``sparse_accumulation, new indices`` the same with index tensors made afresh for every call (sorting them
included), on CUDA as ``sparse_accumulation, atomic featsum`` with the Triton featsum that adds atomically
(``triton_pair_sums.FEATSUM = "atomic"``), against every hippynn implementation that runs here: ``pytorch``
(hippynn's torch.compile'd formulas), ``numba`` and, on CUDA, ``triton``; one that fails is reported with its
error. Times are medians of
single synchronised calls (CUDA events on CUDA); ``peak MB`` is the most memory the call held beyond what was
allocated before it, outputs included, measured in a second subprocess after the timings (CUDA: the caching
allocator's peak; CPU: the growth of the process's peak resident memory, reset through ``/proc/self/clear_refs``,
with glibc told to map every block from 64 KiB afresh and the library's kept output buffers released; -1 where
unknown), beside ``in+out MB``, the inputs and outputs.

First, every implementation is checked against the float64 gather formulas (computed in bounded chunks);
``max rel err`` is its largest deviation over the largest reference value, and if one of ours exceeds
:data:`TOLERANCE` the run exits with status 1. Each size runs in a subprocess, so that an implementation that
crashes the CUDA context (hippynn's Triton kernels at ``large`` and ``mega`` on an H200) is reported and the
size run again without it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.bench import timing  # noqa: E402
from sparse_accumulation.kernels.numba import buffers  # noqa: E402

SIZES = ("medium", "large", "mega")
CASES = ("envsum", "sensesum", "featsum", "envsum fwd+bwd", "double backward")
OURS = "sparse_accumulation"
FRESH = "sparse_accumulation, new indices"
ATOMIC = "sparse_accumulation, atomic featsum"  # CUDA: featsum by pair_first with atomic adds
#: largest relative error of our float32 results against the float64 formulas
TOLERANCE = 1e-5
REPEATS = {"cpu": {"medium": 10, "large": 5, "mega": 3}, "cuda": {"medium": 50, "large": 30, "mega": 20}}


def _hippynn():
    if not hasattr(np, "row_stack"):  # numpy >= 2.5 removed it; hippynn's numba path still reaches it
        np.row_stack = np.vstack
    import hippynn.custom_kernels as custom_kernels
    from hippynn.custom_kernels import test_env

    custom_kernels.populate_custom_kernel_availability()
    return custom_kernels, test_env


def _data(size: str, device):
    _, test_env = _hippynn()
    np.random.seed(0)
    s, z, first, second = test_env.get_simulated_data(**test_env.TEST_PARAMS[size], dtype=torch.float32,
                                                      device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    env = torch.rand(z.shape[0], s.shape[1], z.shape[1], device=device, generator=generator)
    G = torch.randn(env.shape, device=device, generator=generator)
    H = torch.randn(z.shape, device=device, generator=generator)
    return s, z, env, first, second, G, H


def _functions(name: str):
    """``(envsum, sensesum, featsum)`` of an implementation: ours or hippynn's ``name``."""
    if name in (OURS, FRESH, ATOMIC):
        return sa.envsum, sa.sensesum, sa.featsum
    custom_kernels, _ = _hippynn()
    kernels = custom_kernels.MessagePassingKernels.get_implementation(name)
    return kernels.envsum, kernels.sensesum, kernels.featsum


def _steps(name: str, data):
    """Per case, ``(prepare, run)``: ``prepare()`` makes the arguments (outside the timing), ``run(args)``."""
    envsum, sensesum, featsum = _functions(name)
    s, z, env, first, second, G, H = data

    def pairs():
        if name == FRESH:
            return first.clone(), second.clone()
        return first, second

    def forward(function, a, b):
        return (lambda: (a, b) + pairs()), (lambda args: function(*args))

    def with_grad():
        return (s.detach().requires_grad_(), z.detach().requires_grad_()) + pairs()

    def forward_backward(args):
        envsum(*args).backward(G)

    def double_backward(args):
        out = envsum(*args)
        (dz,) = torch.autograd.grad(out, args[1], G, create_graph=True)
        torch.autograd.grad((dz * H).sum(), args[0])

    return {"envsum": forward(envsum, s, z), "sensesum": forward(sensesum, env, z),
            "featsum": forward(featsum, env, s), "envsum fwd+bwd": (with_grad, forward_backward),
            "double backward": (with_grad, double_backward)}


def _references(data):
    """The float64 results the forwards and envsum's gradients are checked against (chunked gather formulas)."""
    s, z, env, first, second, G, _ = (t.double() if t.is_floating_point() else t for t in data)
    return {"envsum": sa.envsum(s, z, first, second, implementation="torch"),
            "sensesum": sa.sensesum(env, z, first, second, implementation="torch"),
            "featsum": sa.featsum(env, s, first, second, implementation="torch"),
            "envsum fwd+bwd": (sa.sensesum(G, z, first, second, implementation="torch"),
                               sa.featsum(G, s, first, second, implementation="torch"))}


def _relative_error(got, expected) -> float:
    if isinstance(expected, tuple):
        return max(_relative_error(g, e) for g, e in zip(got, expected))
    scale = float(expected.abs().max()) or 1.0
    return float((got.double() - expected).abs().max()) / scale


def _check(name: str, data, references) -> dict:
    """Relative errors of an implementation's forwards and envsum gradients."""
    steps = _steps(name, data)
    errors = {}
    with torch.no_grad():
        for case in ("envsum", "sensesum", "featsum"):
            prepare, run = steps[case]
            errors[case] = _relative_error(run(prepare()), references[case])
    s, z = steps["envsum fwd+bwd"][0]()[:2]
    out = _functions(name)[0](s, z, data[3], data[4])
    errors["envsum fwd+bwd"] = _relative_error(torch.autograd.grad(out, (s, z), data[5]), references["envsum fwd+bwd"])
    return errors


def _resident_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _map_large_blocks_afresh() -> bool:
    """Have glibc map every block from 64 KiB afresh and unmap it when freed, so that the resident size grows by
    what a call allocates (called first thing in a memory worker). False where that cannot be arranged."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 1 << 16)) and bool(libc.mallopt(-1, 0))  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False


def _peak_bytes(prepare, run, device) -> int:
    """The most memory one call held beyond what was allocated before it (outputs included); -1 if unknown."""
    buffers.release()  # our outputs come from kept buffers: count them as new
    args = prepare()
    timing.synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = run(args)
        timing.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # resets the peak resident size
        except OSError:
            return -1
        before = _resident_bytes("VmRSS")
        result = run(args)
        peak = _resident_bytes("VmHWM") - before
    del result
    return peak


def _in_out_bytes(case: str, data) -> int:
    s, z, env, first, second, G, _ = data
    size = {"envsum": (s, z, env), "sensesum": (env, z, s), "featsum": (env, s, z),
            "envsum fwd+bwd": (s, z, env, G, s, z), "double backward": (s, z, env, G, z, s)}[case]
    return sum(t.numel() * t.element_size() for t in size + (first, second))


@contextlib.contextmanager
def _variant(name: str):
    """The kernels' settings of implementation ``name`` while it runs."""
    if name != ATOMIC:
        yield
        return
    from sparse_accumulation.kernels.triton import pair_sums as triton_pair_sums

    previous, triton_pair_sums.FEATSUM = triton_pair_sums.FEATSUM, "atomic"
    try:
        yield
    finally:
        triton_pair_sums.FEATSUM = previous


def run_size(size: str, device, names: list, repeats: int) -> list:
    """Records (dicts) of every implementation and case at one size: checked, then timed."""
    data = _data(size, device)
    references = _references(data)
    records = []
    for name in names:
        with _variant(name):
            records += _run_implementation(name, size, device, data, references, repeats)
    return records


def peaks_of_size(size: str, device, names: list) -> list:
    """``(implementation, case, peak MB)`` of every implementation and case that runs at one size."""
    data = _data(size, device)
    peaks = []
    for name in names:
        with _variant(name):
            steps = _steps(name, data)
            for case in CASES:
                prepare, run = steps[case]
                try:
                    for _ in range(2):  # warm-up
                        run(prepare())
                except Exception:  # reported by the timing run
                    break
                peaks.append((name, case, _peak_bytes(prepare, run, device) / 2**20))
    return peaks


def _run_implementation(name: str, size: str, device, data, references, repeats: int) -> list:
    """Records of one implementation: checked, then timed case by case (an error is reported, not timed)."""
    try:
        errors = _check(name, data, references)
    except Exception as error:
        return [{"size": size, "implementation": name, "case": "all", "error": repr(error)[:200]}]
    records = []
    steps = _steps(name, data)
    for case in CASES:
        prepare, run = steps[case]
        for _ in range(2):  # warm-up: compilation, caches, kept buffers
            run(prepare())
        samples = [timing.elapsed_ms(lambda args=prepare(): run(args), device) for _ in range(repeats)]
        records.append({"size": size, "implementation": name, "case": case,
                        "median_ms": statistics.median(samples), "samples": len(samples),
                        "in_out_mb": _in_out_bytes(case, data) / 2**20, "max_rel_err": errors.get(case)})
    return records


def _implementations(device, include_triton: bool = True) -> list:
    names = [OURS, FRESH] + ([ATOMIC] if device.type == "cuda" else []) + ["pytorch", "numba"]
    if device.type == "cuda" and include_triton:
        names.append("triton")
    return names


def _worker(args) -> None:
    device = torch.device(args.device)
    if args.worker == "memory":
        results = peaks_of_size(args.sizes[0], device, args.implementations)
    else:
        size = args.sizes[0]
        results = run_size(size, device, args.implementations, args.repeats or REPEATS[device.type][size])
    with open(args.output, "w") as out:
        json.dump(results, out)


def _run_worker(mode: str, size: str, args, names: list) -> tuple:
    """The results of a ``mode`` ("time" or "memory") worker subprocess at ``size``, and its error output when
    it failed."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        path = handle.name
    command = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--device", args.device, "--sizes", size,
               "--output", path, "--implementations", *names] + (["--repeats", str(args.repeats)] if args.repeats else [])
    result = subprocess.run(command, capture_output=True, text=True)
    try:
        if result.returncode == 0:
            with open(path) as results:
                return json.load(results), ""
        return None, (result.stderr or result.stdout)[-2000:]
    finally:
        os.unlink(path)


def _measure_size(size: str, args, device) -> tuple:
    """Timed and checked records of ``size`` with their peak memory, or ``(None, error output)``."""
    names = _implementations(device)
    found, failure = _run_worker("time", size, args, names)
    if found is None and "triton" in names:  # run again without hippynn's Triton kernels
        names = _implementations(device, include_triton=False)
        found, second = _run_worker("time", size, args, names)
        if found is None:
            return None, second
        found.append({"size": size, "implementation": "triton", "case": "all",
                      "error": "crashed the process: " + failure.strip().splitlines()[-1][:150]})
    if found is None:
        return None, failure
    peaks, failure = _run_worker("memory", size, args, [n for n in names if n != FRESH])
    if peaks is None:
        print(f"{size}: the memory run failed (peaks reported as -1):\n{failure}", file=sys.stderr)
    peaks = {(name, case): peak for name, case, peak in peaks or []}
    for record in found:
        if "median_ms" in record:
            implementation = OURS if record["implementation"] == FRESH else record["implementation"]
            record["peak_mb"] = peaks.get((implementation, record["case"]), -1.0)
    return found, ""


def format_table(records: list) -> str:
    header = ("size", "case", "implementation", "median ms", "peak MB", "in+out MB", "vs best hippynn",
              "max rel err")
    rows = [header]
    best = {}
    for r in records:
        if "median_ms" in r and r["implementation"] not in (OURS, FRESH, ATOMIC):
            key = (r["size"], r["case"])
            best[key] = min(best.get(key, float("inf")), r["median_ms"])
    for r in records:
        if "error" in r:
            rows.append((r["size"], r["case"], r["implementation"], "fails: " + r["error"], "", "", "", ""))
            continue
        reference = best.get((r["size"], r["case"]))
        ratio = f"{reference / r['median_ms']:.2f}x" if reference else "-"
        error = "-" if r["max_rel_err"] is None else f"{r['max_rel_err']:.1e}"
        rows.append((r["size"], r["case"], r["implementation"], f"{r['median_ms']:.3f}",
                     f"{r['peak_mb']:.1f}", f"{r['in_out_mb']:.1f}", ratio, error))
    widths = [max(len(str(row[i])) for row in rows if len(row) > i) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def describe(device) -> str:
    _hippynn()
    import hippynn
    import numba

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return (f"device: {machine}; torch {torch.__version__}, triton {triton_version}, numba {numba.__version__}, "
            f"hippynn {hippynn.__version__}, numpy {np.__version__}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=None,
                        help="hippynn's test sizes (default: medium large on the CPU, all three on CUDA)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per case (default: by size)")
    parser.add_argument("--implementations", nargs="+", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=("time", "memory"), help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.sizes is None:
        args.sizes = list(SIZES) if device.type == "cuda" else ["medium", "large"]
    if args.worker:
        if args.worker == "memory" and device.type == "cpu" and not _map_large_blocks_afresh():
            print("cannot measure CPU memory here (glibc's mallopt)", file=sys.stderr)
        _worker(args)
        return 0
    print(describe(device), flush=True)
    records = []
    for size in args.sizes:
        found, failure = _measure_size(size, args, device)
        if found is None:
            print(f"{size}: the run failed:\n{failure}", file=sys.stderr)
            return 1
        records += found
        print(f"{size} done", file=sys.stderr, flush=True)
    print(format_table(records))
    ours = [r for r in records if r["implementation"] in (OURS, FRESH, ATOMIC) and "max_rel_err" in r]
    bad = [r for r in ours if r["max_rel_err"] is not None and r["max_rel_err"] > TOLERANCE]
    errors = [r for r in records if r["implementation"] in (OURS, FRESH, ATOMIC) and "error" in r]
    if bad or errors:
        print(f"FAILED: {len(bad) + len(errors)} results of ours are wrong or failed", file=sys.stderr)
        return 1
    print(f"all results of ours within {TOLERANCE:g} of the float64 formulas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
