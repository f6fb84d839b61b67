"""``sparse_accumulation.mace.Calculator``: an ASE calculator that builds MACE's batch once and then only moves it.
Its energy, per-atom energies, forces and stress equal MACE's own calculator's (``MACECalculator(models=...)``)
on a periodic crystal and a molecule, at the first step, after moves (the batch updated) and after changes that
rebuild it; with MACE's model, a converted one and a CapturedModel of it; a velocity-Verlet run follows MACE's
calculator's trajectory (float64)."""
import copy

import numpy as np
import pytest
import torch

from mace_models import RTOL, mace_model, structures  # skips without MACE

from sparse_accumulation.mace import CapturedModel, accelerate  # noqa: E402

PROPERTIES = ("energy", "free_energy", "energies", "forces", "stress")


def _results(atoms, calculator) -> dict:
    atoms = atoms.copy()
    atoms.calc = calculator
    found = {"energy": atoms.get_potential_energy(), "free_energy": atoms.get_potential_energy(force_consistent=True),
             "energies": atoms.get_potential_energies(), "forces": atoms.get_forces()}
    if atoms.pbc.any():
        found["stress"] = atoms.get_stress()
    return found


def _assert_close(got: dict, expected: dict, what: str):
    assert got.keys() == expected.keys(), what
    for key in got:
        scale = max(np.abs(expected[key]).max(), 1e-300)
        assert np.abs(np.asarray(got[key]) - expected[key]).max() <= RTOL * scale, f"{what}: {key}"


@pytest.mark.parametrize("kind", ["mace", "accelerated", "captured"])
def test_results_equal_maces_calculator_through_moves_and_rebuilds(monkeypatch, generator, kind):
    """Moves update the batch (MACE's pipeline runs only for the first structure, new elements, a new cell and the
    next structure: 5 times over 9 calculations), neighbour lists included."""
    from mace.calculators import MACECalculator

    from sparse_accumulation.mace import Calculator

    builds, built = [], Calculator._built
    monkeypatch.setattr(Calculator, "_built", lambda self, atoms: builds.append(len(atoms)) or built(self, atoms))

    model = mace_model(generator)
    ours = {"mace": copy.deepcopy(model), "accelerated": accelerate(copy.deepcopy(model)),
            "captured": CapturedModel(accelerate(copy.deepcopy(model)), cpu="padded")}[kind]
    theirs = MACECalculator(models=model, device="cpu", default_dtype="float64")
    calculator = Calculator(ours, device="cpu", default_dtype="float64")
    rng = np.random.default_rng(int(torch.randint(2 ** 31, (1,), generator=generator)))
    edges = []
    for start in structures(generator):
        atoms = start.copy()
        def move(a):
            a.set_positions(a.positions + rng.normal(0, 0.05, a.positions.shape))

        def move_far(a):  # (the neighbour list changes)
            a.set_positions(a.positions + rng.normal(0, 0.5, a.positions.shape))

        def swap_first_element(a):
            numbers = a.numbers.copy()
            numbers[0] = next(int(z) for z in model.atomic_numbers if int(z) != numbers[0])
            a.set_atomic_numbers(numbers)

        steps = [("first", lambda a: None), ("moved", move), ("moved far", move_far),
                 ("element changed", swap_first_element)]
        if start.pbc.any():
            steps.append(("cell changed", lambda a: a.set_cell(a.cell * 1.02, scale_atoms=True)))
        for what, change in steps:
            change(atoms)
            atoms.calc = calculator
            got = {key: copy.deepcopy(value) for key, value in _results(atoms, calculator).items()}
            _assert_close(got, _results(atoms, theirs), f"{kind}, {'crystal' if start.pbc.any() else 'molecule'}, "
                                                        f"{what}")
            edges.append(calculator._batch["edge_index"].clone())
    assert len(builds) == 5
    assert not torch.equal(edges[1], edges[2])  # the crystal's neighbour list changed between its moves


def test_dynamics_follow_maces_calculator(generator):
    from ase import units
    from ase.md.verlet import VelocityVerlet
    from mace.calculators import MACECalculator

    from sparse_accumulation.mace import Calculator

    model = mace_model(generator)
    crystal = structures(generator)[0]
    momenta = np.random.default_rng(int(torch.randint(2 ** 31, (1,), generator=generator))).normal(
        0.0, 0.3, (len(crystal), 3))
    runs = []
    for calculator in (MACECalculator(models=model, device="cpu", default_dtype="float64"),
                       Calculator(accelerate(copy.deepcopy(model)), device="cpu")):
        atoms = crystal.copy()
        atoms.calc = calculator
        atoms.set_momenta(momenta)
        energies = []
        dynamics = VelocityVerlet(atoms, timestep=0.25 * units.fs)
        dynamics.attach(lambda: energies.append(atoms.get_total_energy()))
        dynamics.run(8)
        runs.append((atoms.get_positions(), np.array(energies)))
    for got, expected in zip(runs[1], runs[0]):
        assert np.abs(got - expected).max() <= RTOL * np.abs(expected).max()


def test_what_is_not_a_mace_model_is_refused():
    from sparse_accumulation.mace import Calculator

    with pytest.raises(ValueError, match="model must be a MACE model"):
        Calculator(torch.nn.Linear(2, 2))
    model = mace_model(torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="default_dtype must be 'float64' or 'float32'"):
        Calculator(model, default_dtype="float16")
    with pytest.raises(ValueError, match=r"head must be one of the model's heads \['Default'\], got 'other'"):
        Calculator(model, head="other")
