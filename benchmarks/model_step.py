"""Benchmark of a whole model's steps: the NequIP-like potential of ``examples/interaction_model.py``.

    python benchmarks/model_step.py                                   # CPU: the small size and 10^4 edges
    python benchmarks/model_step.py --device cuda --json steps.json    # 2*10^3, 10^4 and 10^5 edges

The model: 3 interaction layers, features ``32x0e + 32x1o + 32x2e``, spherical harmonics up to ``l = 3``,
every "uvu" path (NequIP's convolution), radial networks of 8 Bessel functions and 64 hidden units, gated
nonlinearities, float32. A batch is molecules of 46 atoms, each a complete graph (2070 edges per molecule:
1, 5 and 48 molecules for about 2*10^3, 10^4 and 10^5 edges). Steps:

* ``train``: energies and forces (``create_graph=True``), the loss (energies and forces against targets), its
  backward (second derivatives through every layer) and an Adam step;
* ``infer``: energies and forces (no second derivatives).

Each step runs ``eager``, compiled (``default``: ``torch.compile``, the forces' ``autograd.grad`` traced into the
graph where this torch can) and as CUDA graphs (``reduce-overhead``, CUDA only), for each backend of the
message-passing product: ``ours`` (the fused product), ``e3nn`` (gathered rows, e3nn's product, ``index_add``)
and ``cueq`` (cuEquivariance's, when it is importable). Reported: the median step time (CUDA events around
single steps), the host time per step (a loop of steps issued without synchronising, divided by their count),
the number of GPU kernels one step launches (``torch.profiler``), and the peak memory of a step. A step that
fails to compile or run is reported with its error.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparse_accumulation.bench.timing import elapsed_ms, synchronize, compiled_kernels_only  # noqa: E402

ATOMS = 46
SIZES = {"cuda": [1, 5, 48], "cpu": [1, 5]}
CONFIG = dict(channels=32, layers=3, radial=8, hidden=64, atoms=ATOMS)
MODES = ("eager", "default", "reduce-overhead")


def _example():
    """The example module (registered under its name: torch.compile looks functions up by their module)."""
    spec = importlib.util.spec_from_file_location("interaction_model", ROOT / "examples" / "interaction_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["interaction_model"] = module
    spec.loader.exec_module(module)
    return module


def make_batch(example, molecules: int, device):
    generator = torch.Generator().manual_seed(0)
    positions, species = example.random_molecules(molecules, ATOMS, generator)
    energies, forces = example.energies_and_forces(positions, species)
    batch = next(example.batches(positions, species, energies, forces, molecules, device, torch.float32))
    src, dst = example.complete_graph(molecules, ATOMS, device)
    return batch, src, dst


def make_step(example, model, kind: str, mode: str, batch, src, dst):
    """One step as a closure (and what it compiled, for errors to surface on the first call)."""
    positions, species, energies, forces = batch
    if kind == "train":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        loss_of = example.compiled(lambda *a: example.loss_and_predictions(model, *a)[0], mode if mode != "eager"
                                   else "none")
        if mode == "reduce-overhead":
            for t in (positions, species, energies, forces, src, dst):
                torch._dynamo.mark_static_address(t)

        def step():
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            loss = loss_of(positions, species, src, dst, energies, forces)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss
        return step

    def infer(p, s, i, j):
        p = p.detach().requires_grad_()
        energy = model(p, s, i, j, energies.shape[0])
        return energy, -torch.autograd.grad(energy.sum(), p)[0]

    run = example.compiled(infer, mode if mode != "eager" else "none")

    def step():
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        return run(positions, species, src, dst)
    return step


def count_kernels(step, device) -> int:
    if device.type != "cuda":
        return -1
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def host_us(step, device, calls: int = 10) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        step()
    issued = time.perf_counter() - start
    synchronize(device)
    return issued / calls * 1e6


def peak_mb(step, device) -> float:
    if device.type != "cuda":
        return -1.0
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 1e6


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--molecules", type=int, nargs="+", default=None,
                        help=f"molecules of {ATOMS} atoms per batch (default: 1 5 48 on CUDA, 1 5 on the CPU)")
    parser.add_argument("--backends", default="ours,e3nn,cueq")
    parser.add_argument("--modes", default=None, help="comma-separated, from " + ", ".join(MODES))
    parser.add_argument("--kinds", default="train,infer")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    example = _example()
    modes = args.modes.split(",") if args.modes else [m for m in MODES if device.type == "cuda" or
                                                          m != "reduce-overhead"]
    backends = args.backends.split(",")
    if "cueq" in backends and importlib.util.find_spec("cuequivariance_torch") is None:
        backends.remove("cueq")
    meta = {"command": "python benchmarks/model_step.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "config": CONFIG, "threads": torch.get_num_threads(),
            "trace_autograd_ops": hasattr(torch._dynamo.config, "trace_autograd_ops")}
    print(json.dumps(meta), flush=True)
    rows = []
    for molecules in args.molecules or SIZES[device.type]:
        batch, src, dst = make_batch(example, molecules, device)
        for backend in backends:
            for kind in args.kinds.split(","):
                for mode in modes:
                    torch.manual_seed(0)
                    model = example.Potential(CONFIG, backend).to(device)
                    torch.compiler.reset()
                    row = {"edges": src.shape[0], "molecules": molecules, "backend": backend, "kind": kind,
                           "mode": mode}
                    try:
                        step = make_step(example, model, kind, mode, batch, src, dst)
                        started = time.perf_counter()
                        step()
                        synchronize(device)
                        row["first_s"] = time.perf_counter() - started
                        for _ in range(2):
                            step()
                        samples = [elapsed_ms(step, device) for _ in range(args.repeats)]
                        row.update(ms=statistics.median(samples), host_us=host_us(step, device),
                                   kernels=count_kernels(step, device), peak_mb=peak_mb(step, device))
                    except Exception as error:  # reported in the table, the others still run
                        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    del model
                    synchronize(device)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)
    return rows


def format_table(rows) -> str:
    lines = ["| edges | backend | step | mode | ms | host us | kernels | peak MB | first call s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['edges']:,} | {r['backend']} | {r['kind']} | {r['mode']} | failed: {r['error']} "
                         "| | | | |")
            continue
        lines.append(f"| {r['edges']:,} | {r['backend']} | {r['kind']} | {r['mode']} | {r['ms']:.3g} | "
                     f"{r['host_us']:.0f} | {r['kernels']} | {r['peak_mb']:.0f} | {r['first_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    main()
