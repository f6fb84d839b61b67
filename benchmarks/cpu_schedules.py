"""The CPU's two schedules of fused message passing against the unfused layer, over the sweep of multiplicities
that decides between them.

    python benchmarks/cpu_schedules.py --json benchmarks/cpu_schedules.json

On the numba kernels, ``TensorProduct(x, Y, W, indices_1=src, indices_out=dst, size_out=nodes)`` runs either the
fused graph kernels (``graph``) or per edge (``per-edge``: the row kernels on rows gathered by ``index_select``,
then ``index_add`` by destination), chosen by the module's channel count
(``sparse_accumulation.e3nn.tensor_product.FUSED_MIN_CHANNELS``) and whether the call records gradients. Here
both are forced for each layer of ``--irreps`` (the NequIP layer of ``convolution.py``: "uvu" paths with harmonics
up to ``--sh-lmax``, ``--edges`` random sources, sorted destinations, float32) and timed beside ``unfused``
(``index_add(dst, tp(x[src], Y, W))``) in the three modes of ``convolution.py`` and ``no-grad`` (the forward under
``torch.no_grad``: inference of energies alone, where the module runs per edge up to twice as many channels). The
variants of a mode run in rounds, one step each per round in an order rotated from round to round, and the median
per variant is reported: a small machine's drift, and what one variant leaves behind for the next, fall on all
three alike.
``chosen``: the schedule the module picks, and its time over the unfused layer's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from convolution import MODES as RECORDING_MODES, layer, make_modules, make_step, versions  # noqa: E402
from sparse_accumulation.e3nn import tensor_product  # noqa: E402
from symmetric_contraction import cpu_name  # noqa: E402

SWEEP = ("4x0e+4x1o+4x2e", "8x0e+8x1o+8x2e", "16x0e+16x1o+16x2e", "32x0e+32x1o+32x2e", "64x0e+64x1o+64x2e",
         "128x0e+128x1o+128x2e", "16x0e+8x1o+4x2e", "32x0e+16x1o+8x2e", "64x0e+32x1o+16x2e", "128x0e+64x1o+32x2e")
MODES = RECORDING_MODES + ("no-grad",)
#: FUSED_MIN_CHANNELS forcing each schedule (the unfused layer never reads it)
FORCED = {"unfused": None, "graph": 0, "per-edge": 1 << 30}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--irreps", nargs="+", default=list(SWEEP))
    parser.add_argument("--sh-lmax", type=int, default=2)
    parser.add_argument("--edges", type=int, default=20000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device, chosen_threshold = torch.device("cpu"), tensor_product.FUSED_MIN_CHANNELS
    meta = {"command": "python benchmarks/cpu_schedules.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": cpu_name(), "threads": torch.get_num_threads(), "versions": versions(),
            "edges": args.edges, "nodes": args.nodes, "rounds": args.rounds, "fused_min_channels": chosen_threshold}
    print(json.dumps(meta), flush=True)
    rows = []
    try:
        for irreps in args.irreps:
            theirs, ours = make_modules((irreps, args.sh_lmax), torch.float32, device)
            generator = torch.Generator().manual_seed(0)
            src = torch.randint(0, args.nodes, (args.edges,), generator=generator)
            dst = torch.randint(0, args.nodes, (args.edges,), generator=generator).sort().values
            x, Y, W, G = (torch.randn(*shape, generator=generator) for shape in (
                (args.nodes, theirs.irreps_in1.dim), (args.edges, theirs.irreps_in2.dim),
                (args.edges, theirs.weight_numel), (args.nodes, theirs.irreps_out.dim)))
            row = {"irreps": irreps, "channels": ours.channels}
            for mode in MODES:
                limit = chosen_threshold * (2 if mode == "no-grad" else 1)
                chosen = "graph" if ours.channels >= limit else "per-edge"
                row[f"chosen {mode}"] = chosen
                steps = {}
                for v in FORCED:
                    f = layer("unfused" if v == "unfused" else "fused", theirs, ours, None, src, dst, args.nodes)
                    steps[v] = (torch.no_grad()(lambda f=f: f(x, Y, W)) if mode == "no-grad"
                                else make_step(f, mode, (x, Y, W), G))
                samples = {v: [] for v in FORCED}
                names = list(steps)
                for round_ in range(args.rounds + 1):  # the first round warms up
                    for variant in names[round_ % len(names):] + names[:round_ % len(names)]:
                        step = steps[variant]
                        if FORCED[variant] is not None:
                            tensor_product.FUSED_MIN_CHANNELS = FORCED[variant]
                        start = time.perf_counter()
                        step()
                        if round_:
                            samples[variant].append((time.perf_counter() - start) * 1e3)
                for variant in FORCED:
                    row[f"{variant} {mode}"] = statistics.median(samples[variant])
                row[f"chosen/unfused {mode}"] = row[f"{chosen} {mode}"] / row[f"unfused {mode}"]
            rows.append(row)
            print(f"{irreps:>22} ({ours.channels:>3} channels): " + "  ".join(
                f"{m} {row[f'unfused {m}']:.1f} / {row[f'graph {m}']:.1f} / {row[f'per-edge {m}']:.1f} ms "
                f"({row[f'chosen {m}']} {row[f'chosen/unfused {m}']:.2f}x)" for m in MODES), flush=True)
    finally:
        tensor_product.FUSED_MIN_CHANNELS = chosen_threshold
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
