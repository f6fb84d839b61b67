"""Run a MACE model exported for LAMMPS's ML-IAP interface (``pair_style mliap unified``) on a LAMMPS data file,
through LAMMPS's Python module, and write what it computed as JSON (from MPI rank 0).

Run it under MPI for several ranks (``mpirun -np 2 python scripts/lammps_mliap_run.py ...``). The LAMMPS build needs
the ML-IAP (with Python support), PYTHON and KOKKOS packages (``scripts/build_lammps.sh``): MACE's ML-IAP class
exchanges ghost-atom features through the KOKKOS ML-IAP data object, which runs on the CPU with Kokkos's Serial or
OpenMP back end (``MACE_ALLOW_CPU=1``, which this script sets). The model file's classes are imported as it loads
(``sparse_accumulation``'s for a model converted with :func:`sparse_accumulation.mace.accelerate`).

Single points and molecular dynamics (``--steps N``: velocity Verlet, NVE, ``--temperature`` for the initial
velocities) record, for the initial configuration and after every ``--record-every`` steps: the potential, kinetic
and total energies (eV), the virial part of the pressure tensor (bar, LAMMPS's order xx yy zz xy xz yz), and
optionally the positions and forces of every atom in the order of their LAMMPS ids. ``--timed-steps N`` adds a
timed ``run N pre no`` (after the recorded ones; LAMMPS's setup and the model's first call are the ``run 0`` before
them) and reports its steps per second.
"""
import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the ML-IAP model file (torch.save of MACE's LAMMPS_MLIAP_MACE)")
    parser.add_argument("--data", required=True, help="LAMMPS data file (atom_style atomic, metal units)")
    parser.add_argument("--elements", nargs="+", required=True, help="element of each LAMMPS atom type, in order")
    parser.add_argument("--masses", nargs="+", type=float, required=True, help="mass of each atom type (g/mol)")
    parser.add_argument("--out", required=True, help="JSON file to write (rank 0)")
    parser.add_argument("--steps", type=int, default=0, help="recorded NVE steps")
    parser.add_argument("--record-every", type=int, default=1, help="record every this many steps")
    parser.add_argument("--timed-steps", type=int, default=0, help="steps of the timed run after the recorded ones")
    parser.add_argument("--timestep", type=float, default=0.001, help="ps")
    parser.add_argument("--temperature", type=float, default=300.0, help="initial temperature (K)")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the initial velocities")
    parser.add_argument("--skin", type=float, default=1.0, help="neighbour-list skin (Angstrom)")
    parser.add_argument("--atoms", action="store_true", help="record positions and forces too")
    parser.add_argument("--no-kokkos", action="store_true",
                        help="run without the KOKKOS package (MACE's ML-IAP class then fails: see the docs)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--comm-width", type=int, default=0,
                        help="doubles per atom that LAMMPS's communication buffers must hold (the widest feature "
                             "vector MACE's class exchanges between ranks); 0: no padding")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if len(args.elements) != len(args.masses):
        raise SystemExit(f"--elements ({len(args.elements)}) and --masses ({len(args.masses)}) must match")
    os.environ.setdefault("MACE_ALLOW_CPU", "1")

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from lammps import LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR, lammps

    cmdargs = ["-nocite", "-log", "none", "-screen", "none"]
    if not args.no_kokkos:
        cmdargs += ["-k", "on", "-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]
    lmp = lammps(cmdargs=cmdargs)
    try:
        missing = {"ML-IAP", "PYTHON"} - set(lmp.installed_packages)
        if missing:
            raise SystemExit(f"this LAMMPS lacks the packages {sorted(missing)}: build it with scripts/build_lammps.sh")
        rank, nprocs = _rank_and_size(lmp)
        activate_mliap_python(lmp, kokkos=not args.no_kokkos)
        commands = ["units metal", "atom_style atomic", "atom_modify map array", "boundary p p p",
                    f"read_data {args.data}"]
        commands += [f"mass {i + 1} {m!r}" for i, m in enumerate(args.masses)]
        if args.comm_width:
            commands += [comm_width_fix(args.comm_width)]
        commands += [f"pair_style mliap unified {args.model} 0",
                     "pair_coeff * * " + " ".join(args.elements),
                     f"neighbor {args.skin} bin", "neigh_modify every 1 delay 0 check yes",
                     f"timestep {args.timestep!r}",
                     "compute pvir all pressure NULL virial",
                     "thermo_style custom step pe ke etotal " + " ".join(f"c_pvir[{i}]" for i in range(1, 7)),
                     "thermo_modify norm no format float %.17g", "thermo 1"]
        if args.steps or args.timed_steps:
            commands += [f"velocity all create {args.temperature!r} {args.seed} mom yes rot yes dist gaussian",
                         "fix integrate all nve"]
        for command in commands:
            lmp.command(command)

        records = []

        def record(step):
            pvir = lmp.extract_compute("pvir", LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR)
            entry = {"step": step, "pe": lmp.get_thermo("pe"), "ke": lmp.get_thermo("ke"),
                     "etotal": lmp.get_thermo("etotal"), "pvir": [float(pvir[i]) for i in range(6)]}
            if args.atoms:  # collective: every rank takes part, in the order of the atom ids
                natoms = lmp.get_natoms()
                x = np.ctypeslib.as_array(lmp.gather_atoms("x", 1, 3), shape=(natoms * 3,)).reshape(natoms, 3)
                f = np.ctypeslib.as_array(lmp.gather_atoms("f", 1, 3), shape=(natoms * 3,)).reshape(natoms, 3)
                entry["positions"] = x.tolist()
                entry["forces"] = f.tolist()
            records.append(entry)

        started = time.perf_counter()
        lmp.command("run 0")
        first_call = time.perf_counter() - started
        record(0)
        done = 0
        while done < args.steps:
            chunk = min(args.record_every, args.steps - done)
            lmp.command(f"run {chunk} pre no post no")
            done += chunk
            record(done)

        result = {"lammps_version": lmp.version(), "nprocs": nprocs, "natoms": lmp.get_natoms(),
                  "kokkos": not args.no_kokkos, "torch_threads": args.threads, "first_call_s": first_call,
                  "volume": _volume(lmp), "nktv2p": lmp.extract_global("nktv2p"), "records": records}
        if args.timed_steps:
            started = time.perf_counter()
            lmp.command(f"run {args.timed_steps} pre no post no")
            elapsed = time.perf_counter() - started
            result.update(timed_steps=args.timed_steps, timed_seconds=elapsed,
                          steps_per_second=args.timed_steps / elapsed,
                          timed_final={"pe": lmp.get_thermo("pe"), "etotal": lmp.get_thermo("etotal")})
        import resource

        result["peak_rss_mb_rank0"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if rank == 0:
            with open(args.out, "w") as handle:
                json.dump(result, handle)
    finally:
        lmp.close()
        # lammps.finalize() would also finalize the Python interpreter this script runs in
        lmp.lib.lammps_kokkos_finalize()
        lmp.lib.lammps_mpi_finalize()


def comm_width_fix(width: int) -> str:
    """The LAMMPS command that makes every ghost atom carry ``width`` doubles more in LAMMPS's border
    communication, so that its communication buffers hold ``width`` doubles per atom.

    On a CPU build of KOKKOS, the ML-IAP pair style's ghost exchange (``forward_exchange``/``reverse_exchange``, which
    MACE's class calls once per message-passing layer after the first) goes through LAMMPS's host communication,
    which sizes its buffers when the run is set up, from the widths that pair styles, fixes and computes declare
    then; ML-IAP declares its width only when it exchanges, so a wider feature vector overruns the buffers (heap
    corruption: ``corrupted double-linked list``, ``free(): invalid pointer``). A per-atom array of ``width``
    values that travels with the ghost atoms (``fix property/atom ... ghost yes``) makes the buffers wide enough."""
    return f"fix sa_comm_width all property/atom d2_sa_comm_width {int(width)} ghost yes"


def activate_mliap_python(lmp, kokkos: bool = True):
    """Make ML-IAP's Python coupling modules (compiled into LAMMPS's library) importable in this interpreter, as a
    LAMMPS driven from Python needs before ``pair_style mliap unified``; a clear error where LAMMPS was built
    without them (``MLIAP_ENABLE_PYTHON``)."""
    import lammps.mliap

    try:
        lammps.mliap.activate_mliappy(lmp)
        if kokkos:
            lammps.mliap.activate_mliappy_kokkos(lmp)
    except (ImportError, AttributeError) as error:
        raise SystemExit(f"this LAMMPS has no ML-IAP Python coupling{' for KOKKOS' if kokkos else ''} ({error}): "
                         "build it with scripts/build_lammps.sh (MLIAP_ENABLE_PYTHON, PYTHON, KOKKOS)") from error


def _rank_and_size(lmp):
    """This process's MPI rank and the number of ranks of LAMMPS's communicator."""
    return lmp.extract_setting("world_rank"), lmp.extract_setting("world_size")


def _volume(lmp):
    boxlo, boxhi, xy, yz, xz, periodicity, box_change = lmp.extract_box()
    return float((boxhi[0] - boxlo[0]) * (boxhi[1] - boxlo[1]) * (boxhi[2] - boxlo[2]))


if __name__ == "__main__":
    sys.exit(main())
