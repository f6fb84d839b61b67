"""LAMMPS runs a MACE model converted by ``sparse_accumulation.mace.accelerate`` through its ML-IAP interface
(``pair_style mliap unified``, MACE's ``LAMMPS_MLIAP_MACE``), on one MPI rank and across two and four.

References: MACE's own (unconverted) model through ASE's ``MACECalculator``, float64. Every LAMMPS run is a
subprocess (``mpirun -np N python scripts/lammps_mliap_run.py``), so that a crash of LAMMPS or MPI fails a test
instead of ending pytest.

Skips where no LAMMPS with the ML-IAP (and its Python coupling), PYTHON and KOKKOS packages is importable as the
``lammps`` Python module (``scripts/build_lammps.sh`` builds one and installs the module into the active Python), or
where mace-torch, ASE or ``mpirun`` is missing. ``SPARSE_ACCUMULATION_LAMMPS_PYTHONPATH`` names a folder holding
LAMMPS's ``lammps`` package to use instead of the installed one.
"""
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-10
NEEDED_PACKAGES = ("ML-IAP", "PYTHON", "KOKKOS")

_PROBE = """
import json, sys
from lammps import lammps
lmp = lammps(cmdargs=["-nocite", "-log", "none", "-screen", "none"])
report = {"version": lmp.version(), "packages": sorted(lmp.installed_packages)}
try:
    import lammps.mliap
    lammps.mliap.activate_mliappy(lmp)
    lammps.mliap.activate_mliappy_kokkos(lmp)
    report["mliap_python"] = True
except Exception as error:
    report["mliap_python"] = repr(error)
lmp.close()
print("PROBE" + json.dumps(report))
"""


def _environment() -> dict:
    env = dict(os.environ, MACE_ALLOW_CPU="1", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    extra = os.environ.get("SPARSE_ACCUMULATION_LAMMPS_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([extra] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@functools.lru_cache(maxsize=None)
def lammps_or_reason():
    """``(report, None)`` for a usable LAMMPS (probed in a subprocess), else ``(None, why not)``."""
    for name in ("mace", "ase", "e3nn"):
        if importlib.util.find_spec(name) is None:
            return None, f"{name} is not installed"
    if shutil.which("mpirun") is None and shutil.which("mpiexec") is None:
        return None, "no mpirun or mpiexec on PATH (install an MPI: scripts/build_lammps.sh --check-deps)"
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                              env=_environment())
    except subprocess.TimeoutExpired:
        return None, "probing LAMMPS's Python module timed out"
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, (f"no usable LAMMPS Python module ({last}); build one with scripts/build_lammps.sh or set "
                      "SPARSE_ACCUMULATION_LAMMPS_PYTHONPATH")
    report = json.loads(lines[0][len("PROBE"):])
    missing = [p for p in NEEDED_PACKAGES if p not in report["packages"]]
    if missing:
        return None, (f"LAMMPS {report['version']} lacks the packages {missing} (has {report['packages']}); "
                      "build it with scripts/build_lammps.sh")
    if report["mliap_python"] is not True:
        return None, (f"LAMMPS {report['version']} has no ML-IAP Python coupling for KOKKOS "
                      f"({report['mliap_python']}); build it with MLIAP_ENABLE_PYTHON (scripts/build_lammps.sh)")
    return report, None


@pytest.fixture(scope="module")
def bench():
    report, reason = lammps_or_reason()
    if report is None:
        pytest.skip(reason)
    spec = importlib.util.spec_from_file_location("lammps_mliap_bench", ROOT / "benchmarks" / "lammps_mliap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(bench, tmp_path_factory):
    """A small float64 MACE model for Na and Cl, saved for ASE; MACE's model and the accelerated one exported for
    ML-IAP; a rattled 2x2x2 rock-salt crystal (64 atoms) as a LAMMPS data file."""
    import torch

    work = tmp_path_factory.mktemp("lammps")
    model = bench.mace_model(channels=8, max_ell=2, correlation=3, r_max=5.0, seed=7)
    torch.save(model, work / "mace.model")
    crystal = bench.rocksalt(2, rattle=0.1, seed=3)
    return {
        "work": work, "crystal": crystal, "mace_file": str(work / "mace.model"), "width": bench.exchange_width(model),
        "accelerated": bench.export_mliap(bench.accelerated(model), str(work / "accelerated-mliap.pt")),
        "mace": bench.export_mliap(model, str(work / "mace-mliap.pt")),
        "data": bench.write_data(crystal, str(work / "nacl.data")),
    }


@pytest.fixture(scope="module")
def calculator(setup):
    from mace.calculators import MACECalculator

    return MACECalculator(model_paths=setup["mace_file"], device="cpu", default_dtype="float64")


def _run(bench, setup, name, **kwargs):
    out = str(setup["work"] / f"{name}-{kwargs.get('ranks', 1)}.json")
    return bench.run_lammps(setup[name], setup["data"], out, timeout=900, comm_width=setup["width"], **kwargs)


def _reference(calculator, crystal, positions):
    """MACE's energy, forces and stress (eV, eV/A, eV/A^3, 3x3) through ASE at LAMMPS's positions (atom-id
    order = the crystal's)."""
    atoms = crystal.copy()
    atoms.positions = np.asarray(positions)
    atoms.calc = calculator
    return atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress(voigt=False)


def _stress(record, run):
    """The virial stress in ASE's convention (eV/A^3, 3x3) from LAMMPS's virial pressure (bar, xx yy zz xy xz yz)."""
    xx, yy, zz, xy, xz, yz = (-p / run["nktv2p"] for p in record["pvir"])
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


def _close(ours, theirs, what, rtol=RTOL):
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    scale = np.abs(theirs).max()
    error = np.abs(ours - theirs).max()
    assert error <= rtol * scale, f"{what}: error {error:.3g} for values up to {scale:.3g}"


@pytest.mark.parametrize("name", ["accelerated", "mace"])
def test_single_point_matches_mace_through_ase(bench, setup, calculator, name):
    run = _run(bench, setup, name, atoms=True)
    record = run["records"][0]
    energy, forces, stress = _reference(calculator, setup["crystal"], record["positions"])
    assert run["natoms"] == 64 and run["nprocs"] == 1
    _close(record["pe"], energy, f"{name}: energy")
    _close(record["forces"], forces, f"{name}: forces")
    _close(_stress(record, run), stress, f"{name}: stress")


def test_nve_run_matches_mace_and_conserves_energy(bench, setup, calculator):
    run = _run(bench, setup, "accelerated", steps=50, record_every=1, atoms=True)
    records = run["records"]
    assert [r["step"] for r in records] == list(range(51))
    for record in records[::25]:  # MACE's model at LAMMPS's positions along the trajectory
        energy, forces, stress = _reference(calculator, setup["crystal"], record["positions"])
        _close(record["pe"], energy, f"step {record['step']}: energy")
        _close(record["forces"], forces, f"step {record['step']}: forces")
        _close(_stress(record, run), stress, f"step {record['step']}: stress")
    total = np.array([r["etotal"] for r in records])
    swing = np.ptp([r["pe"] for r in records])
    assert swing > 1e-3, f"the potential energy changed by {swing:.3g} eV only: the run tests nothing"
    drift = np.abs(total - total[0]).max()
    assert drift < 1e-3 * swing, f"the total energy moved by {drift:.3g} eV (the potential energy by {swing:.3g} eV)"


@pytest.fixture(scope="module")
def one_rank(bench, setup):
    return _run(bench, setup, "accelerated", ranks=1, steps=100, record_every=10, atoms=True)


@pytest.mark.parametrize("ranks", [2, 4])
def test_several_ranks_give_one_ranks_forces_and_trajectory(bench, setup, one_rank, ranks):
    """``mpirun -np 2`` and ``-np 4`` (more ranks than this machine's cores is fine for MPICH and Open MPI's
    ``--oversubscribe``: the check is of the results, not the speed) along 100 NVE steps."""
    several = _run(bench, setup, "accelerated", ranks=ranks, steps=100, record_every=10, atoms=True)
    assert several["nprocs"] == ranks
    for a, b in zip(one_rank["records"], several["records"], strict=True):
        step = a["step"]
        assert b["step"] == step
        _close(b["positions"], a["positions"], f"step {step}: positions")
        _close(b["forces"], a["forces"], f"step {step}: forces")
        _close(b["pe"], a["pe"], f"step {step}: potential energy")
        _close(b["etotal"], a["etotal"], f"step {step}: total energy")
        _close(b["pvir"], a["pvir"], f"step {step}: virial pressure")
