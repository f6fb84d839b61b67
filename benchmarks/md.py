"""Molecular dynamics with a MACE model: the forces call alone, and velocity-Verlet NVE steps through MACE's ASE
calculator, for MACE, MACE + cuEquivariance and this library, eager and replayed from CUDA graphs.

    python benchmarks/md.py --device cuda --atoms 64 216 512 4096 10648 --steps 1000 --json md_h200.json
    python benchmarks/md.py --device cpu --atoms 64 --steps 20 --variants mace,ours-eager,ours --channels 16
    python benchmarks/md.py --device cuda --atoms 64 --steps 0 --variants cueq-captured,ours --profile 25 --profile-ops 30
    python benchmarks/md.py --device cuda --atoms 64 512 4096 --steps 0 --variants cueq-captured,ours --train
    python benchmarks/md.py --device cuda --atoms 64 216 --steps 0 --variants cueq-captured,ours --gaps 12
    python benchmarks/md.py --device cuda --atoms 64 --steps 0 --variants ours --capture-ops 40

The model: MACE's ``ScaleShiftMACE`` (mace-torch 0.3.16) built with its own constructor as in
``benchmarks/mace_model.py`` (``--channels`` x (0e + 1o), spherical harmonics up to 3, correlation 3, two residual
interactions, ``--elements`` elements, ``r_max`` 6; random weights). The systems: rock-salt NaCl crystals (lattice
constant 5.64 Angstrom, ``n^3`` cubic cells of 8 atoms, ``n`` from ``--atoms``), rattled by 0.05 Angstrom, with
velocities of 300 K. Variants:

* ``mace``: MACE's model as built; ``cueq``: MACE's converter to cuEquivariance (``mace.cli.convert_e3nn_cueq``,
  where cuequivariance is installed);
* ``cueq-captured``: the cuEquivariance model replayed from CUDA graphs by
  :class:`sparse_accumulation.mace.CapturedModel` (the anchor of an engine that captures its MD step by hand);
* ``ours-eager``: ``accelerate`` of the model; ``ours``: that model in :class:`~sparse_accumulation.mace.CapturedModel`;
  ``ours-compiled``: the same with ``compile=True`` (each bucket's call compiled by torch.compile, then captured);
  ``ours-unhoisted``: with ``hoist_elements=False`` (the element tables rebuilt by every replay);
* ``ours-split1``, ``ours-int64``, ``ours-fused-linear``: ``ours`` with one of the library's choices changed
  (:data:`ABLATIONS`, set for everything measured of the variant: no row sharing in the graph kernels of small
  graphs; int64 sort keys; the e3nn-layout ``Linear``'s calls of up to 65,536 rows as one Triton kernel per
  direction), for comparisons in one process;
  ``ours-maces-edges``: ``ours`` with MACE's own spherical harmonics, radial embedding and message reshapes put
  back (the converted model's other layers as ``ours``).

Per variant and size: ``call ms``, the median of ``--repeats`` forces calls (``model(batch, compute_force=True)``,
CUDA events around each; on the CPU the host clock) on MACE's batch of the crystal, the wrapper's bucket made
before; ``steps/s`` of ``--steps`` NVE steps (after 3; the median rate of five blocks) through
``mace.calculators.MACECalculator(models=...)``, which computes energy, forces and stress each step and builds its
neighbour list on the host; ``drift``: the largest change of the total energy per atom over them (eV); ``peak MB``:
the device memory the run peaked at above what was allocated before it (CUDA only); with ``--train``, the replayed
variants' models' training step (energies and forces, the loss ``sum E^2 + sum F^2``, its backward into the
parameters) eager and captured by hand into one CUDA graph. Float32 as MACE's calculator runs it (``--dtype``).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from mace_model import make_batch, make_model, to_cueq  # noqa: E402
from sparse_accumulation.bench.timing import compiled_kernels_only, elapsed_ms, synchronize  # noqa: E402
from sparse_accumulation.mace import CapturedModel, accelerate  # noqa: E402
from symmetric_contraction import cpu_name, versions  # noqa: E402

VARIANTS = ("mace", "cueq", "cueq-captured", "ours-eager", "ours", "ours-compiled", "ours-unhoisted",
            "ours-split1", "ours-int64", "ours-fused-linear", "ours-maces-edges")
#: ``ours`` with one of the library's choices changed while it is called (and so captured): (module, name, value)
ABLATIONS = {
    "ours-split1": ("sparse_accumulation.kernels.triton.graph", "SPLIT", 1),  # no row sharing in small graphs
    "ours-int64": ("sparse_accumulation.indices", "sort_keys", lambda index, size: index),  # int64 sort keys
    "ours-fused-linear": ("sparse_accumulation.e3nn.linear", "FUSED_MAX_ROWS", 65536),  # Linear in one kernel
}


def nacl(atoms: int, seed: int = 0):
    """A rattled rock-salt NaCl crystal of about ``atoms`` atoms (``n^3`` cubic cells of 8), with 300 K velocities."""
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    n = max(1, round((atoms / 8) ** (1 / 3)))
    crystal = bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat(n)
    crystal.rattle(0.05, seed=seed)
    MaxwellBoltzmannDistribution(crystal, temperature_K=300, rng=np.random.default_rng(seed))
    return crystal


def make_variants(names, mace, device, dtype) -> dict:
    """The models of ``names`` (those that cannot be made here are left out, with a note)."""
    made = {}
    for name in names:
        if name in ("cueq", "cueq-captured"):
            cueq = to_cueq(mace, device) if device.type == "cuda" else None
            if cueq is None:
                print(f"# {name}: needs cuequivariance and CUDA; left out", flush=True)
                continue
            made[name] = cueq.to(device, dtype) if name == "cueq" else CapturedModel(cueq.to(device, dtype))
        elif name == "mace":
            made[name] = copy.deepcopy(mace).to(device, dtype)
        else:
            ours = accelerate(copy.deepcopy(mace)).to(device, dtype)
            if name == "ours-maces-edges":
                with_maces_edge_layers(ours, mace, device, dtype)
            made[name] = ours if name == "ours-eager" else CapturedModel(ours, compile=name == "ours-compiled",
                                                                         hoist_elements=name != "ours-unhoisted")
            if name in ABLATIONS:
                made[name] = Ablated(made[name], *ABLATIONS[name])
    return made


def with_maces_edge_layers(ours, mace, device, dtype) -> None:
    """Put MACE's own spherical harmonics, radial embedding and interaction blocks' reshapes back into the
    converted ``ours`` (copies of ``mace``'s)."""
    ours.spherical_harmonics = copy.deepcopy(mace.spherical_harmonics).to(device, dtype)
    ours.radial_embedding = copy.deepcopy(mace.radial_embedding).to(device, dtype)
    for block, original in zip(ours.interactions, mace.interactions):
        block.reshape = copy.deepcopy(original.reshape).to(device, dtype)


class Ablated:
    """``model`` measured with ``module.name`` set to ``value`` (an ablation of :data:`ABLATIONS`): inside
    :meth:`active`, which gives the model."""

    def __init__(self, model, module: str, name: str, value):
        import importlib

        self.owner, self.name = importlib.import_module(module), name
        self.model, self.value = model, value

    @contextlib.contextmanager
    def active(self):
        kept = getattr(self.owner, self.name)
        setattr(self.owner, self.name, self.value)
        try:
            yield self.model
        finally:
            setattr(self.owner, self.name, kept)


def call_ms(model, batch, device, repeats: int) -> float:
    def step():
        return model(dict(batch), compute_force=True)["forces"]

    for _ in range(3):
        step()
    return statistics.median(elapsed_ms(step, device) for _ in range(repeats))


def train_step_ms(model, batch, device, repeats: int) -> dict:
    """A training step (energies and forces of ``model``, the loss ``sum E^2 + sum F^2``, its backward into the
    parameters' gradients) on CUDA: eager, and captured by hand into one CUDA graph (after warm-up steps on a
    side stream, as torch asks) and replayed; medians in ms."""
    params = [p for p in model.parameters() if p.requires_grad]
    static = dict(batch)

    def step():
        out = model(static, training=True, compute_force=True)
        (out["energy"].pow(2).sum() + out["forces"].pow(2).sum()).backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    eager = statistics.median(elapsed_ms(step, device) for _ in range(repeats))
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    replayed = statistics.median(elapsed_ms(graph.replay, device) for _ in range(repeats))
    del graph
    for p in params:
        p.grad = None
    return {"train_eager_ms": eager, "train_replayed_ms": replayed}


def kernel_profile(model, batch, top: int) -> dict:
    """The GPU kernels of one forces call (after warm-up; a CapturedModel's replay is one graph launch whose
    kernels the profiler lists): their count and time, the ``top`` kernels by time (name, calls, us) and every
    kernel (the same triples, kept in the JSON)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        model(dict(batch), compute_force=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(dict(batch), compute_force=True)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    kernels.sort(key=lambda e: -e.self_device_time_total)
    return {"kernel_calls": sum(e.count for e in kernels),
            "kernel_us": sum(e.self_device_time_total for e in kernels),
            "top": [(e.key[:120], e.count, round(e.self_device_time_total, 1)) for e in kernels[:top]],
            "kernels": [(e.key[:200], e.count, round(e.self_device_time_total, 2)) for e in kernels]}


def replay_gaps(model, batch, device, repeats: int, top: int) -> dict:
    """Where a replayed forces call's time goes besides its kernels (a CapturedModel on CUDA): ``replay_ms``, the
    median of the bucket's graph replayed alone (no copies in or out); ``host_ms``, the host's time in one whole
    call (inputs copied in, replay launched, outputs copied out; the device not waited for); ``busy_ms`` and
    ``idle_ms``, the time one replay's kernels run and the time between them, from the first kernel's start to the
    last one's end (torch.profiler); ``gaps``, the ``top`` longest idle stretches as (us, the kernel before, the
    kernel after)."""
    from torch.profiler import ProfilerActivity, profile

    model(dict(batch), compute_force=True)
    bucket = next(reversed(model._buckets.values()))
    replay_ms = statistics.median(elapsed_ms(bucket.graph.replay, device) for _ in range(repeats))
    host = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(dict(batch), compute_force=True)
        host.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        bucket.graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy, gaps, end = 0.0, [], kernels[0][0] if kernels else 0.0
    for i, (begin, finish, name) in enumerate(kernels):
        busy += finish - max(begin, end) if finish > end else 0.0
        if begin > end and i:
            gaps.append((round(begin - end, 1), kernels[i - 1][2][:80], name[:80]))
        end = max(end, finish)
    gaps.sort(reverse=True)
    span = (end - kernels[0][0]) if kernels else 0.0
    return {"replay_ms": replay_ms, "host_ms": statistics.median(host), "busy_ms": busy / 1e3,
            "idle_ms": (span - busy) / 1e3, "kernels": len(kernels), "gaps": gaps[:top]}


def capture_ops(model, batch, top: int) -> dict:
    """The operations a CapturedModel's capture of a forces call records (each at least one kernel of every
    replay; views, shape queries and ``detach`` left out), counted under a dispatch mode: their total, those with
    integer outputs (index work), and the ``top`` (operation, frames) groups by count, where frames are the
    innermost two of the library's and MACE's code that called it."""
    import collections
    import traceback

    from torch.utils._python_dispatch import TorchDispatchMode

    from op_counts import NOT_COUNTED, _name

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.groups, self.total, self.integer = collections.Counter(), 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = _name(func)
            if name in NOT_COUNTED or not torch.cuda.is_current_stream_capturing():
                return out
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            self.total += 1
            self.integer += isinstance(first, torch.Tensor) and not first.is_floating_point()
            frames = [f for f in traceback.extract_stack()
                      if ("sparse_accumulation" in f.filename or "/mace/" in f.filename) and "md.py" not in f.filename]
            where = " < ".join(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                               for f in frames[-2:][::-1])
            self.groups[(name, where)] += 1
            return out

    model.reset()
    with Counting() as counting:
        model(dict(batch), compute_force=True)
    return {"operations": counting.total, "integer": counting.integer,
            "top": [(name, where, n) for (name, where), n in counting.groups.most_common(top)]}


def op_profile(model, batch, top: int, by: str = "time") -> list:
    """The operators of one eager forces call of ``model`` (a CapturedModel's own model: a replay shows kernels,
    not the operators that launch them) that launch GPU kernels, grouped by operator and the innermost frames of
    the library's and MACE's code that called it: the ``top`` groups by GPU time (``by="time"``) or by calls
    (``"count"``: in a replay each costs a launch), as (operator, calls, GPU us, frames)."""
    from torch.profiler import ProfilerActivity, profile

    if isinstance(model, CapturedModel):
        model = model.model
    for _ in range(3):
        model(dict(batch), compute_force=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        model(dict(batch), compute_force=True)
        torch.cuda.synchronize()
    groups = [e for e in prof.key_averages(group_by_stack_n=4)
              if e.device_time_total > 0 and e.key.startswith("aten::")]
    groups.sort(key=lambda e: -(e.count if by == "count" else e.self_device_time_total))
    return [(e.key, e.count, round(e.self_device_time_total, 1),
             [frame for frame in e.stack if "sparse_accumulation" in frame or "mace" in frame][:3])
            for e in groups[:top]]


def run_md(model, crystal, device, dtype, steps: int, calculator: str = "mace") -> dict:
    """NVE steps through an ASE calculator (``calculator``: ``"mace"``, MACE's; ``"ours"``,
    :class:`sparse_accumulation.mace.Calculator`): steps per second, energy drift per atom, peak memory."""
    from ase import units
    from ase.md.verlet import VelocityVerlet
    from mace.calculators import MACECalculator

    from sparse_accumulation.mace import Calculator

    atoms = crystal.copy()
    dtype_name = str(dtype).split(".")[-1]
    if calculator == "mace":
        atoms.calc = MACECalculator(models=model, device=device.type, default_dtype=dtype_name)
    else:
        atoms.calc = Calculator(model, device=device.type, default_dtype=dtype_name)
    dynamics = VelocityVerlet(atoms, timestep=1.0 * units.fs)
    dynamics.run(3)
    energies = []
    dynamics.attach(lambda: energies.append(atoms.get_total_energy()), interval=max(1, steps // 100))
    synchronize(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rates = []  # the median of blocks' rates: a host-bound step's pauses (the collector, the OS) skew a total
    for block in np.array_split(np.arange(steps), min(steps, 5)):
        start = time.perf_counter()
        dynamics.run(len(block))
        synchronize(device)
        rates.append(len(block) / (time.perf_counter() - start))
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
    energies = np.array(energies)
    drift = float(np.abs(energies - energies[0]).max()) / len(atoms)
    return {"steps_per_s": statistics.median(rates), "drift_ev_per_atom": drift, "peak_mb": peak}


def measure(row: dict, model, crystal, batch, device, dtype, args) -> None:
    """Fill ``row`` with what ``args`` asks of ``model`` on ``batch`` (the forces call; with options its kernel
    profile, the operations its capture records, its replay gaps, its training step, NVE steps); a variant that
    fails records its error."""
    try:
        row["call_ms"] = call_ms(model, batch, device, args.repeats)
        if args.profile and device.type == "cuda":
            row["profile"] = kernel_profile(model, batch, args.profile)
        if args.capture_ops and device.type == "cuda" and isinstance(model, CapturedModel):
            row["capture_ops"] = found = capture_ops(model, batch, args.capture_ops)
            print(f"  {'':>14}  a capture records {found['operations']} operations, {found['integer']} with "
                  "integer outputs", flush=True)
            for op, where, n in found["top"]:
                print(f"  {'':>14}  {n:4d} {op}  {where}", flush=True)
        if args.gaps and device.type == "cuda" and isinstance(model, CapturedModel):
            row["gaps"] = replay_gaps(model, batch, device, args.repeats, args.gaps)
            found = row["gaps"]
            print(f"  {'':>14}  replay {found['replay_ms']:.3f} ms, host {found['host_ms']:.3f} ms per call; "
                  f"{found['kernels']} kernels busy {found['busy_ms']:.3f} ms, idle {found['idle_ms']:.3f} ms",
                  flush=True)
            for us, before, after in found["gaps"]:
                print(f"  {'':>14}  {us:7.1f} us idle after {before} before {after}", flush=True)
        if args.profile_ops and device.type == "cuda":
            row["ops"] = op_profile(model, batch, args.profile_ops, args.profile_ops_by)
            for op, calls, us, frames in row["ops"]:
                print(f"  {'':>14}  {us:9.1f} us x{calls:<4d} {op}  {' < '.join(frames)}", flush=True)
        if args.train and device.type == "cuda" and isinstance(model, CapturedModel) and not model.use_compile:
            row.update(train_step_ms(model.model, batch, device, args.repeats))
        if args.steps:
            row.update(run_md(model, crystal, device, dtype, args.steps, args.calculator))
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
    except Exception as error:  # noqa: BLE001 - a variant that fails is a result; the others still run
        row["error"] = repr(error)[:300]


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--atoms", type=int, nargs="+", default=[64, 216, 512])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--elements", type=int, default=89)
    parser.add_argument("--steps", type=int, default=1000, help="NVE steps timed per variant and size (0: none)")
    parser.add_argument("--calculator", choices=["mace", "ours"], default="mace",
                        help="the ASE calculator of the NVE steps: MACE's (MACECalculator(models=...)) or "
                             "sparse_accumulation.mace.Calculator (MACE's batch made once, then moved)")
    parser.add_argument("--repeats", type=int, default=50, help="forces calls timed per variant and size")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="CUDA: also list the kernels of one forces call, the N longest (torch.profiler)")
    parser.add_argument("--profile-ops", type=int, default=0, metavar="N",
                        help="CUDA: also list the N operators of one eager forces call that take the most GPU time, "
                             "with where the library's or MACE's code called them")
    parser.add_argument("--profile-ops-by", choices=["time", "count"], default="time",
                        help="--profile-ops: the operators that take the most GPU time, or the most calls")
    parser.add_argument("--capture-ops", type=int, default=0, metavar="N",
                        help="CUDA, replayed variants: also count the operations a capture records (those on integer "
                             "indices apart) and list the N most frequent with where they were called")
    parser.add_argument("--gaps", type=int, default=0, metavar="N",
                        help="CUDA, replayed variants: also time the graph's replay alone and the host's part of a "
                             "call, and list one replay's idle time between kernels, the N longest gaps")
    parser.add_argument("--train", action="store_true",
                        help="CUDA: also time a training step of the replayed variants' models, eager and captured "
                             "by hand into one CUDA graph (train eager / replayed ms)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    wanted = args.variants.split(",")
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model_args = argparse.Namespace(channels=args.channels, max_ell=3, correlation=3, elements=args.elements,
                                    r_max=6.0, interaction="RealAgnosticResidualInteractionBlock")
    mace = make_model(model_args)
    models = make_variants(wanted, mace, device, dtype)
    meta = {"command": "python benchmarks/md.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
            "versions": versions(), "dtype": args.dtype, "channels": args.channels, "elements": args.elements}
    print(json.dumps(meta), flush=True)
    rows = []
    for atoms in args.atoms:
        crystal = nacl(atoms)
        batch = make_batch(crystal, mace, dtype, device)
        print(f"# {len(crystal)} atoms, {batch['edge_index'].shape[1]} edges", flush=True)
        for name, wrapped in models.items():
            row = {"variant": name, "atoms": len(crystal), "edges": int(batch["edge_index"].shape[1])}
            # an ablation's setting holds for everything measured of it (its captures, steps and training step)
            with wrapped.active() if isinstance(wrapped, Ablated) else contextlib.nullcontext(wrapped) as model:
                measure(row, model, crystal, batch, device, dtype, args)
            rows.append(row)
            shown = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                             if k not in ("variant", "atoms", "edges", "profile", "ops", "gaps", "capture_ops"))
            print(f"  {name:>14}: {shown}", flush=True)
            if "profile" in row:
                found = row["profile"]
                print(f"  {'':>14}  {found['kernel_calls']} kernel calls, {found['kernel_us'] / 1000:.3f} ms", flush=True)
                for kernel, calls, us in found["top"]:
                    print(f"  {'':>14}  {us:9.1f} us x{calls:<4d} {kernel}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if args.json:  # after every row: a run stopped early keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
