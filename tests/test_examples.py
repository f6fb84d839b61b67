"""The runnable examples under examples/, at their tiny sizes."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from rotation_helpers import random_unit_vectors, real_sph_harm

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_invariant_energy_learns_and_is_rotation_invariant(capsys, generator):
    example = _load("invariant_energy")
    seed = str(generator.initial_seed())
    result = example.main(["--tiny", "--seed", seed])  # asserts the loss halves and the rotation checks itself
    out = capsys.readouterr().out
    assert "step    0  loss" in out and "rotating the held-out clouds" in out
    train_before, train_after = result["train"]
    assert train_after < train_before / 2
    assert result["test"][1] < result["test"][0]
    assert result["invariance"] < 1e-4 and result["equivariance"] < 1e-4


def test_invariant_energy_harmonics_are_the_library_basis():
    """The example's polynomial harmonics equal the Legendre-based ones of the test helpers."""
    example = _load("invariant_energy")
    unit = random_unit_vectors(np.random.default_rng(5), 50)
    got = example.real_spherical_harmonics(torch.from_numpy(unit), 4).numpy()
    expected = np.concatenate([real_sph_harm(l, unit) for l in range(5)], axis=1)
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_invariant_energy_target_is_rotation_invariant(generator):
    example = _load("invariant_energy")
    clouds = example.random_clouds(5, 6, generator)
    rotations = example.random_rotations(5, generator)
    assert torch.allclose(torch.linalg.det(rotations), torch.ones(5, dtype=torch.float64))
    rotated = clouds @ rotations.transpose(-1, -2)
    torch.testing.assert_close(example.target_energy(rotated), example.target_energy(clouds))
    # and it is not a constant: scaling the clouds changes it
    energy = example.target_energy(clouds)
    assert energy.abs().min() > 0 and not torch.allclose(energy, example.target_energy(clouds * 1.1))


@pytest.mark.slow
def test_interaction_model_learns_energies_and_forces(capsys, generator):
    """The NequIP-like potential trains (its loss falls), and its energies are invariant and forces equivariant
    under rotations."""
    example = _load("interaction_model")
    result = example.main(["--tiny", "--seed", str(generator.initial_seed() % 2**31)])
    out = capsys.readouterr().out
    assert "step    0  loss" in out and "rotating the molecules" in out
    first, last = result["loss"]
    assert last < 0.8 * first
    assert result["invariance"] < 1e-4 and result["equivariance"] < 1e-4


def test_interaction_model_targets_are_consistent(generator):
    """The made-up potential: forces are minus its gradient (finite differences), and it is invariant."""
    example = _load("interaction_model")
    positions, species = example.random_molecules(2, 5, generator)
    energies, forces = example.energies_and_forces(positions, species)
    step = 1e-6
    moved = positions.clone()
    moved[0, 1, 2] += step
    numeric = (example.target_energy(moved, species)[0] - energies[0]) / step
    assert abs(numeric + forces[0, 1, 2]) < 1e-4 * max(1.0, abs(forces[0, 1, 2].item()))
    from e3nn import o3

    rotation = o3.rand_matrix(dtype=torch.float64)
    torch.testing.assert_close(example.target_energy(positions @ rotation.T, species), energies)
