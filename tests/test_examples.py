"""The runnable examples under examples/, at their tiny sizes."""
import importlib.util
import re
import subprocess
import sys
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


@pytest.mark.slow
def test_invariant_energy_full_run_gives_the_tutorials_figures(capsys):
    """docs/tutorial.rst quotes the full run's errors (seconds with numba's kernels cached): they still hold."""
    text = (EXAMPLES.parent / "docs" / "tutorial.rst").read_text(encoding="utf-8")
    found = re.search(r"standardised energies from ([\d.]+) to ([\d.]+) on the\s+training clouds and from "
                      r"([\d.]+) to ([\d.]+) on the held-out ones, and the energy of a rotated cloud differs by at"
                      r"\s+most ([\d.e-]+) \(relative\)", text)
    assert found, "the tutorial's figures of the full run"
    train_before, train_after, test_before, test_after, invariance = map(float, found.groups())
    result = _load("invariant_energy").main([])
    capsys.readouterr()
    stated = (train_before, train_after, test_before, test_after)
    measured = (*result["train"], *result["test"])
    for got, want in zip(measured, stated):  # two significant digits, and a little room for other machines
        assert got == pytest.approx(want, rel=0.15), (measured, stated)
    assert result["invariance"] < 10 * invariance


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
    # 50 steps: with the tiny run's 25, the loss of 2 in 40 seeds had not yet fallen by a fifth (worst 0.90 of
    # its start); with 50 the worst of 40 seeds was 0.35
    result = example.main(["--tiny", "--steps", "50", "--seed", str(generator.initial_seed() % 2**31)])
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


def _run_example(name, *args):
    return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=EXAMPLES.parent)


@pytest.mark.parametrize("name", ["interaction_model", "invariant_energy"])
def test_example_help_mentions_only_options_it_accepts(name):
    """Every ``--option`` that ``--help`` mentions (in the description too) is one of the options it lists."""
    result = _run_example(name, "--help")
    assert result.returncode == 0, result.stderr
    description, listed = result.stdout.split("\noptions:\n", 1)
    accepted = set(re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", listed, re.M))
    # torchrun's own options, before the example's name, are not the example's
    text = re.sub(r"torchrun .*?examples/\w+\.py", "", result.stdout)
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", text))
    assert mentioned <= accepted, sorted(mentioned - accepted)
    if name == "interaction_model":
        assert {"--layers", "--atoms", "--steps", "--backend", "--batch", "--dtype", "--save"} <= accepted


def test_interaction_model_layers_and_atoms_set_the_model(monkeypatch):
    """``--layers``, ``--atoms``, ``--steps`` and ``--batch`` reach the model and the data (no training run: the
    model is built only)."""
    example = _load("interaction_model")
    seen = {}

    class Stop(Exception):
        pass

    def potential(config, backend):
        seen.update(config, backend=backend)
        raise Stop

    monkeypatch.setattr(example, "Potential", potential)
    with pytest.raises(Stop):
        example.main(["--tiny", "--layers", "1", "--atoms", "4", "--steps", "3", "--batch", "2"])
    assert (seen["layers"], seen["atoms"], seen["steps"], seen["batch"], seen["backend"]) == (1, 4, 3, 2, "ours")
    for bad in (["--layers", "0"], ["--atoms", "1"], ["--atoms", "many"], ["--batch", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            example.main(["--tiny", *bad])
        assert exit_info.value.code == 2


@pytest.mark.skipif(importlib.util.find_spec("cuequivariance") is not None
                    and importlib.util.find_spec("cuequivariance_torch") is not None,
                    reason="needs a machine without cuEquivariance")
def test_interaction_model_cueq_backend_without_cuequivariance_says_how_to_install():
    result = _run_example("interaction_model", "--tiny", "--backend", "cueq")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("interaction_model.py: error: --backend cueq needs cuEquivariance"), last
    assert "pip install cuequivariance-torch" in last
