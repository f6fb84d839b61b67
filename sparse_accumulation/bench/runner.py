"""``run_benchmark``: check every implementation against the float64 reference, then time it."""
from __future__ import annotations

import statistics
from typing import Optional, Sequence

import torch

from .cases import BASELINE, FLOOR, IMPLEMENTATIONS, MODES, Case, default_implementations, floor_bytes, \
    normalize_modes
from .checking import check_result, tolerance
from .implementations import forward_function, is_out_of_memory, rule, unavailable_reason
from .progress import progress_bar
from .timing import EAGER_TIMINGS, compile_forward, copy_bandwidth, make_step, measure, normalize_timings, \
    synchronize, timing_unavailable, unit, waits_for_compiles

__all__ = ["run_benchmark"]


def _inputs(case: Case, seed: int = 0) -> tuple:
    """Random ``X1 [A, B, M1]``, ``X2 [A, B, M2]``, ``G [A, B, O]`` and the floor's two ``[A, B, O]`` inputs."""
    generator = torch.Generator().manual_seed(seed)
    A, B = case.rows
    M1, M2, O = case.sizes

    def make(M):
        return torch.randn(A, B, M, generator=generator, dtype=torch.float32).to(case.device, case.dtype)

    return make(M1), make(M2), make(O), make(O), make(O)


def _error_note(error: BaseException) -> str:
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}"[:200]


@waits_for_compiles
def run_benchmark(cases: Sequence[Case], implementations: Optional[Sequence[str]] = None,
                  modes: Sequence[str] = MODES, timings: Sequence[str] = EAGER_TIMINGS, repeats: int = 5,
                  warmup: int = 1, grad_c: bool = False, check_rows: int = 2048, max_seconds: float = 10.0,
                  progress=False) -> list:
    """Check, then time, every implementation on every case in every mode.

    Args:
        cases: what to measure (see :func:`~sparse_accumulation.bench.standard_cases`).
        implementations: names from :data:`~sparse_accumulation.bench.IMPLEMENTATIONS` (default:
            :func:`~sparse_accumulation.bench.default_implementations` of each case's device). ``index_add``,
            the baseline of the speed-up column, is always added.
        modes: ``"forward"`` and/or ``"backward"`` (forward and backward of ``sum(out * G)``).
        timings: names from :data:`~sparse_accumulation.bench.TIMINGS` (see
            :mod:`sparse_accumulation.bench.timing`); ``reduce-overhead`` is skipped on the CPU.
        repeats: samples per timing (the median is reported); a timing stops sampling once it has run
            ``max_seconds``.
        warmup: untimed steps before each timing (after the correctness check, which is a call too).
        grad_c: also differentiate with respect to the coefficients ``C`` in ``backward``.
        check_rows: rows of the result compared with float64 ``index_add`` (spread over all rows;
            ``0`` compares all rows).
        progress: ``True`` for a progress bar on stderr, or a text stream to draw it on; it is hidden when
            the stream is not a terminal.

    Returns:
        One dict per (case, implementation, mode), whose ``status`` is ``"ok"``; ``"FAILED"`` when the eager or a
        compiled result is wrong, or the eager call raises (never timed then); ``"skipped"`` when the
        implementation cannot run here (``note`` says why). ``timings`` maps each timing to
        ``{"status", "note", "median", "samples", "unit"}``: a timing that raises (a compile error) is
        ``"FAILED"`` there with the reason, while the row stays ``"ok"``. ``median_ms``, ``speedup``
        (index_add's time / time) and ``GBps`` (floor bytes / time) use the first timing measured
        (``primary``); ``floor_bytes`` and ``floor_ms`` (floor bytes / the device's copy bandwidth
        ``copy_GBps``) give the floor; ``error`` is the max relative error of the check.
    """
    modes = normalize_modes(modes)
    timings = normalize_timings(timings)
    plan = []
    for case in cases:
        names = list(implementations or default_implementations(case.device))
        for name in names:
            if name not in IMPLEMENTATIONS:
                raise ValueError(f"unknown implementation {name!r}; choose from {', '.join(IMPLEMENTATIONS)}")
        if BASELINE not in names:
            names.append(BASELINE)
        names.sort(key=lambda n: (n != BASELINE, n == FLOOR))  # the baseline first, the floor last
        plan += [(case, name, mode) for mode in modes for name in names]

    bandwidth = {device: copy_bandwidth(device) for device in sorted({case.device for case in cases})}
    results, tensors = [], {}
    with progress_bar(len(plan), "bench", progress) as bar:
        for case, name, mode in plan:
            bar.set_postfix_str(f"{case.rule_name} {case.device} {name} {mode}", refresh=False)
            if case not in tensors:  # free the previous case's tensors first
                tensors.clear()
                tensors[case] = {"inputs": _inputs(case), "rules": {}, "forwards": {}}
            results.append(_run_one(case, name, mode, tensors[case], timings, repeats, warmup, grad_c,
                                    check_rows, max_seconds, bandwidth[case.device]))
            bar.update()
    _add_speedups(results)
    return results


def _add_speedups(results: list) -> None:
    def key(r):
        return r["rule"], tuple(r["rows"]), r["dtype"], r["device"], r["mode"]

    baseline = {key(r): r for r in results if r["implementation"] == BASELINE and r["status"] == "ok"}
    for r in results:
        base = baseline.get(key(r))
        r["speedup"], r["speedup_range"] = None, None
        if base is None or r["primary"] is None or r["implementation"] == FLOOR:
            continue
        reference_timing = base["timings"].get(r["primary"], {})
        if reference_timing.get("status") == "ok":
            ours = r["timings"][r["primary"]]
            r["speedup"] = reference_timing["median"] / ours["median"]
            r["speedup_range"] = _ratio_range(reference_timing["samples"], ours["samples"])


def _quantile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ratio_range(reference: Sequence[float], ours: Sequence[float]) -> list:
    """``[low, high]`` of the speed-up over the repeats: the reference's 20% quantile over ours' 80% one, and
    the reverse (the spread of both timings shows in it)."""
    return [_quantile(reference, 0.2) / _quantile(ours, 0.8), _quantile(reference, 0.8) / _quantile(ours, 0.2)]


def _new_record(case: Case, name: str, mode: str, nnz: int, grad_c: bool, bandwidth: float) -> dict:
    floor = floor_bytes(case, mode, grad_c)
    return {"rule": case.rule_name, "l": [case.l1, case.l2, case.L], "nnz": nnz, "rows": list(case.rows),
            "dtype": str(case.dtype).replace("torch.", ""), "device": case.device, "implementation": name,
            "mode": mode, "status": "ok", "note": "", "error": None, "timings": {}, "primary": None,
            "median_ms": None, "times_ms": [], "floor_bytes": floor, "copy_GBps": bandwidth / 1e9,
            "floor_ms": floor / bandwidth * 1e3, "GBps": None, "speedup": None, "speedup_range": None}


def _run_one(case, name, mode, state, timings, repeats, warmup, grad_c, check_rows, max_seconds, bandwidth):
    device = torch.device(case.device)
    basis = "e3nn" if name == "e3nn" else "real"
    if basis not in state["rules"]:
        state["rules"][basis] = rule(case, basis)
    case_rule = state["rules"][basis]
    record = _new_record(case, name, mode, len(case_rule[3]), grad_c, bandwidth)
    reason = unavailable_reason(name, case, mode, record["nnz"])
    if reason is not None:
        record.update(status="skipped", note=reason)
        return record
    X1, X2, G, A, B = state["inputs"]
    if name == FLOOR:
        X1, X2 = A, B
        record["note"] = "plain torch sin(a * b): the host-overhead floor, not checked"
    C = case_rule[3].to(case.dtype)
    step_grad_c = grad_c and name not in ("e3nn", FLOOR)
    if grad_c and name == "e3nn" and mode == "backward":
        record["note"] = "no dC (e3nn has no coefficient input)"

    def check(result, label):
        """Record the error; mark the record FAILED (and return False) when the result is wrong."""
        if name == FLOOR:
            return True
        error, quantity = check_result(result, mode, X1, X2, G, case_rule, case, grad_c, check_rows)
        record["error"] = error if record["error"] is None else max(record["error"], error)
        if error <= tolerance(case.dtype, quantity):
            return True
        record.update(status="FAILED", note=f"{label}wrong {quantity}: max relative error {error:.2e} > "
                                            f"{tolerance(case.dtype, quantity):.0e}")
        return False

    try:
        if name not in state["forwards"]:
            state["forwards"][name] = forward_function(name, case, case_rule)
        forward = state["forwards"][name]
        eager = make_step(forward, mode, X1, X2, C, G, requires_grad=mode == "backward", grad_c=step_grad_c)
        result = eager()
        synchronize(device)
        correct = check(result, "")
        del result
        if not correct:
            return record
    except Exception as error:  # noqa: BLE001 - every failure is reported, none is fatal
        if is_out_of_memory(error):
            record.update(status="skipped", note="out of memory")
        else:
            record.update(status="FAILED", note=_error_note(error))
        _free(device)
        return record

    for timing in timings:
        entry = record["timings"][timing] = {"status": "ok", "note": "", "median": None, "samples": [],
                                             "unit": unit(timing)}
        reason = timing_unavailable(timing, device)
        if reason is not None:
            entry.update(status="skipped", note=reason)
            continue
        try:
            if timing in ("compiled", "reduce-overhead"):
                compiled, before = compile_forward(forward, timing)
                step = make_step(compiled, mode, X1, X2, C, G, requires_grad=True, grad_c=step_grad_c,
                                 before=before, static=timing == "reduce-overhead")
                for _ in range(2 if timing == "reduce-overhead" else 0):  # CUDA graphs record on a later call
                    step()
                if not check(step(), f"{timing}: "):
                    entry.update(status="FAILED", note="wrong result")
                    continue
            else:
                step = make_step(forward, mode, X1, X2, C, G, requires_grad=timing != "kernel" or
                                 mode == "backward", grad_c=step_grad_c)
            samples = measure(timing, step, device, repeats=repeats, warmup=warmup, max_seconds=max_seconds)
            entry.update(median=statistics.median(samples), samples=samples)
        except Exception as error:  # noqa: BLE001 - a timing that fails is reported in its cell
            if is_out_of_memory(error):
                entry.update(status="skipped", note="out of memory")
            else:
                entry.update(status="FAILED", note=_error_note(error))
            _free(device)
    primary = next((t for t in timings if record["timings"][t]["status"] == "ok" and t != "host"), None)
    if primary is not None and record["status"] == "ok":
        median = record["timings"][primary]["median"]
        record.update(primary=primary, median_ms=median, times_ms=record["timings"][primary]["samples"])
        if name != FLOOR:
            record["GBps"] = record["floor_bytes"] / (median * 1e-3) / 1e9
    return record


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
