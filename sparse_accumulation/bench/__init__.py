"""Benchmarks and self-tests of the sparse accumulation implementations (``sparse-accumulation bench|check``).

The functions here are usable from Python and tests; :mod:`sparse_accumulation.cli` only parses arguments.
One module per job:

* :mod:`~sparse_accumulation.bench.cases`: what to measure (:class:`Case`, :func:`standard_cases`, the
  implementation and mode names, :func:`floor_bytes`);
* :mod:`~sparse_accumulation.bench.implementations`: the function each implementation name runs;
* :mod:`~sparse_accumulation.bench.checking`: results against float64 ``index_add``;
* :mod:`~sparse_accumulation.bench.timing`: the timings (``kernel``, ``call``, ``compiled``,
  ``reduce-overhead``, ``host``) and the copy bandwidth of a device;
* :mod:`~sparse_accumulation.bench.runner`: :func:`run_benchmark`, check first (a wrong implementation is
  ``FAILED`` and not timed), then time;
* :mod:`~sparse_accumulation.bench.report`: the text table, ``bench.json``;
* :mod:`~sparse_accumulation.bench.plotting`: the charts (matplotlib, optional);
* :mod:`~sparse_accumulation.bench.selftest`: :func:`run_check`, the ``check`` command;
* :mod:`~sparse_accumulation.bench.progress`: tqdm progress bars.
"""
from .cases import (BASELINE, DEFAULT_RULES, DTYPES, FLOOR, IMPLEMENTATIONS, MODES, QUICK_RULES, Case,
                    available_devices, default_implementations, floor_bytes, normalize_modes, standard_cases)
from .report import environment, format_table, write_results
from .runner import run_benchmark
from .selftest import CheckResult, format_check, run_check
from .timing import EAGER_TIMINGS, TIMINGS, copy_bandwidth, normalize_timings


def plot_times(records, output, **options) -> list:
    """Bar charts of times per case and implementation (see :func:`sparse_accumulation.bench.plotting.plot_times`).

    Imports matplotlib only when called; raises ImportError (``name="matplotlib"``) without it.
    """
    from .plotting import plot_times as plot

    return plot(records, output, **options)


def plot_results(results, output, **options) -> list:
    """Chart of :func:`run_benchmark` results (see :func:`sparse_accumulation.bench.plotting.plot_results`)."""
    from .plotting import plot_results as plot

    return plot(results, output, **options)


__all__ = [
    "Case", "CheckResult", "DTYPES", "MODES", "TIMINGS", "EAGER_TIMINGS", "IMPLEMENTATIONS", "BASELINE", "FLOOR",
    "DEFAULT_RULES", "QUICK_RULES", "standard_cases", "available_devices", "default_implementations",
    "normalize_modes", "normalize_timings", "floor_bytes", "copy_bandwidth", "run_benchmark", "format_table",
    "environment", "write_results", "plot_times", "plot_results", "run_check", "format_check",
]
