"""Charts of the recorded benchmark results, drawn with ``sparse_accumulation.bench.plot_times`` (matplotlib).

    python benchmarks/plots.py                        # redraw every chart below from its JSON file
    python benchmarks/plots.py --cpu-copy-gbps 37.2   # the CPU floor at a given copy bandwidth

Each recorded JSON format has a converter to the records of ``plot_times`` (``case``, ``implementation``,
``mode``, ``ms``, optional ``floor_ms`` and ``timing``), used here and by the scripts that write the format:

* :func:`gpu_records`: ``benchmarks/gpu.py --json`` (kernels alone, the public call, CUDA-graph replay,
  references; the floor from the copy bandwidth measured in the same run);
* :func:`cpu_records`: ``benchmarks/cpu.py --json`` (numba and index_add; the JSON holds no bandwidth, so the
  floor uses the copy bandwidth given, or measured on this machine when the chart is drawn);
* :func:`iteration_records`: ``benchmarks/iteration.py --json`` (fused product, per-path calls, e3nn);
* ``sparse-accumulation bench --output DIR`` results: :func:`sparse_accumulation.bench.plot_results`
  (``bench_h200_2x2.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from sparse_accumulation import bench  # noqa: E402

#: (label, forward key, forward+backward key) of the ``ms`` dict of a gpu.py result, in chart order
GPU_SERIES = (("ours: kernel alone", "ours_auto_fwd", None),
              ("ours: sa.accumulate, do_bench", "ours_public_fwd", "ours_fwdbwd"),
              ("ours: CUDA graph replay", "ours_public_fwd_graph", "ours_fwdbwd_graph"),
              ("e3nn uuu TensorProduct", "e3nn_fwd", "e3nn_fwdbwd"),
              ("dense matmul", "dense_fwd", "dense_fwdbwd"),
              ("index_add", "index_add_fwd", "index_add_fwdbwd"))


def gpu_records(data: dict) -> list:
    """Records of a ``benchmarks/gpu.py --json`` file (forward and forward+backward per case)."""
    records = []
    for r in data["results"]:
        for label, forward, backward in GPU_SERIES:
            for mode, key, floor in (("forward", forward, "floor_fwd_ms"), ("backward", backward, "floor_fwdbwd_ms")):
                if key is not None and r["ms"].get(key):
                    records.append({"case": r["case"], "implementation": label, "mode": mode, "ms": r["ms"][key],
                                    "floor_ms": r[floor]})
    return records


def cpu_records(data: dict, copy_bytes_per_second: float) -> list:
    """Records of a ``benchmarks/cpu.py --json`` file; the floor is floor bytes / ``copy_bytes_per_second``."""
    dtype = bench.DTYPES[data["dtype"]]
    records = []
    for r in data["results"]:
        l1, l2, L = (int(x) for x in r["rule"].replace("->", "x").split("x"))
        case = bench.Case(l1, l2, L, tuple(r["rows"]), dtype, "cpu")
        for name in ("numba", "index_add"):
            for mode, key in (("forward", "forward"), ("backward", "forward+backward")):
                records.append({"case": r["rule"], "implementation": name, "mode": mode, "ms": r[name][key],
                                "floor_ms": bench.floor_bytes(case, mode) / copy_bytes_per_second * 1e3})
    return records


def iteration_records(data: dict) -> list:
    """Records of a ``benchmarks/iteration.py --json`` file: one case, one bar per method."""
    meta = data["meta"]
    case = (f"lmax {meta['lmax']} -> {meta['lmax_out']}: {meta['paths']} paths, "
            f"{meta['samples']} x {meta['channels']} rows")
    return [{"case": case, "implementation": name, "mode": mode, "ms": r[key]}
            for name, r in data["results"].items()
            for mode, key in (("forward", "forward_ms"), ("backward", "forward_backward_ms"))]


def _load(name: str) -> dict:
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return json.load(f)


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-copy-gbps", type=float,
                        help="copy bandwidth (GB/s, read + write) of the CPU floor (default: measured now)")
    args = parser.parse_args(argv)
    written = []
    gpu = _load("gpu_h200.json")
    written += bench.plot_times(
        gpu_records(gpu), os.path.join(HERE, "gpu_h200"),
        title=f"benchmarks/gpu.py on an {gpu['device']} (torch {gpu['torch']}, Triton {gpu['triton']}): real CG "
              f"rules, 1000 x 2000 rows unless noted, float32 unless noted; floor at "
              f"{gpu['copy_bandwidth_Bps'] / 1e12:.2f} TB/s")
    cpu = _load("cpu.json")
    copy = args.cpu_copy_gbps * 1e9 if args.cpu_copy_gbps else bench.copy_bandwidth("cpu")
    print(f"CPU floor at a copy bandwidth of {copy / 1e9:.1f} GB/s")
    written += bench.plot_times(
        cpu_records(cpu, copy), os.path.join(HERE, "cpu"),
        title=f"benchmarks/cpu.py on 2 CPU cores (torch {cpu['torch']}): real CG rules, "
              f"{' x '.join(map(str, cpu['rows']))} rows, {cpu['dtype']}; floor at {copy / 1e9:.1f} GB/s")
    iteration = _load("iteration_cpu.json")
    written += bench.plot_times(
        iteration_records(iteration), os.path.join(HERE, "iteration_cpu"),
        title=f"benchmarks/iteration.py on 2 CPU cores: one CG iteration step, {iteration['meta']['dtype']}")
    recorded = _load("bench_h200_2x2.json")
    environment = recorded["environment"]
    written += bench.plot_results(
        recorded["results"], os.path.join(HERE, "bench_h200_2x2"),
        title=f"sparse-accumulation bench --device cuda --l 2 2 2 on an {environment['cuda_device']} (torch "
              f"{environment['torch']}, Triton {environment['triton']}): 1000 x 2000 rows, float32 (median, log scale)")
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
