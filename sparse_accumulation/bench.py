"""Benchmarks and self-tests of the sparse accumulation implementations (``sparse-accumulation bench|check``).

The functions here are usable from Python and tests; :mod:`sparse_accumulation.cli` only parses arguments.

* :func:`standard_cases` / :class:`Case`: what to measure (a real CG rule, rows ``A x B``, dtype, device);
* :func:`run_benchmark`: for every case, implementation and mode, check the result against a float64
  ``index_add`` reference first (a wrong implementation is marked ``FAILED`` and not timed), then time it
  (warm-up, median of repeats) and derive the speed-up against ``index_add`` and the achieved bandwidth
  against the floor bytes (every input read once, every output written once);
* :func:`format_table`, :func:`write_results`: the printed table, the JSON file and a PNG chart;
* :func:`run_check`: the installed kernels against float64 references (forward, gradients including ``C``
  and a double backward), one :class:`CheckResult` per implementation and device.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import platform
import statistics
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import torch

from . import backends
from .api import accumulate
from .kernels import reference
from .modules import get_cg_transformation_rule

__all__ = [
    "Case", "CheckResult", "DTYPES", "MODES", "IMPLEMENTATIONS", "DEFAULT_RULES", "QUICK_RULES",
    "standard_cases", "default_implementations", "run_benchmark", "format_table", "write_results", "write_png",
    "run_check", "format_check", "ProgressBar", "floor_bytes",
]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
#: Benchmark modes: ``forward`` times ``out = op(X1, X2, C)``; ``backward`` times the forward and the
#: backward of ``sum(out * G)`` with respect to X1 and X2 (and C with ``grad_c=True``).
MODES = ("forward", "backward")
_MODE_ALIASES = {"forward": "forward", "fwd": "forward", "backward": "backward", "bwd": "backward",
                 "fwd+bwd": "backward", "forward+backward": "backward"}
#: Names accepted by :func:`run_benchmark`: the kernels, the references and ``e3nn`` (e3nn's ``uuu``
#: TensorProduct, in its own basis, when e3nn is installed).
IMPLEMENTATIONS = backends.KERNELS + backends.REFERENCES + ("e3nn",)
BASELINE = "index_add"
DEFAULT_RULES = ((8, 8, 8), (4, 4, 4), (2, 2, 2), (3, 2, 4), (1, 1, 2))
QUICK_RULES = ((8, 8, 8), (2, 2, 2))
DEFAULT_ROWS = {"cpu": (1000, 200), "cuda": (1000, 2000)}
QUICK_ROWS = (100, 50)
_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
_LOOPS_MAX_WORK = 2_000_000  # rows * nnz above which the Python-loop reference is skipped


@dataclass(frozen=True)
class Case:
    """One benchmark case: the real CG rule ``l1 x l2 -> L`` on ``[A, B, 2l + 1]`` inputs."""

    l1: int
    l2: int
    L: int
    rows: tuple = (1000, 200)
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    @property
    def rule_name(self) -> str:
        return f"{self.l1}x{self.l2}->{self.L}"

    @property
    def sizes(self) -> tuple:
        return 2 * self.l1 + 1, 2 * self.l2 + 1, 2 * self.L + 1

    @property
    def n_rows(self) -> int:
        return math.prod(self.rows)


def available_devices() -> list:
    """``["cpu"]`` plus ``"cuda"`` when a CUDA device is usable."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def default_implementations(device: str) -> tuple:
    """The implementations :func:`run_benchmark` times by default on ``device``."""
    if torch.device(device).type == "cuda":
        return ("triton", "torch", "index_add", "dense", "sparse", "e3nn")
    return ("numba", "torch", "index_add", "dense", "sparse")


def standard_cases(quick: bool = False, devices: Optional[Sequence[str]] = None, rules=None, rows=None,
                   dtypes: Sequence[torch.dtype] = (torch.float32,)) -> list:
    """The standard set: :data:`DEFAULT_RULES` (or :data:`QUICK_RULES`) on every device and dtype.

    Rows default to 1000 x 200 on CPU and 1000 x 2000 on CUDA (100 x 20 with ``quick``).
    """
    devices = available_devices() if devices is None else list(devices)
    rules = (QUICK_RULES if quick else DEFAULT_RULES) if rules is None else rules
    cases = []
    for device in devices:
        device_rows = rows or (QUICK_ROWS if quick else DEFAULT_ROWS[torch.device(device).type])
        for dtype in dtypes:
            cases += [Case(l1, l2, L, tuple(device_rows), dtype, device) for l1, l2, L in rules]
    return cases


def normalize_modes(modes: Iterable[str]) -> tuple:
    """Map mode names and aliases (``fwd``, ``bwd``, ``fwd+bwd``) to :data:`MODES` entries."""
    result = []
    for mode in modes:
        if mode not in _MODE_ALIASES:
            raise ValueError(f"unknown mode {mode!r}; use forward or backward")
        if _MODE_ALIASES[mode] not in result:
            result.append(_MODE_ALIASES[mode])
    return tuple(result)


def floor_bytes(case: Case, mode: str, grad_c: bool = False) -> int:
    """Bytes a perfect implementation moves: every input read once and every output written once.

    ``forward`` reads X1, X2 (and the rule) and writes the output; ``backward`` adds reading G, X1 and X2
    and writing dX1 and dX2 (and dC).
    """
    M1, M2, O = case.sizes
    elt = torch.empty(0, dtype=case.dtype).element_size()
    nnz = len(get_cg_transformation_rule(case.l1, case.l2, case.L)[3])
    rule_bytes = nnz * (elt + 3 * 8)
    total = case.n_rows * (M1 + M2 + O) * elt + rule_bytes
    if mode == "backward":
        total += case.n_rows * (O + M1 + M2 + M1 + M2) * elt + rule_bytes + (nnz * elt if grad_c else 0)
    return total


# --------------------------------------------------------------------------------------------------------
# progress


class ProgressBar:
    """A one-line text progress bar: ``bar(done, total, text)`` redraws it (on stderr by default)."""

    def __init__(self, stream=None, width: int = 24):
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self._length = 0

    def __call__(self, done: int, total: int, text: str = "") -> None:
        fraction = done / total if total else 1.0
        filled = int(round(fraction * self.width))
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {text}"[:100]
        self.stream.write("\r" + line.ljust(self._length))
        self._length = len(line)
        if done >= total:
            self.stream.write("\n")
            self._length = 0
        self.stream.flush()


# --------------------------------------------------------------------------------------------------------
# implementations


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(error).lower()


def _memory_limit(device: torch.device) -> float:
    """Bytes an intermediate may take before a memory-hungry reference is skipped."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 2
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 4
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def _unavailable_reason(name: str, case: Case, mode: str, nnz: int) -> Optional[str]:
    """Why ``name`` is skipped for this case (``None`` when it runs)."""
    device = torch.device(case.device)
    if name in backends.KERNELS:
        return None if backends.is_available(name, device) else f"not available on {device.type}"
    if name == "e3nn":
        try:
            importlib.import_module("e3nn.o3")
        except Exception as error:
            return f"e3nn not importable ({type(error).__name__})"
        return None
    M1, M2, O = case.sizes
    elt = torch.empty(0, dtype=case.dtype).element_size()
    factor = 3 if mode == "backward" else 1
    if name == "loops" and case.n_rows * nnz > _LOOPS_MAX_WORK:
        return "too large for the loop reference"
    work = {"loops": case.n_rows * O, "index_add": 3 * case.n_rows * nnz,
            "dense": 2 * case.n_rows * M1 * M2, "sparse": 3 * case.n_rows * M1 * M2}[name]
    if work * elt * factor > _memory_limit(device):
        return "intermediate too large for memory"
    return None


def _rule(case: Case, basis: str = "real"):
    m1, m2, mu, C = get_cg_transformation_rule(case.l1, case.l2, case.L, dtype=torch.float64,
                                               device=case.device, basis=basis)
    if basis == "e3nn":  # e3nn's TensorProduct with normalization "none" is wigner_3j = C / sqrt(2L + 1)
        C = C / math.sqrt(2 * case.L + 1)
    return m1, m2, mu, C


def _forward_function(name: str, case: Case, rule) -> Callable:
    """``f(X1 [A, B, M1], X2 [A, B, M2], C) -> [A, B, O]`` for an implementation name."""
    m1, m2, mu, _ = rule
    O = case.sizes[2]
    if name in backends.KERNELS:
        return lambda X1, X2, C: accumulate(X1, X2, mu, O, m1, m2, C, implementation=name)
    if name == "e3nn":
        from e3nn import o3

        A, B = case.rows
        tp = o3.TensorProduct(f"{B}x{case.l1}e", f"{B}x{case.l2}e", f"{B}x{case.L}e",
                              [(0, 0, 0, "uuu", False)], irrep_normalization="none",
                              path_normalization="none").to(device=case.device, dtype=case.dtype)
        return lambda X1, X2, C: tp(X1.reshape(A, -1), X2.reshape(A, -1)).reshape(A, B, O)
    function = reference.BY_NAME[name]
    return lambda X1, X2, C: function(X1, X2, mu, O, m1, m2, C)


def _timed_function(forward: Callable, mode: str, grad_c: bool, C_grad: bool = True) -> Callable:
    """``f(X1, X2, C, G)``: the forward, or the forward and the gradients of ``sum(out * G)``."""
    if mode == "forward":
        return lambda X1, X2, C, G: forward(X1, X2, C)

    def forward_backward(X1, X2, C, G):
        X1 = X1.detach().requires_grad_(True)
        X2 = X2.detach().requires_grad_(True)
        inputs = (X1, X2)
        if grad_c and C_grad:
            C = C.detach().requires_grad_(True)
            inputs = inputs + (C,)
        return torch.autograd.grad(forward(X1, X2, C), inputs, G)

    return forward_backward


# --------------------------------------------------------------------------------------------------------
# checking against the float64 reference


def _check_rows(n_rows: int, check_rows: int, device) -> torch.Tensor:
    if check_rows <= 0 or check_rows >= n_rows:
        return torch.arange(n_rows, device=device)
    return torch.linspace(0, n_rows - 1, check_rows, device=device).round().long().unique()


def _reference_dC(X1, X2, G, rule) -> torch.Tensor:
    """``dC[k] = sum_r G[r, mu[k]] X1[r, m1[k]] X2[r, m2[k]]`` in float64, over chunks of rows."""
    m1, m2, mu, C = rule
    step = max(1, (1 << 22) // max(1, len(C)))
    total = torch.zeros(len(C), dtype=torch.float64, device=C.device)
    for start in range(0, X1.shape[0], step):
        rows = slice(start, start + step)
        total += (G[rows].double()[:, mu] * X1[rows].double()[:, m1] * X2[rows].double()[:, m2]).sum(0)
    return total


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if expected.numel() == 0:
        return 0.0 if actual.shape == expected.shape else math.inf
    if actual.shape != expected.shape:
        raise ValueError(f"shape {tuple(actual.shape)} instead of {tuple(expected.shape)}")
    difference = float((actual.double() - expected).abs().max())
    if math.isnan(difference):
        return math.inf
    return difference / max(float(expected.abs().max()), 1e-30)


def _check_result(result, mode: str, X1, X2, G, rule, case: Case, grad_c: bool, check_rows: int) -> tuple:
    """``(max relative error, worst quantity)`` of a forward output or gradient tuple vs float64 index_add."""
    m1, m2, mu, C = rule
    M1, M2, O = case.sizes
    R = case.n_rows
    flat = [t.reshape(R, -1) for t in (X1, X2, G)]
    index = _check_rows(R, check_rows, X1.device)
    x1, x2, g = (t[index].double() for t in flat)
    if mode == "forward":
        expected = {"out": reference.index_add(x1, x2, mu, O, m1, m2, C)}
        actual = {"out": result.reshape(R, O)[index]}
    else:
        x1.requires_grad_(True)
        x2.requires_grad_(True)
        d1, d2 = torch.autograd.grad(reference.index_add(x1, x2, mu, O, m1, m2, C), (x1, x2), g)
        expected = {"dX1": d1, "dX2": d2}
        actual = {"dX1": result[0].reshape(R, M1)[index], "dX2": result[1].reshape(R, M2)[index]}
        if grad_c and len(result) > 2:
            expected["dC"] = _reference_dC(*flat[:2], flat[2], rule)
            actual["dC"] = result[2]
    errors = {key: _relative_error(actual[key], expected[key]) for key in expected}
    worst = max(errors, key=lambda key: errors[key] / (10 if key == "dC" else 1))
    return errors[worst], worst


def _tolerance(dtype: torch.dtype, quantity: str) -> float:
    return _TOLERANCE[dtype] * (10 if quantity == "dC" else 1)


# --------------------------------------------------------------------------------------------------------
# timing


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn: Callable, device: torch.device, warmup: int, repeats: int, max_seconds: float) -> list:
    """Milliseconds of each of up to ``repeats`` calls after ``warmup`` calls (at least one call timed)."""
    for _ in range(warmup):
        fn()
    _synchronize(device)
    times = []
    start_all = time.perf_counter()
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        if time.perf_counter() - start_all > max_seconds:
            break
    return times


def _inputs(case: Case, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    A, B = case.rows
    M1, M2, O = case.sizes
    make = lambda M: torch.randn(A, B, M, generator=generator, dtype=torch.float32).to(case.device, case.dtype)
    return make(M1), make(M2), make(O)


def run_benchmark(cases: Sequence[Case], implementations: Optional[Sequence[str]] = None,
                  modes: Sequence[str] = MODES, repeats: int = 5, warmup: int = 1, grad_c: bool = False,
                  check_rows: int = 2048, max_seconds: float = 10.0, progress: Optional[Callable] = None
                  ) -> list:
    """Check, then time, every implementation on every case in every mode.

    Args:
        cases: what to measure (see :func:`standard_cases`).
        implementations: names from :data:`IMPLEMENTATIONS` (default: :func:`default_implementations` of
            each case's device). ``index_add``, the baseline of the speed-up column, is always added.
        modes: ``"forward"`` and/or ``"backward"`` (forward and backward of ``sum(out * G)``).
        repeats: timed calls per measurement (the median is reported); a measurement stops early once it
            has run ``max_seconds``.
        warmup: untimed calls before timing (after the correctness check, which is a call too).
        grad_c: also differentiate with respect to the coefficients ``C`` in ``backward``.
        check_rows: rows of the result compared with float64 ``index_add`` (spread over all rows;
            ``0`` compares all rows).
        progress: ``progress(done, total, text)`` callback, e.g. a :class:`ProgressBar`.

    Returns:
        One dict per (case, implementation, mode) with ``status`` ``"ok"``, ``"FAILED"`` (wrong result or an
        error: never timed) or ``"skipped"`` (unavailable or too large: ``note`` says why), and
        ``median_ms``, ``times_ms``, ``error`` (max relative error), ``speedup`` (index_add time / time),
        ``floor_bytes`` and ``GBps`` (floor bytes / median time).
    """
    modes = normalize_modes(modes)
    plan = []
    for case in cases:
        names = list(implementations or default_implementations(case.device))
        for name in names:
            if name not in IMPLEMENTATIONS:
                raise ValueError(f"unknown implementation {name!r}; choose from {', '.join(IMPLEMENTATIONS)}")
        if BASELINE not in names:
            names.append(BASELINE)
        names.sort(key=lambda n: n != BASELINE)  # the baseline first
        plan += [(case, name, mode) for mode in modes for name in names]

    results, inputs, rules, forwards = [], {}, {}, {}
    for step, (case, name, mode) in enumerate(plan):
        if progress is not None:
            progress(step, len(plan), f"{case.rule_name} {case.device} {name} {mode}")
        if case not in inputs:  # free the previous case's tensors first
            inputs.clear(), rules.clear(), forwards.clear()
            inputs[case] = _inputs(case)
        results.append(_run_one(case, name, mode, inputs[case], rules, forwards, repeats, warmup, grad_c,
                                check_rows, max_seconds))
    if progress is not None:
        progress(len(plan), len(plan), "done")
    baseline = {(r["rule"], tuple(r["rows"]), r["dtype"], r["device"], r["mode"]): r["median_ms"]
                for r in results if r["implementation"] == BASELINE and r["status"] == "ok"}
    for r in results:
        reference_ms = baseline.get((r["rule"], tuple(r["rows"]), r["dtype"], r["device"], r["mode"]))
        r["speedup"] = reference_ms / r["median_ms"] if reference_ms and r["median_ms"] else None
    return results


def _run_one(case, name, mode, tensors, rules, forwards, repeats, warmup, grad_c, check_rows, max_seconds):
    device = torch.device(case.device)
    basis = "e3nn" if name == "e3nn" else "real"
    if basis not in rules:
        rules[basis] = _rule(case, basis)
    rule = rules[basis]
    nnz = len(rule[3])
    record = {"rule": case.rule_name, "l": [case.l1, case.l2, case.L], "nnz": nnz, "rows": list(case.rows),
              "dtype": str(case.dtype).replace("torch.", ""), "device": case.device, "implementation": name,
              "mode": mode, "status": "ok", "note": "", "error": None, "median_ms": None, "times_ms": [],
              "floor_bytes": floor_bytes(case, mode, grad_c), "GBps": None, "speedup": None}
    reason = _unavailable_reason(name, case, mode, nnz)
    if reason is not None:
        record.update(status="skipped", note=reason)
        return record
    X1, X2, G = tensors
    C = rule[3].to(case.dtype)
    try:
        if name not in forwards:
            forwards[name] = _forward_function(name, case, rule)
        fn = _timed_function(forwards[name], mode, grad_c, C_grad=name != "e3nn")
        if name == "e3nn" and grad_c and mode == "backward":
            record["note"] = "no dC (e3nn has no coefficient input)"
        result = fn(X1, X2, C, G)
        _synchronize(device)
        error, quantity = _check_result(result, mode, X1, X2, G, rule, case, grad_c, check_rows)
        del result
        record["error"] = error
        if not error <= _tolerance(case.dtype, quantity):
            record.update(status="FAILED", note=f"wrong {quantity}: max relative error {error:.2e} > "
                                                f"{_tolerance(case.dtype, quantity):.0e}")
            return record
        times = _time_ms(lambda: fn(X1, X2, C, G), device, warmup, repeats, max_seconds)
    except Exception as error:  # noqa: BLE001 - every failure is reported, none is fatal
        if _is_oom(error):
            record.update(status="skipped", note="out of memory")
        else:
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            record.update(status="FAILED", note=f"{type(error).__name__}: {message}"[:200])
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return record
    median = statistics.median(times)
    record.update(median_ms=median, times_ms=times, GBps=record["floor_bytes"] / (median * 1e-3) / 1e9)
    return record


# --------------------------------------------------------------------------------------------------------
# output


def _format_ms(ms: Optional[float]) -> str:
    if ms is None:
        return "-"
    return f"{ms:.3f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


def format_table(results: Sequence[dict]) -> str:
    """The results as an aligned text table, one line per measurement."""
    head = ["rule", "rows", "dtype", "device", "implementation", "mode", "median ms", "vs index_add",
            "GB/s", "floor MB", "max rel err", "status"]
    lines = []
    for r in results:
        status = r["status"] + (f" ({r['note']})" if r["note"] else "")
        lines.append([r["rule"], "x".join(map(str, r["rows"])), r["dtype"], r["device"], r["implementation"],
                      "fwd" if r["mode"] == "forward" else "fwd+bwd", _format_ms(r["median_ms"]),
                      "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                      "-" if r["GBps"] is None else f"{r['GBps']:.2f}", f"{r['floor_bytes'] / 1e6:.2f}",
                      "-" if r["error"] is None else f"{r['error']:.1e}", status])
    widths = [max(len(row[i]) for row in [head] + lines) for i in range(len(head) - 1)]
    right = {6, 7, 8, 9, 10}

    def join(row):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells + [row[-1]]).rstrip()

    return "\n".join([join(head), join(["-" * w for w in widths] + ["------"])] + [join(row) for row in lines])


def environment() -> dict:
    """Versions and hardware of this process, stored with the results."""
    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu_threads": torch.get_num_threads()}
    for module in ("numba", "triton", "e3nn"):
        try:
            info[module] = importlib.import_module(module).__version__
        except Exception:  # noqa: BLE001 - not installed or broken: reported as missing
            info[module] = None
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name()
    return info


def write_results(results: Sequence[dict], directory, command: str = "") -> dict:
    """Write ``bench.json`` and a bar chart ``bench.png`` (speed-up vs index_add) into ``directory``.

    Returns:
        ``{"json": path, "png": path or None}`` (no PNG when no measurement has a speed-up).
    """
    os.makedirs(directory, exist_ok=True)
    json_path = os.path.join(directory, "bench.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump({"command": command, "environment": environment(), "results": list(results)}, f, indent=1)
    bars = [r for r in results if r["speedup"] is not None and r["implementation"] != BASELINE]
    png_path = None
    if bars:
        png_path = os.path.join(directory, "bench.png")
        write_png(png_path, bars)
    return {"json": json_path, "png": png_path}


# --------------------------------------------------------------------------------------------------------
# a small PNG bar chart without plotting libraries

# 3 x 5 pixel glyphs, one 3-bit row per entry, most significant bit on the left.
_GLYPHS = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 3, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 2, 2, 2),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), "A": (2, 5, 7, 5, 5), "B": (6, 5, 6, 5, 6),
    "C": (3, 4, 4, 4, 3), "D": (6, 5, 5, 5, 6), "E": (7, 4, 6, 4, 7), "F": (7, 4, 6, 4, 4),
    "G": (3, 4, 5, 5, 3), "H": (5, 5, 7, 5, 5), "I": (7, 2, 2, 2, 7), "J": (1, 1, 1, 5, 2),
    "K": (5, 5, 6, 5, 5), "L": (4, 4, 4, 4, 7), "M": (5, 7, 7, 5, 5), "N": (6, 5, 5, 5, 5),
    "O": (2, 5, 5, 5, 2), "P": (6, 5, 6, 4, 4), "Q": (2, 5, 5, 6, 3), "R": (6, 5, 6, 5, 5),
    "S": (3, 4, 2, 1, 6), "T": (7, 2, 2, 2, 2), "U": (5, 5, 5, 5, 7), "V": (5, 5, 5, 5, 2),
    "W": (5, 5, 7, 7, 5), "X": (5, 5, 2, 5, 5), "Y": (5, 5, 2, 2, 2), "Z": (7, 1, 2, 4, 7),
    "-": (0, 0, 7, 0, 0), ">": (4, 2, 1, 2, 4), ".": (0, 0, 0, 0, 2), "+": (0, 2, 7, 2, 0),
    "/": (1, 1, 2, 4, 4), "_": (0, 0, 0, 0, 7), ":": (0, 2, 0, 2, 0), " ": (0, 0, 0, 0, 0),
    "(": (1, 2, 2, 2, 1), ")": (4, 2, 2, 2, 4),
}
_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127)]


class _Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (3 * width * height))

    def rect(self, x0, y0, x1, y1, color):
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        row = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = 3 * (y * self.width + x0)
            self.pixels[start:start + len(row)] = row

    def text(self, x, y, text, color=(0, 0, 0), scale=2):
        for char in text.upper():
            for dy, bits in enumerate(_GLYPHS.get(char, _GLYPHS[" "])):
                for dx in range(3):
                    if bits & (4 >> dx):
                        self.rect(x + dx * scale, y + dy * scale, x + (dx + 1) * scale, y + (dy + 1) * scale,
                                  color)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width])
                       for y in range(self.height))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
                + chunk(b"IEND", b""))


def write_png(path, results: Sequence[dict]) -> None:
    """A horizontal bar chart of the speed-up against index_add (log scale, the line at 1x), as a PNG."""
    label_width, plot_width, bar, margin = 360, 480, 14, 10
    labels = [f"{r['rule']} {r['device']} {r['dtype']} {'fwd' if r['mode'] == 'forward' else 'fwd+bwd'} "
              f"{r['implementation']}" for r in results]
    logs = [math.log10(r["speedup"]) for r in results]
    low, high = min(0.0, min(logs)), max(0.0, max(logs))
    low, high = math.floor(low) if low < 0 else 0.0, max(1.0, math.ceil(high))
    height = 2 * margin + 40 + len(results) * (bar + 4)
    canvas = _Canvas(label_width + plot_width + 2 * margin + 80, height)
    canvas.text(margin, margin, "SPEED-UP VS INDEX_ADD (LOG SCALE)", scale=2)

    def x_of(value):
        return label_width + margin + int(round((value - low) / (high - low) * plot_width))

    top = margin + 30
    for decade in range(int(low), int(high) + 1):  # grid lines and their labels
        x = x_of(decade)
        canvas.rect(x, top - 4, x + 1, height - margin, (200, 200, 200) if decade else (0, 0, 0))
        label = f"{10.0 ** decade:g}X"
        canvas.text(x - 4 * len(label), top - 14, label)
    names = sorted({r["implementation"] for r in results})
    for i, (r, label, value) in enumerate(zip(results, labels, logs)):
        y = top + i * (bar + 4)
        canvas.text(margin, y + 2, label[:44])
        color = _COLORS[names.index(r["implementation"]) % len(_COLORS)]
        canvas.rect(x_of(0.0), y, x_of(value), y + bar, color)
        canvas.text(max(x_of(0.0), x_of(value)) + 4, y + 2, f"{r['speedup']:.3g}X")
    with open(path, "wb") as f:
        f.write(canvas.png())


# --------------------------------------------------------------------------------------------------------
# self-test


@dataclass
class CheckResult:
    """Outcome of :func:`run_check` for one implementation on one device."""

    implementation: str
    device: str
    status: str  # "OK", "FAILED" or "skipped"
    detail: str = ""
    max_error: float = 0.0
    checks: int = 0
    failures: list = field(default_factory=list)


def _check_rules(generator: torch.Generator):
    """Real CG rules and one random rule with unsorted, repeated output indices."""
    rules = [("real 1x1->2", get_cg_transformation_rule(1, 1, 2, dtype=torch.float64)),
             ("real 2x1->2", get_cg_transformation_rule(2, 1, 2, dtype=torch.float64)),
             ("real 3x2->4", get_cg_transformation_rule(3, 2, 4, dtype=torch.float64)),
             ("e3nn 4x4->4", get_cg_transformation_rule(4, 4, 4, dtype=torch.float64, basis="e3nn"))]
    nnz, sizes = 23, (4, 6, 5)
    random = tuple(torch.randint(0, size, (nnz,), generator=generator) for size in sizes)
    rules.append(("random unsorted", random + (torch.randn(nnz, generator=generator, dtype=torch.float64),)))
    return rules


def _kernel_reason(name: str, device: torch.device) -> tuple:
    """``(status, detail)`` for an implementation that is not available: skipped or FAILED (broken install)."""
    expected_here = (name == "numba" and device.type == "cpu") or (name == "triton" and device.type == "cuda")
    if not expected_here:
        needs = {"numba": "a CPU device", "triton": "a CUDA device (or TRITON_INTERPRET=1 on CPU)"}[name]
        return "skipped", f"needs {needs}"
    try:
        importlib.import_module(backends._KERNEL_MODULES[name])
    except Exception as error:  # noqa: BLE001 - the point is to report it
        return "FAILED", f"cannot import the {name} kernels: {type(error).__name__}: {error}"
    return "FAILED", f"{name} reports itself unavailable on {device.type}"


def _check_one(name: str, device: torch.device, generator: torch.Generator, rows=(7, 19)) -> CheckResult:
    """Forward, gradients (X1, X2, C) and a double backward of ``name`` against float64 index_add."""
    result = CheckResult(name, device.type, "OK")
    dtypes = (torch.float64, torch.float32, torch.bfloat16)
    if name == "triton" and device.type == "cpu":
        dtypes, rows = (torch.float32,), (2, 5)  # the interpreter is slow
    for rule_name, (m1, m2, mu, C64) in _check_rules(generator):
        M1, M2, O = int(m1.max()) + 1, int(m2.max()) + 1, int(mu.max()) + 1
        if rule_name.startswith("random"):
            M1, M2, O = M1 + 1, M2 + 1, O + 1  # unused components at the end
        m1, m2, mu, C64 = (t.to(device) for t in (m1, m2, mu, C64))
        X1 = torch.randn(*rows, M1, generator=generator, dtype=torch.float64).to(device)
        X2 = torch.randn(*rows, M2, generator=generator, dtype=torch.float64).to(device)
        G = torch.randn(*rows, O, generator=generator, dtype=torch.float64).to(device)
        H1, H2 = torch.randn_like(X1), torch.randn_like(X2)
        for dtype in dtypes:
            label = f"{rule_name} {str(dtype).replace('torch.', '')}"
            try:
                inputs = [t.to(dtype).requires_grad_(True) for t in (X1, X2, C64)]
                # the reference sees exactly the rounded inputs, in float64
                reference_inputs = [t.detach().double().requires_grad_(True) for t in inputs]
                double = dtype == torch.float64
                got = _derivatives(lambda a, b, c: accumulate(a, b, mu, O, m1, m2, c, implementation=name),
                                   inputs, G.to(dtype), H1.to(dtype), H2.to(dtype), double)
                want = _derivatives(lambda a, b, c: reference.index_add(a, b, mu, O, m1, m2, c),
                                    reference_inputs, G.double(), H1, H2, double)
                for quantity, actual in got.items():
                    error = _relative_error(actual, want[quantity])
                    result.checks += 1
                    result.max_error = max(result.max_error, error)
                    tolerance = _TOLERANCE[dtype] * (10 if dtype in (torch.float16, torch.bfloat16) else 1)
                    if not error <= tolerance:
                        result.failures.append(f"{label} {quantity}: max relative error {error:.1e}")
            except Exception as error:  # noqa: BLE001 - reported, not raised
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                result.failures.append(f"{label}: {type(error).__name__}: {message}"[:300])
    if result.failures:
        result.status = "FAILED"
        result.detail = f"{len(result.failures)} problem(s); first: {result.failures[0]}"
    else:
        names = ", ".join(str(t).replace("torch.", "") for t in dtypes)
        double = "; double backward in float64" if torch.float64 in dtypes else ""
        result.detail = (f"{result.checks} checks (forward, dX1, dX2, dC{double}; {names}), "
                         f"max rel err {result.max_error:.1e}")
    return result


def _derivatives(fn, inputs, G, H1, H2, double: bool) -> dict:
    """The output, its gradients for ``G`` and (with ``double``) the gradients of ``<dX1, H1> + <dX2, H2>``."""
    out = fn(*inputs)
    d1, d2, dC = torch.autograd.grad(out, inputs, G, create_graph=double)
    values = {"forward": out.detach(), "dX1": d1.detach(), "dX2": d2.detach(), "dC": dC.detach()}
    if double:
        gg = torch.autograd.grad((d1 * H1).sum() + (d2 * H2).sum(), inputs, allow_unused=True)
        for key, value, like in zip(("ddX1", "ddX2", "ddC"), gg, inputs):
            values[key] = torch.zeros_like(like) if value is None else value.detach()
    return values


def run_check(implementations: Optional[Sequence[str]] = None, devices: Optional[Sequence[str]] = None,
              seed: int = 0, progress: Optional[Callable] = None) -> list:
    """Check every kernel implementation on every device against float64 references.

    Each available (implementation, device) pair runs real and random rules in float64, float32 and
    bfloat16: forward, gradients with respect to X1, X2 and C, and (in float64) a double backward, through
    the public :func:`~sparse_accumulation.accumulate`. A kernel that should work on a device but cannot be
    imported (a broken numba install, Triton on a CUDA machine) is ``FAILED``, not skipped.

    Returns:
        One :class:`CheckResult` per (implementation, device).
    """
    implementations = list(implementations or backends.KERNELS)
    devices = available_devices() if devices is None else list(devices)
    generator = torch.Generator().manual_seed(seed)
    pairs = [(name, torch.device(device)) for device in devices for name in implementations]
    results = []
    for step, (name, device) in enumerate(pairs):
        if progress is not None:
            progress(step, len(pairs), f"{name} {device.type}")
        if name in backends.KERNELS and not backends.is_available(name, device):
            status, detail = _kernel_reason(name, device)
            results.append(CheckResult(name, device.type, status, detail))
            continue
        results.append(_check_one(name, device, generator))
    if progress is not None:
        progress(len(pairs), len(pairs), "done")
    return results


def format_check(results: Sequence[CheckResult]) -> str:
    """One line per implementation and device, then what ``"auto"`` picks on each device."""
    width = max([len(r.implementation) for r in results] + [4])
    lines = [f"{r.implementation.ljust(width)}  {r.device.ljust(4)}  {r.status.ljust(7)}  {r.detail}".rstrip()
             for r in results]
    for device in sorted({r.device for r in results}):
        preferred = "triton" if device == "cuda" else "numba" if device == "cpu" else "torch"
        picked = preferred if backends.is_available(preferred, device) else \
            f"torch (fallback: {preferred} is not available)"
        lines.append(f"{'auto'.ljust(width)}  {device.ljust(4)}  ->       {picked}")
    return "\n".join(lines)
