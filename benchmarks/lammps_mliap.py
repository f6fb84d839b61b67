"""LAMMPS molecular dynamics of a MACE model through LAMMPS's ML-IAP interface (``pair_style mliap unified``) on the
CPU: steps per second of MACE's own model and of the model converted by ``sparse_accumulation.mace.accelerate``,
exported alike, on 1 and 2 MPI ranks.

    python benchmarks/lammps_mliap.py                                     # 512 and 4096 atoms, 1 and 2 ranks
    python benchmarks/lammps_mliap.py --repeats 2 4 --ranks 1 --steps 5 --json lammps.json

Needs a LAMMPS built by ``scripts/build_lammps.sh`` (ML-IAP with Python support, PYTHON, KOKKOS, MPI) whose Python
module is installed in this Python, and ``mpirun``. The model: MACE's ``ScaleShiftMACE`` (mace-torch 0.3.16) built
with its own constructor in float64, random weights: ``--channels`` x (0e + 1o) hidden irreps, spherical harmonics
up to ``--max-ell``, ``--correlation``, two ``RealAgnosticResidualInteractionBlock`` interactions, Na and Cl,
``r_max`` ``--r-max``. Each variant is exported as MACE's ``create_lammps_model --format mliap`` exports (its
``LAMMPS_MLIAP_MACE`` wrapper saved with ``torch.save``) but without that tool's cuEquivariance conversion, which
would replace the converted layers. The crystal: rock-salt NaCl, ``n x n x n`` conventional cells (8 atoms each)
for each ``n`` of ``--repeats``, rattled, 300 K velocities. A run: LAMMPS's setup and the model's first call
(``run 0``), then ``--steps`` timed NVE steps (velocity Verlet, 1 fs); steps per second is ``--steps`` over their
wall time. Each rank runs ``--threads`` torch (and numba) threads (default 1: with more threads than cores free,
OpenMP's spinning threads wait on each other). LAMMPS's communication is widened for the model's exchanged
features (``scripts/lammps_mliap_run.py --comm-width``, :func:`exchange_width`). Prints a table and writes
``--json`` with the commands, CPU, versions and, per run, steps per second, rank 0's peak memory and the load
average before and after.

The functions here also make the models, crystals and LAMMPS runs of ``tests/test_lammps.py``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from symmetric_contraction import cpu_name, versions as library_versions  # noqa: E402
RUNNER = os.path.join(ROOT, "scripts", "lammps_mliap_run.py")
ELEMENTS = ("Na", "Cl")


def mace_model(channels: int = 8, max_ell: int = 2, correlation: int = 3, r_max: float = 5.0, lmax: int = 1,
               seed: int = 0):
    """MACE's ScaleShiftMACE for Na and Cl in float64, built by MACE's constructor, its trainable parameters moved
    off their initial values by random amounts (``seed``). Hidden irreps ``channels`` x (0e + 1o) (``lmax`` 0:
    scalars only)."""
    from ase.data import atomic_numbers
    from e3nn import o3
    from mace import modules

    hidden = " + ".join(f"{channels}x{l}{'e' if l % 2 == 0 else 'o'}" for l in range(lmax + 1))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        model = modules.ScaleShiftMACE(
            atomic_inter_scale=0.5, atomic_inter_shift=0.0, r_max=r_max, num_bessel=8, num_polynomial_cutoff=5,
            max_ell=max_ell, interaction_cls=block, interaction_cls_first=block, num_interactions=2,
            num_elements=len(ELEMENTS), hidden_irreps=o3.Irreps(hidden), MLP_irreps=o3.Irreps("16x0e"),
            gate=torch.nn.functional.silu, atomic_energies=np.array([-1.3, -2.1]), avg_num_neighbors=26.0,
            atomic_numbers=[atomic_numbers[s] for s in ELEMENTS], correlation=correlation, radial_MLP=[32, 32])
    finally:
        torch.set_default_dtype(previous)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


def accelerated(model):
    """A copy of ``model`` converted by :func:`sparse_accumulation.mace.accelerate`."""
    from sparse_accumulation.mace import accelerate

    return accelerate(copy.deepcopy(model))


def export_mliap(model, path: str, allow_cpu: bool = True) -> str:
    """Save ``model`` (a MACE model, converted or not) for ``pair_style mliap unified``: MACE's
    ``LAMMPS_MLIAP_MACE`` wrapper of a copy of it, saved with ``torch.save``, as
    ``python -m mace.cli.create_lammps_model MODEL --format mliap`` does after its cuEquivariance conversion (left
    out: it would rebuild the converted layers as cuEquivariance's). MACE's wrapper reads its settings from the
    environment when it is made and saves them with the model: ``allow_cpu`` makes it with ``MACE_ALLOW_CPU=1``, which
    a KOKKOS run on the CPU needs. Returns ``path``."""
    from mace.calculators.lammps_mliap_mace import LAMMPS_MLIAP_MACE

    model = copy.deepcopy(model).double().to("cpu")
    model.lammps_mliap = True
    previous = os.environ.get("MACE_ALLOW_CPU")
    if allow_cpu:
        os.environ["MACE_ALLOW_CPU"] = "1"
    try:
        wrapper = LAMMPS_MLIAP_MACE(model)
    finally:
        if previous is None:
            os.environ.pop("MACE_ALLOW_CPU", None)
        else:
            os.environ["MACE_ALLOW_CPU"] = previous
    torch.save(wrapper, path)
    return path


def exchange_width(model) -> int:
    """The widest per-atom feature vector MACE's ML-IAP class exchanges between ranks (the output of each
    interaction's ``linear_up``: ghost atoms' features after the first layer), which LAMMPS's communication buffers
    must hold (``scripts/lammps_mliap_run.py --comm-width``)."""
    return max(int(block.linear_up.irreps_out.dim) for block in model.interactions)


def rocksalt(repeat: int, rattle: float = 0.05, seed: int = 0, a: float = 5.64):
    """Rock-salt NaCl, ``repeat`` x ``repeat`` x ``repeat`` conventional cubic cells (8 atoms each), positions
    rattled (standard deviation ``rattle`` Angstrom), periodic."""
    from ase.build import bulk

    crystal = bulk("NaCl", "rocksalt", a=a, cubic=True).repeat(repeat)
    crystal.rattle(rattle, seed=seed)
    return crystal


def write_data(crystal, path: str) -> str:
    """Write ``crystal`` (an orthorhombic periodic cell) as a LAMMPS data file (atom_style atomic), atom types
    1, 2 = Na, Cl, ids in the crystal's order, coordinates with all their digits. Returns ``path``."""
    cell = np.asarray(crystal.cell)
    if np.abs(cell - np.diag(np.diag(cell))).max() > 0:
        raise ValueError("write_data writes orthorhombic cells only")
    types = [ELEMENTS.index(s) + 1 for s in crystal.get_chemical_symbols()]
    lines = ["NaCl crystal for pair_style mliap unified", "", f"{len(crystal)} atoms", f"{len(ELEMENTS)} atom types",
             *(f"0.0 {float(cell[i, i])!r} {lo}lo {lo}hi" for i, lo in enumerate("xyz")), "", "Atoms # atomic", ""]
    positions = crystal.positions.tolist()
    lines += [f"{i + 1} {t} {x!r} {y!r} {z!r}" for i, (t, (x, y, z)) in enumerate(zip(types, positions))]
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def mpirun() -> str:
    """The MPI launcher (``mpirun``, else ``mpiexec``), or an error saying what to install."""
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpirun or mpiexec on PATH: install an MPI (scripts/build_lammps.sh --check-deps)")
    return found


def run_lammps(model_file: str, data_file: str, out: str, ranks: int = 1, steps: int = 0, threads: int = 1,
               timed_steps: int = 0, atoms: bool = False, record_every: int = 1, timeout: float = 1800,
               comm_width: int = 0, extra=()) -> dict:
    """Run ``scripts/lammps_mliap_run.py`` under ``mpirun -np ranks`` (``--oversubscribe`` with Open MPI where
    ``ranks`` exceeds the cores) in a subprocess (a crash of LAMMPS or MPI stays there) and return its JSON;
    ``comm_width``: :func:`exchange_width` of the model. Raises ``RuntimeError`` with the run's output when it
    fails."""
    launcher = mpirun()
    # Open MPI refuses more ranks than cores unless told (MPICH runs them)
    crowded = ranks > (os.cpu_count() or 1) and "Open MPI" in subprocess.run(
        [launcher, "--version"], capture_output=True, text=True).stdout
    command = [launcher, "-np", str(ranks), *(["--oversubscribe"] if crowded else []), sys.executable, RUNNER,
               "--model", model_file, "--data", data_file,
               "--elements", *ELEMENTS, "--masses", "22.98976928", "35.453", "--out", out, "--steps", str(steps),
               "--record-every", str(record_every), "--timed-steps", str(timed_steps), "--threads", str(threads),
               "--comm-width", str(comm_width), *(["--atoms"] if atoms else []), *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads), MACE_ALLOW_CPU="1")
    if os.path.exists(out):
        os.remove(out)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"LAMMPS run failed (exit {done.returncode}): {' '.join(command)}\n"
                           f"--- stdout ---\n{done.stdout[-6000:]}\n--- stderr ---\n{done.stderr[-6000:]}")
    with open(out) as handle:
        return json.load(handle)


def versions() -> dict:
    """The library's benchmark versions, and mpi4py's, Cython's and the MPI's."""
    from importlib import metadata

    result = library_versions()
    for distribution in ("mpi4py", "cython"):
        try:
            result[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            pass
    try:
        result["mpi"] = subprocess.run([mpirun(), "--version"], capture_output=True, text=True).stdout.split("\n")[0:2]
    except (OSError, RuntimeError):
        pass
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, nargs="+", default=[4, 8],
                        help="conventional cells per side (4: 512 atoms, 8: 4096 atoms)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--variants", nargs="+", default=["mace", "accelerated"], choices=["mace", "accelerated"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--steps-large", type=int, default=None,
                        help="timed steps above 1000 atoms (default: --steps)")
    parser.add_argument("--threads", type=int, default=1, help="torch (and numba) threads per rank")
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--max-ell", type=int, default=3)
    parser.add_argument("--correlation", type=int, default=3)
    parser.add_argument("--r-max", type=float, default=6.0)
    parser.add_argument("--json", default="lammps_mliap.json", help="where to write the results")
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="lammps_mliap_")
    started = time.perf_counter()
    mace = mace_model(args.channels, args.max_ell, args.correlation, args.r_max)
    models = {"mace": export_mliap(mace, os.path.join(work, "mace-mliap.pt"))}
    if "accelerated" in args.variants:
        models["accelerated"] = export_mliap(accelerated(mace), os.path.join(work, "accelerated-mliap.pt"))
    setup_s = time.perf_counter() - started
    rows = []
    print(f"{cpu_name()}; model {args.channels}x0e+{args.channels}x1o, max_ell {args.max_ell}, correlation "
          f"{args.correlation}, r_max {args.r_max}, float64; models made and exported in {setup_s:.1f} s")
    print(f"{'atoms':>6} {'ranks':>5} {'threads':>7} {'variant':>12} {'steps/s':>9} {'s/step':>8} {'first call s':>12} "
          f"{'rank 0 MB':>9} {'load':>5}")
    for repeat in args.repeats:
        crystal = rocksalt(repeat)
        data = write_data(crystal, os.path.join(work, f"nacl-{repeat}.data"))
        steps = args.steps_large if (args.steps_large and len(crystal) > 1000) else args.steps
        for ranks in args.ranks:
            threads = args.threads
            for variant in args.variants:
                load_before = os.getloadavg()[0]
                result = run_lammps(models[variant], data, os.path.join(work, "out.json"), ranks=ranks,
                                    threads=threads, timed_steps=steps, comm_width=exchange_width(mace))
                row = {"atoms": len(crystal), "ranks": ranks, "threads_per_rank": threads, "variant": variant,
                       "steps": steps, "seconds": result["timed_seconds"],
                       "steps_per_second": result["steps_per_second"], "first_call_s": result["first_call_s"],
                       "final_pe": result["timed_final"]["pe"], "peak_rss_mb_rank0": result["peak_rss_mb_rank0"],
                       "load_average_1min": [load_before, os.getloadavg()[0]],
                       "lammps_version": result["lammps_version"]}
                rows.append(row)
                print(f"{row['atoms']:>6} {ranks:>5} {threads:>7} {variant:>12} {row['steps_per_second']:>9.4f} "
                      f"{1 / row['steps_per_second']:>8.3f} {row['first_call_s']:>12.2f} "
                      f"{row['peak_rss_mb_rank0']:>9.0f} {load_before:>5.1f}", flush=True)
    for row in rows:
        if row["variant"] == "accelerated":
            base = next((r for r in rows if r["variant"] == "mace" and r["atoms"] == row["atoms"]
                         and r["ranks"] == row["ranks"]), None)
            if base is not None:
                row["speedup_over_mace"] = row["steps_per_second"] / base["steps_per_second"]
    result = {"command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + list(argv or sys.argv[1:])),
              "cpu": cpu_name(), "versions": versions(),
              "model": {"channels": args.channels, "max_ell": args.max_ell, "correlation": args.correlation,
                        "r_max": args.r_max, "num_interactions": 2, "dtype": "float64"},
              "rows": rows}
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {args.json}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
