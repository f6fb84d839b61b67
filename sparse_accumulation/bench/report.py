"""What ``bench`` prints and writes: the text table, the environment, ``bench.json`` and the charts."""
from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
from typing import Optional, Sequence

import torch

from .cases import BASELINE, mode_label
from .timing import TIMINGS, unit

__all__ = ["format_table", "environment", "write_results", "PLOT_HINT"]

#: The one line printed instead of the charts when matplotlib is missing.
PLOT_HINT = 'charts not written: matplotlib is not installed (pip install "sparse-accumulation[plot]")'


def _format_ms(ms: Optional[float]) -> str:
    if ms is None:
        return "-"
    if ms <= 0:
        return f"{ms:.3f}"
    if ms < 1:  # three significant digits, without an exponent
        return f"{ms:.{2 - math.floor(math.log10(ms))}f}"
    return f"{ms:.3f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


def _format_timing(entry: Optional[dict]) -> str:
    if entry is None or entry["status"] == "skipped" or entry["median"] is None:
        return "FAILED" if entry is not None and entry["status"] == "FAILED" else "-"
    value = entry["median"]
    if entry["unit"] == "us":
        return f"{value:.0f}" if value >= 100 else f"{value:.1f}"
    return _format_ms(value)


def _shown_timings(results: Sequence[dict]) -> list:
    """Timings measured (or failed) somewhere: a timing skipped on every row gets no column."""
    return [t for t in TIMINGS if any(r["timings"].get(t, {}).get("status", "skipped") != "skipped"
                                      for r in results)]


def _status(r: dict) -> str:
    notes = [r["note"]] if r["note"] else []
    notes += [f"{t} FAILED: {e['note']}" for t, e in r["timings"].items()
              if e["status"] == "FAILED" and e["note"] != "wrong result"]
    return r["status"] + (f" ({'; '.join(notes)})" if notes else "")


def format_table(results: Sequence[dict]) -> str:
    """The results as an aligned text table, one line per (case, implementation, mode).

    Columns: the case, the implementation and mode, one column per timing (ms; ``host`` in us; ``FAILED``
    when the timing failed, the reason in the status column), the speed-up against ``index_add`` of the first
    timing with its range over the repeats (the reference's 20% quantile over ours' 80% one, and the reverse),
    the bandwidth (floor bytes / time) of the first timing, the floor time (floor bytes / copy bandwidth), the
    max relative error of the check and the status.
    """
    timings = _shown_timings(results)
    head = ["rule", "rows", "dtype", "device", "implementation", "mode"]
    head += [f"{t} {unit(t)}" for t in timings] + [f"vs {BASELINE}", "range", "GB/s", "floor ms", "max rel err",
                                                   "status"]
    lines = []
    for r in results:
        lines.append([r["rule"], "x".join(map(str, r["rows"])), r["dtype"], r["device"], r["implementation"],
                      mode_label(r["mode"])]
                     + [_format_timing(r["timings"].get(t)) for t in timings]
                     + ["-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                        "-" if r.get("speedup_range") is None else "{:.3g}-{:.3g}x".format(*r["speedup_range"]),
                        "-" if r["GBps"] is None else f"{r['GBps']:.2f}", _format_ms(r["floor_ms"]),
                        "-" if r["error"] is None else f"{r['error']:.1e}", _status(r)])
    widths = [max(len(row[i]) for row in [head] + lines) for i in range(len(head) - 1)]
    right = set(range(6, len(head) - 1))

    def join(row):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells + [row[-1]]).rstrip()

    return "\n".join([join(head), join(["-" * w for w in widths] + ["------"])] + [join(row) for row in lines])


def environment() -> dict:
    """Versions and hardware of this process, stored with the results."""
    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu_threads": torch.get_num_threads()}
    for package in ("numba", "triton", "e3nn", "matplotlib", "tqdm"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name()
    return info


def write_results(results: Sequence[dict], directory, command: str = "") -> dict:
    """Write ``bench.json`` and, with matplotlib, the charts ``bench.png`` and ``bench.svg`` into ``directory``.

    Returns:
        ``{"json": path, "png": path or None, "svg": path or None, "note": why no chart or ""}``.
    """
    os.makedirs(directory, exist_ok=True)
    json_path = os.path.join(directory, "bench.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump({"command": command, "environment": environment(), "results": list(results)}, f, indent=1)
    paths = {"json": json_path, "png": None, "svg": None, "note": ""}
    try:
        from .plotting import plot_results

        written = plot_results(results, os.path.join(directory, "bench"))
    except ImportError as error:
        if getattr(error, "name", None) != "matplotlib":
            raise
        paths["note"] = PLOT_HINT
        return paths
    if not written:
        paths["note"] = "charts not written: no measurement to plot"
    for path in written:
        paths[path.rsplit(".", 1)[1]] = path
    return paths
