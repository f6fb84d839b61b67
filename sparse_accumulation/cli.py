"""Command line: ``sparse-accumulation {bench,check,tables,warmup}`` (also ``python -m sparse_accumulation``).

* ``bench``: check, then time, the implementations on real CG rules (see :mod:`sparse_accumulation.bench`);
* ``check``: self-test of the installed kernels against float64 references;
* ``tables``: precomputed CG tables, the same as ``python -m cg tables``;
* ``warmup``: compile every CPU kernel into numba's disk cache ahead of time (:mod:`sparse_accumulation.warmup`).

Exit status: 0 on success, 1 when an implementation gives wrong results or raises when called, 2 on a usage
error (one line on stderr, no traceback). A timing that cannot run (a compile error) is reported as FAILED in
its column, with the reason, and does not change the exit status.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Optional, Sequence

PROG = "sparse-accumulation"

__all__ = ["main", "PROG"]


class _UsageError(Exception):
    """A command-line usage problem, reported as one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage and call sys.exit(2)
        raise _UsageError(message)


def _csv(text: str) -> list:
    return [item.strip() for item in text.split(",") if item.strip()]


def _build_parser() -> _Parser:
    from . import bench

    parser = _Parser(prog=PROG, description="Sparse accumulation for Clebsch-Gordan products: benchmarks, "
                                            "self-test and coefficient tables.")
    sub = parser.add_subparsers(dest="command", metavar="{bench,check,tables,warmup}", parser_class=_Parser)

    b = sub.add_parser("bench", help="check, then time, the implementations on real CG rules",
                       description="Check every implementation against a float64 index_add reference, then "
                                   "time it (median of repeats). A wrong implementation is reported FAILED "
                                   "and the exit status is 1.")
    b.add_argument("--quick", action="store_true",
                   help="small rows (100x50), rules 8x8->8 and 2x2->2, 3 repeats, the timings without "
                        "compilation (kernel, call, host): seconds")
    b.add_argument("--l", dest="paths", nargs=3, type=int, action="append", metavar=("L1", "L2", "L"),
                   help="a real CG path l1 x l2 -> L (repeatable; default: 8 8 8, 4 4 4, 2 2 2, 3 2 4, 1 1 2)")
    b.add_argument("--lmax", type=int, help="the paths l x l -> l for l = 1 .. LMAX instead")
    b.add_argument("--rows", nargs=2, type=int, metavar=("A", "B"),
                   help="input shape [A, B, 2l+1] (default: 1000 200 on CPU, 1000 2000 on CUDA)")
    b.add_argument("--dtype", default="float32", help="comma-separated: float32, float64, float16, bfloat16 "
                                                      "(default: float32)")
    b.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                   help="where to run (default: all available devices)")
    b.add_argument("--implementations", type=_csv, metavar="NAMES",
                   help=f"comma-separated, from {', '.join(bench.IMPLEMENTATIONS)} (default: numba, torch, "
                        "index_add, dense, sparse, elementwise on CPU; triton, torch, index_add, dense, sparse, "
                        "e3nn, elementwise on CUDA)")
    b.add_argument("--modes", type=_csv, default=["forward", "backward"], metavar="MODES",
                   help="comma-separated: forward, backward (= forward + backward of sum(out * G)); "
                        "default: both")
    b.add_argument("--timings", type=_csv, metavar="TIMINGS",
                   help=f"comma-separated, from {', '.join(bench.TIMINGS)} (default: all; with --quick: "
                        f"{', '.join(bench.EAGER_TIMINGS)}); reduce-overhead runs on CUDA only")
    b.add_argument("--grad-c", action="store_true", help="backward also differentiates the coefficients C")
    b.add_argument("--repeats", type=int, help="samples per timing (default: 5, quick: 3)")
    b.add_argument("--warmup", type=int, default=1, help="untimed calls before each timing (default: 1)")
    b.add_argument("--check-rows", type=int, default=2048,
                   help="rows compared with the float64 reference (0: all; default: 2048)")
    b.add_argument("--output", "-o", metavar="DIR",
                   help="write bench.json, and the charts bench.png and bench.svg (with matplotlib), into DIR")
    b.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    c = sub.add_parser("check", help="self-test the installed kernels against float64 references",
                       description="Run every kernel implementation on every available device against "
                                   "float64 references (forward, gradients for X1, X2 and C, double "
                                   "backward). Exit status 1 if any fails.")
    c.add_argument("--implementations", type=_csv, metavar="NAMES", help="comma-separated kernels "
                                                                          "(default: numba, triton, torch)")
    c.add_argument("--device", choices=("cpu", "cuda", "all"), default="all", help="default: all available")
    c.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    w = sub.add_parser("warmup", help="compile every CPU kernel ahead of time into numba's disk cache",
                       description="Compile (or load) every numba kernel for the given dtypes, so that no later "
                                   "process compiles: for images and clusters, run it with the NUMBA_CACHE_DIR "
                                   "the jobs use.")
    w.add_argument("--dtypes", type=_csv, default=["float32", "float64"], metavar="DTYPES",
                   help="comma-separated: float32, float64, float16, bfloat16 (16-bit dtypes compute in "
                        "float32; default: float32,float64)")
    w.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    sub.add_parser("tables", help="compute CG coefficient tables (same as python -m cg tables; see "
                                  f"{PROG} tables --help)", add_help=False)
    return parser


def _devices(choice: str) -> list:
    import torch

    if choice == "all":
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if choice == "cuda" and not torch.cuda.is_available():
        raise _UsageError("--device cuda: no CUDA device is available")
    return [choice]


def _bench_cases(args, bench) -> list:
    if args.paths and args.lmax is not None:
        raise _UsageError("use either --l or --lmax, not both")
    rules = None
    if args.lmax is not None:
        if args.lmax < 1:
            raise _UsageError(f"--lmax must be at least 1, got {args.lmax}")
        rules = [(l, l, l) for l in range(args.lmax, 0, -1)]
    elif args.paths:
        rules = [tuple(p) for p in args.paths]
        for l1, l2, L in rules:
            if min(l1, l2, L) < 0 or not abs(l1 - l2) <= L <= l1 + l2:
                raise _UsageError(f"--l {l1} {l2} {L}: need l1, l2 >= 0 and |l1 - l2| <= L <= l1 + l2")
    if args.rows is not None and min(args.rows) < 1:
        raise _UsageError(f"--rows must be positive, got {args.rows[0]} {args.rows[1]}")
    dtypes = []
    for name in _csv(args.dtype):
        if name not in bench.DTYPES:
            raise _UsageError(f"--dtype {name}: choose from {', '.join(bench.DTYPES)}")
        dtypes.append(bench.DTYPES[name])
    if not dtypes:
        raise _UsageError("--dtype needs at least one dtype")
    return bench.standard_cases(quick=args.quick, devices=_devices(args.device), rules=rules, rows=args.rows,
                                dtypes=dtypes)


def _cmd_bench(args, argv, out, err) -> int:
    from . import bench

    cases = _bench_cases(args, bench)
    for name in args.implementations or []:
        if name not in bench.IMPLEMENTATIONS:
            raise _UsageError(f"--implementations: unknown {name!r}; choose from {', '.join(bench.IMPLEMENTATIONS)}")
    if args.implementations == []:
        raise _UsageError("--implementations needs at least one name")
    try:
        modes = bench.normalize_modes(args.modes)
    except ValueError as error:
        raise _UsageError(f"--modes: {error}") from None
    try:
        timings = bench.normalize_timings(args.timings if args.timings is not None else
                                          bench.EAGER_TIMINGS if args.quick else bench.TIMINGS)
    except ValueError as error:
        raise _UsageError(f"--timings: {error}") from None
    if not modes:
        raise _UsageError("--modes needs at least one mode")
    if not timings:
        raise _UsageError("--timings needs at least one timing")
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 5)
    if repeats < 1 or args.warmup < 0 or args.check_rows < 0:
        raise _UsageError("--repeats must be at least 1, --warmup and --check-rows non-negative")

    start = time.perf_counter()
    results = bench.run_benchmark(cases, implementations=args.implementations, modes=modes, timings=timings,
                                  repeats=repeats, warmup=args.warmup, grad_c=args.grad_c,
                                  check_rows=args.check_rows, progress=False if args.quiet else err)
    elapsed = time.perf_counter() - start
    _print_header(results, timings, repeats, args.warmup, out)
    print(bench.format_table(results), file=out)
    if args.output:
        command = " ".join([PROG] + [shlex.quote(a) for a in argv])
        paths = bench.write_results(results, args.output, command=command)
        for key in ("json", "png", "svg"):
            if paths[key]:
                print(f"wrote {paths[key]}", file=out)
        if paths["note"]:
            print(paths["note"], file=out)
    failed = [r for r in results if r["status"] == "FAILED"]
    failed_timings = sum(e["status"] == "FAILED" for r in results if r["status"] != "FAILED"
                         for e in r["timings"].values())
    summary = f"{len(failed)} FAILED (wrong results are not timed)" if failed else "all results checked"
    if failed_timings:
        summary += f"; {failed_timings} timing(s) FAILED to run (reasons in the status column)"
    print(f"{len(results)} measurements in {elapsed:.1f} s; {summary}", file=out)
    return 1 if failed else 0


def _print_header(results, timings, repeats: int, warmup: int, out) -> None:
    """The versions, what the columns mean, the copy bandwidth and the timings that could not run."""
    from . import bench

    env = bench.environment()
    print(f"# torch {env['torch']}, numba {env['numba']}, triton {env['triton']}, {env['cpu_threads']} CPU "
          f"threads" + (f", {env['cuda_device']}" if "cuda_device" in env else ""), file=out)
    print(f"# medians of {repeats} samples after {warmup} warm-up call(s) per timing. kernel: calls back to "
          "back, synchronised once; call: one step as in training (inputs requiring grad, synchronised "
          "around the call); compiled: the same under torch.compile(fullgraph=True); reduce-overhead: "
          "torch.compile(mode='reduce-overhead'); host: host time per call, not synchronised", file=out)
    bandwidth = {r["device"]: r["copy_GBps"] for r in results}
    print("# vs index_add = index_add time / time and GB/s = floor bytes / time, both for the first timing; "
          "range = the speed-up between the 20% and 80% quantiles of the repeats; "
          "floor ms = (inputs read once + outputs written once) / copy bandwidth ("
          + ", ".join(f"{device} {gbps:.1f} GB/s" for device, gbps in bandwidth.items()) + ")", file=out)
    for timing in timings:
        for device in sorted({r["device"] for r in results}):
            notes = {e["note"] for r in results if r["device"] == device
                     for t, e in r["timings"].items() if t == timing and e["status"] == "skipped"}
            if notes and all(r["timings"].get(timing, {}).get("status") != "ok" for r in results
                             if r["device"] == device):
                print(f"# {timing}: skipped on {device} ({'; '.join(sorted(notes))})", file=out)


def _cmd_check(args, out, err) -> int:
    from . import backends, bench

    for name in args.implementations or []:
        if name not in backends.KERNELS:
            raise _UsageError(f"--implementations: unknown kernel {name!r}; choose from "
                              f"{', '.join(backends.KERNELS)}")
    results = bench.run_check(args.implementations, _devices(args.device), progress=False if args.quiet else err)
    print(bench.format_check(results), file=out)
    failed = [r for r in results if r.status == "FAILED"]
    for r in failed:
        for problem in r.failures[1:6]:
            print(f"  {r.implementation} {r.device}: {problem}", file=out)
    print(f"{len(failed)} FAILED" if failed else "all available implementations OK", file=out)
    return 1 if failed else 0


def _cmd_warmup(args, out, err) -> int:
    import numba

    from . import warmup

    unknown = [d for d in args.dtypes if d not in warmup.DTYPES]
    if unknown or not args.dtypes:
        raise _UsageError(f"--dtypes: choose from {', '.join(warmup.DTYPES)}")
    start = time.perf_counter()
    try:
        times = warmup.warmup(args.dtypes, progress=False if args.quiet else err)
    except RuntimeError as error:
        print(f"{PROG}: {error}", file=err)
        return 1
    where = numba.config.CACHE_DIR or "the __pycache__ folders of the installed package"
    print(f"{len(times)} warm-up steps in {time.perf_counter() - start:.1f} s; kernels cached in {where}", file=out)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line interface.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status, 0 on success, 1 when an implementation fails its check, 2 on a usage error (a
        one-line ``sparse-accumulation: error: ...`` message on stderr).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    out, err = sys.stdout, sys.stderr
    if argv and argv[0] == "tables":
        from cg.cli import main as cg_main

        return cg_main(argv, prog=PROG)
    try:
        args = _build_parser().parse_args(argv)
        if args.command is None:
            raise _UsageError("a command is required: bench, check, tables or warmup (see --help)")
        if args.command == "bench":
            return _cmd_bench(args, argv, out, err)
        if args.command == "warmup":
            return _cmd_warmup(args, out, err)
        return _cmd_check(args, out, err)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except _UsageError as exc:
        print(f"{PROG}: error: {str(exc).splitlines()[0] if str(exc) else 'bad arguments'}", file=err)
        return 2
