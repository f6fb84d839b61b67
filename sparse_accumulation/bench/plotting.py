"""Charts of benchmark times with matplotlib (the optional extra ``plot``), imported only when plotting.

:func:`plot_times` draws any list of measurements (``bench``, ``benchmarks/*.py``); :func:`plot_results` the
results of :func:`~sparse_accumulation.bench.run_benchmark`. Figures are drawn on matplotlib's Agg canvas
without pyplot, so plotting neither needs a display nor changes the backend of the calling program.
"""
from __future__ import annotations

import os
import textwrap
from typing import Iterable, Optional, Sequence

from .cases import FLOOR, MODES
from .timing import TIMINGS

__all__ = ["plot_times", "plot_results", "records_from_results"]

_MODE_TITLES = {"forward": "forward", "backward": "forward + backward"}
_TIMING_TITLES = {"kernel": "kernel (calls back to back)", "call": "call (one training step)",
                  "compiled": "compiled (fullgraph)", "reduce-overhead": "reduce-overhead (CUDA graphs)",
                  "host": "host time per call"}
_FLOOR_LABEL = "floor: bytes / copy bandwidth"


def _matplotlib():
    """``(Figure, FigureCanvasAgg)``; ImportError with the install command when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError('plotting needs matplotlib: pip install "sparse-accumulation[plot]"',
                          name="matplotlib") from error
    return Figure, FigureCanvasAgg


def _value(ms: float) -> str:
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def _ordered(values: Iterable) -> list:
    return list(dict.fromkeys(values))


def plot_times(records: Sequence[dict], output, *, title: str = "", formats: Sequence[str] = ("png", "svg"),
               ylabel: str = "ms per call") -> list:
    """Bar charts of times per case and implementation on a log scale, with the floor of each case as a line.

    One panel per timing and mode (forward, forward + backward): the modes side by side, or one under the
    other when there are many bars; in each panel a group of bars per case, one bar per implementation (the
    same color in every panel), and the case's floor drawn as a dashed line across its group.

    Args:
        records: dicts with ``"case"`` (the group label), ``"implementation"``, ``"mode"`` (``"forward"`` or
            ``"backward"``), ``"ms"`` (``None``: no bar) and optionally ``"floor_ms"``, ``"timing"`` (the
            panel row; rows follow :data:`~sparse_accumulation.bench.TIMINGS` order, then first appearance)
            and ``"failed"`` (true: the word "failed" stands in the bar's place).
        output: path without suffix; ``output.png`` and ``output.svg`` are written (see ``formats``).
        title: figure title.
        formats: file suffixes understood by matplotlib.
        ylabel: the y axis label (after the timing's name).

    Returns:
        The paths written; ``[]`` (nothing written) when no record has a time.

    Raises:
        ImportError: when matplotlib is not installed (``name="matplotlib"``).
    """
    records = [r for r in records if r.get("ms") is not None and r["ms"] > 0 or r.get("floor_ms") or r.get("failed")]
    if not any(r.get("ms") for r in records):
        return []
    Figure, FigureCanvasAgg = _matplotlib()
    modes = [m for m in MODES if any(r["mode"] == m for r in records)]
    found = _ordered(r.get("timing", "") for r in records)
    timings = [t for t in TIMINGS if t in found] + [t for t in found if t not in TIMINGS]
    cases = _ordered(r["case"] for r in records)
    implementations = _ordered(r["implementation"] for r in records if r.get("ms") or r.get("failed"))
    colors = {name: f"C{i % 10}" for i, name in enumerate(implementations)}
    group, width = 0.84, 0.84 / max(1, len(implementations))

    panel_width = max(3.2, 0.9 + len(cases) * (0.16 * len(implementations) + 0.35))
    side_by_side = len(modes) * panel_width <= 13  # else one mode under the other
    rows, columns = (len(timings), len(modes)) if side_by_side else (len(timings) * len(modes), 1)
    figure = Figure(figsize=(columns * panel_width + 1.0, 1.6 + 2.7 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, sharey=True, squeeze=False)
    values = [r[k] for r in records for k in ("ms", "floor_ms") if r.get(k)]
    low, high = min(values), max(values)
    panels = [(timing, mode) for timing in timings for mode in modes]
    labelled = len(cases) * len(implementations) <= 12  # few bars: write each time above its bar
    for index, (timing, mode) in enumerate(panels):
        ax = axes.flat[index]
        selected = [r for r in records if r["mode"] == mode and r.get("timing", "") == timing]
        for i, case in enumerate(cases):
            in_case = {r["implementation"]: r for r in selected if r["case"] == case}
            for j, name in enumerate(implementations):
                r = in_case.get(name)
                x = i + (j - (len(implementations) - 1) / 2) * width
                if r is not None and r.get("failed"):  # the slot says so, in the bar's color
                    ax.text(x, low, "failed", rotation=90, ha="center", va="bottom", color=colors[name],
                            fontweight="bold", zorder=4, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
                if r is not None and r.get("ms"):
                    ax.bar(x, r["ms"], width=width * 0.92, color=colors[name], zorder=2)
                    if labelled:
                        ax.annotate(_value(r["ms"]), (x, r["ms"]), xytext=(0, 2), textcoords="offset points",
                                    ha="center", va="bottom", fontsize="small")
            floors = [r["floor_ms"] for r in in_case.values() if r.get("floor_ms")]
            if floors:
                ax.hlines(floors[0], i - group / 2 - 0.04, i + group / 2 + 0.04, colors="black",
                          linestyles="dashed", linewidth=1.6, zorder=3)
        ax.set_yscale("log")
        ax.set_ylim(low / 2, high * (4 if labelled else 2))
        ax.set_xticks(range(len(cases)), cases)
        ax.set_xlim(-0.6, len(cases) - 0.4)
        ax.grid(axis="y", which="major", color="0.85", zorder=0)
        ax.grid(axis="y", which="minor", color="0.94", zorder=0)
        if not side_by_side or index < columns:
            ax.set_title(_MODE_TITLES.get(mode, mode))
        if index % columns == 0:
            ax.set_ylabel(f"{_TIMING_TITLES.get(timing, timing)}\n{ylabel}" if timing else ylabel)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = {name: Patch(color=colors[name]) for name in implementations}  # failed-only ones too
    if any(r.get("floor_ms") for r in records):
        handles[_FLOOR_LABEL] = Line2D([], [], color="black", linestyle="dashed", linewidth=1.6)
    figure.legend(list(handles.values()), list(handles), loc="outside lower center", frameon=False,
                  ncols=min(len(handles), 4))
    if title:  # wrapped to the figure's width (about nine characters an inch at this size)
        figure.suptitle("\n".join(textwrap.wrap(title, int(figure.get_figwidth() * 9))))
    os.makedirs(os.path.dirname(os.path.abspath(str(output))), exist_ok=True)
    import matplotlib

    paths = []
    # SVG text stays text (searchable, smaller); fixed ids and no date, so that a redrawn chart is the same file
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sparse-accumulation"}):
        for suffix in formats:
            path = f"{output}.{suffix}"
            figure.savefig(path, dpi=120, metadata={"Date": None} if suffix in ("svg", "pdf") else None)
            paths.append(path)
    return paths


def _case_label(r: dict, varying: set) -> str:
    parts = [r["rule"]]
    if "rows" in varying:
        parts.append("x".join(map(str, r["rows"])))
    parts += [r[key] for key in ("dtype", "device") if key in varying]
    return "\n".join(parts)


def records_from_results(results: Sequence[dict], timings: Optional[Sequence[str]] = None) -> list:
    """:func:`plot_times` records from :func:`~sparse_accumulation.bench.run_benchmark` results.

    Every timing measured (``host`` converted from us to ms) becomes a row of panels, unless ``timings``
    selects some; the case label is the rule, plus rows, dtype and device where they vary. Skipped timings get
    no bar, failed ones the word "failed"; the host-overhead floor (``elementwise``) is kept as a bar. The bandwidth floor
    is drawn in every panel but ``host``.
    """
    varying = {key for key in ("rows", "dtype", "device") if len({str(r[key]) for r in results}) > 1}
    records = []
    for r in results:
        if r["status"] != "ok":
            continue
        for timing, entry in r.get("timings", {}).items():
            if timings is not None and timing not in timings or entry["status"] == "skipped":
                continue
            if entry["status"] == "FAILED":
                records.append({"case": _case_label(r, varying), "implementation": r["implementation"],
                                "mode": r["mode"], "timing": timing, "ms": None, "failed": True})
                continue
            scale = 1e-3 if entry["unit"] == "us" else 1.0
            records.append({"case": _case_label(r, varying), "implementation": r["implementation"],
                            "mode": r["mode"], "timing": timing, "ms": entry["median"] * scale,
                            # the bandwidth floor bounds device time, not host time
                            "floor_ms": None if r["implementation"] == FLOOR or timing == "host"
                            else r.get("floor_ms")})
        if not r.get("timings") and r.get("median_ms"):  # results written before timings existed
            records.append({"case": _case_label(r, varying), "implementation": r["implementation"],
                            "mode": r["mode"], "ms": r["median_ms"], "floor_ms": r.get("floor_ms")})
    return records


def plot_results(results: Sequence[dict], output, *, timings: Optional[Sequence[str]] = None,
                 title: Optional[str] = None, formats: Sequence[str] = ("png", "svg")) -> list:
    """Chart of :func:`~sparse_accumulation.bench.run_benchmark` results: ``output.png`` and ``output.svg``.

    Returns the paths written (``[]`` when nothing was measured). Raises ImportError without matplotlib.
    """
    records = records_from_results(results, timings)
    if title is None:
        devices = ", ".join(_ordered(r["device"] for r in results))
        dtypes = ", ".join(_ordered(r["dtype"] for r in results))
        rows = ", ".join(_ordered("x".join(map(str, r["rows"])) for r in results))
        title = f"sparse-accumulation bench: {devices}, {dtypes}, rows {rows} (median, log scale)"
    return plot_times(records, output, title=title, formats=formats)

