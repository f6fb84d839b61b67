"""``sparse_accumulation.mace.accelerate`` on MACE's own models (mace-torch 0.3.16, float64, random weights): energies,
forces and stress against the model before conversion, on batches of a periodic crystal and a molecule made by
MACE's data pipeline; parameter gradients of a force-training loss; the state dict both ways with ``strict=True``;
``torch.save``; MACE's ASE calculator and a few molecular-dynamics steps; single blocks; the options refused.
Skipped where mace-torch's package (with the packages its models, data and calculator import) is not importable."""
import copy
import importlib
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mace_models import CLASSES, RTOL, assert_close, batch, mace_model, modules, structures  # skips without MACE

ase = importlib.import_module("ase")
from e3nn import o3  # noqa: E402

from sparse_accumulation.e3nn import SphericalHarmonics  # noqa: E402
from sparse_accumulation.mace import Convolution, ElementLinear, SymmetricContraction, accelerate  # noqa: E402
from sparse_accumulation.mace.reshape import ReshapeIrreps  # noqa: E402


def assert_same_outputs(ours, theirs, data, stress=True):
    expected = theirs(dict(data), compute_stress=stress)
    got = ours(dict(data), compute_stress=stress)
    for key in ("energy", "node_energy", "forces") + (("stress",) if stress else ()):
        assert expected[key] is not None and got[key].dtype == torch.float64
        assert_close(got[key], expected[key], key)


def assert_converted(model):
    for block in model.interactions:
        assert isinstance(block.conv_tp, Convolution) and isinstance(block.reshape, ReshapeIrreps)
        skip = getattr(block, "skip_tp", None)  # (RealAgnosticAttResidualInteractionBlock has none)
        assert isinstance(skip, ElementLinear) or not isinstance(skip, o3.FullyConnectedTensorProduct)
    for block in model.products:
        assert isinstance(block.symmetric_contractions, SymmetricContraction)
    assert isinstance(model.spherical_harmonics, SphericalHarmonics)


@pytest.mark.parametrize("scale_shift", [True, False])
@pytest.mark.parametrize("interaction", [
    CLASSES[0], CLASSES[1], *[pytest.param(name, marks=pytest.mark.slow) for name in CLASSES[2:]]])
def test_energies_forces_and_stress_equal_maces(generator, interaction, scale_shift):
    model = mace_model(generator, interaction, scale_shift)
    ours = accelerate(copy.deepcopy(model))
    assert_converted(ours)
    assert_same_outputs(ours, model, batch(structures(generator), model))


@pytest.mark.slow
def test_higher_degrees_three_elements_and_correlation_two(generator):
    model = mace_model(generator, max_ell=3, correlation=2, hidden="8x0e + 8x1o + 8x2e", elements=3)
    ours = accelerate(copy.deepcopy(model))
    assert_same_outputs(ours, model, batch(structures(generator, elements=3), model))


def test_force_training_gradients_equal_maces(generator):
    """The gradients of every parameter of an energy and force loss (second derivatives through both layers)."""
    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    data = batch(structures(generator), model)
    for module in (model, ours):
        out = module(dict(data), training=True)
        (out["energy"].square().sum() + out["forces"].square().sum()).backward()
    compared = 0
    for (name, theirs), mine in zip(model.named_parameters(), (ours.get_parameter(n) for n, _ in
                                                               model.named_parameters())):
        if theirs.grad is None:
            assert mine.grad is None or not mine.grad.any(), name
            continue
        assert_close(mine.grad, theirs.grad, name)
        compared += 1
    assert compared == sum(p.requires_grad for p in model.parameters())


def test_state_dict_loads_both_ways_strictly(generator):
    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in model.state_dict().items()}
    data = batch(structures(generator), model)
    other = mace_model(generator)  # the same architecture, other weights: a checkpoint into the converted model
    ours.load_state_dict(other.state_dict(), strict=True)
    assert_same_outputs(ours, other, data)
    ours.load_state_dict(mace_model(generator).state_dict(), strict=True)
    model.load_state_dict(ours.state_dict(), strict=True)  # and back into MACE
    assert_same_outputs(ours, model, data)


def test_a_state_with_other_convolution_coefficients_is_refused(generator):
    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    state = model.state_dict()
    state["interactions.1.conv_tp.output_mask"] = torch.zeros_like(state["interactions.1.conv_tp.output_mask"])
    with pytest.raises(RuntimeError, match=r"interactions\.1\.conv_tp\.output_mask: the values differ"):
        ours.load_state_dict(state)


def test_torch_save_and_load(generator, tmp_path):
    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    torch.save(ours, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert_converted(loaded)
    assert_same_outputs(loaded, model, batch(structures(generator), model))
    buffer = io.BytesIO()
    torch.save(loaded.state_dict(), buffer)
    buffer.seek(0)
    model.load_state_dict(torch.load(buffer), strict=True)


def test_maces_calculator_and_molecular_dynamics(generator, tmp_path):
    """MACE's ASE calculator loads the saved model: energy, forces, stress equal MACE's, and so do a few steps of
    velocity Verlet dynamics; float32 (the calculator's conversion) within float32 rounding."""
    from ase.md.verlet import VelocityVerlet
    from mace.calculators import MACECalculator

    model = mace_model(generator)
    torch.save(model, tmp_path / "mace.model")
    torch.save(accelerate(copy.deepcopy(model)), tmp_path / "accelerated.model")
    crystal = structures(generator)[0]
    results = {}
    for name in ("mace", "accelerated"):
        atoms = crystal.copy()
        atoms.calc = MACECalculator(model_paths=str(tmp_path / f"{name}.model"), device="cpu",
                                    default_dtype="float64")
        first = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
        atoms.set_momenta(np.full((len(atoms), 3), 0.05))
        VelocityVerlet(atoms, timestep=0.5 * ase.units.fs).run(5)
        results[name] = (*first, atoms.get_positions(), atoms.get_potential_energy())
    for what, ours, theirs in zip(["energy", "forces", "stress", "positions after 5 steps", "energy after 5 steps"],
                                  results["accelerated"], results["mace"]):
        assert np.abs(np.asarray(ours) - theirs).max() <= RTOL * np.abs(theirs).max(), what
    atoms = crystal.copy()
    atoms.calc = MACECalculator(model_paths=str(tmp_path / "accelerated.model"), device="cpu",
                                default_dtype="float32")
    assert abs(atoms.get_potential_energy() - results["mace"][0]) <= 1e-5 * abs(results["mace"][0])


_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.slow
@pytest.mark.parametrize("device, mode", [("cpu", "default"), pytest.param("cuda", "default", marks=_CUDA),
                                          pytest.param("cuda", "reduce-overhead", marks=_CUDA)])
def test_torch_compile_molecular_dynamics_and_training_steps(device, mode, tmp_path):
    """``torch.compile`` of a converted model: an MD step's energies, forces and stress and a training step's
    parameter gradients equal MACE's eager ones (``mace_compiled.py``, in a process of its own; on CUDA
    inductor generates Triton code for the layers' index arithmetic too, and ``reduce-overhead`` replays the MD
    step as CUDA graphs)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    if mode == "reduce-overhead":  # the kernels compile inside the first call's CUDA graph warm-up (docs/mace.rst)
        env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), SPARSE_ACCUMULATION_TRITON_CACHE=str(tmp_path / "sa"),
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    done = subprocess.run([sys.executable, os.path.join(here, "mace_compiled.py"), device, mode], env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode == 3:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_maces_jit_compile_scripts_the_converted_model(generator, tmp_path):
    """MACE's ``jit.compile`` (e3nn's, as MACE scripts models for LAMMPS and ``run_train`` exports them) scripts a
    converted model: energies, forces and stress equal MACE's, also after ``torch.jit.save`` and ``load``; the
    eager model keeps its edge check."""
    from e3nn.util import jit

    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    scripted = jit.compile(ours)
    assert isinstance(scripted, torch.jit.ScriptModule)
    torch.jit.save(scripted, str(tmp_path / "model.pt"))
    data = batch(structures(generator), model)
    expected = model(dict(data), compute_stress=True)
    for module in (scripted, torch.jit.load(str(tmp_path / "model.pt"))):
        got = module(dict(data), compute_stress=True)
        for key in ("energy", "forces", "stress"):
            assert_close(got[key], expected[key], key)
    assert any(hook.__name__ == "prepare_edges_first" for hook in ours._forward_pre_hooks.values())
    assert_same_outputs(ours, model, data)
    # MACE's LAMMPS export (pair_style mace) scripts the model inside its LAMMPS_MACE wrapper
    from mace.calculators import LAMMPS_MACE

    crystal = batch(structures(generator)[:1], model)
    local = torch.ones(crystal["positions"].shape[0], dtype=torch.float64)
    got = jit.compile(LAMMPS_MACE(ours))(dict(crystal), local, compute_virials=True)
    expected = LAMMPS_MACE(copy.deepcopy(model))(dict(crystal), local, compute_virials=True)
    for key in ("total_energy_local", "forces", "virials"):
        assert_close(got[key], expected[key], key)


def test_the_edge_check_is_traced_whole_by_torch_compile(generator):
    """MACE compiles with ``fullgraph=True``: the converted model's forward pre-hook must not break the graph."""
    from sparse_accumulation.mace.accelerate import prepare_edges_first

    model = accelerate(mace_model(generator))
    data = batch(structures(generator), model)
    check = torch.compile(lambda d: prepare_edges_first(model, (d,), {}), fullgraph=True, backend="eager")
    assert check(data) is None


def test_hessians_equal_maces(generator):
    """MACE's ``compute_hessian=True`` (second derivatives of the energy by positions, e.g. for phonons); the
    converted layers' autograd functions do not run under ``torch.vmap``, so MACE takes its loop over rows."""
    model = mace_model(generator)
    data = batch(structures(generator), model)
    expected = model(dict(data), compute_hessian=True)["hessian"]
    got = accelerate(copy.deepcopy(model))(dict(data), compute_hessian=True)["hessian"]
    assert got.shape == expected.shape and expected.abs().max() > 0
    assert_close(got, expected, "hessian")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_md_step_captured_in_a_cuda_graph_replays_new_positions(generator):
    """A converted model's energies-and-forces call captured once (``torch.cuda.graph``, as MD codes capture their
    step), then replayed with new positions copied into the captured input: MACE's forces each time."""
    model = mace_model(generator).cuda()
    data = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch(structures(generator), model).items()}
    ours = accelerate(copy.deepcopy(model))
    static = data["positions"].detach().clone().requires_grad_(True)

    def forces():
        return ours(dict(data, positions=static), compute_force=True)["forces"]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up calls on a side stream, as torch asks before a capture
        for _ in range(3):
            forces()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forces()
    for _ in range(2):
        positions = data["positions"] + 0.02 * torch.randn(static.shape, generator=generator,
                                                           dtype=static.dtype).cuda()
        with torch.no_grad():
            static.copy_(positions)
        graph.replay()
        expected = model(dict(data, positions=positions.clone().requires_grad_(True)), compute_force=True)
        assert_close(captured, expected["forces"], "forces")


def test_single_blocks(generator):
    """An interaction block and a product block given alone; a second conversion changes nothing."""
    model = mace_model(generator)
    ours = copy.deepcopy(model)
    block = accelerate(ours.interactions[1])
    assert isinstance(block.conv_tp, Convolution) and hasattr(block, "conv_fusion")
    assert not isinstance(ours.products[1].symmetric_contractions, SymmetricContraction)
    accelerate(ours.products[1])
    assert isinstance(ours.products[1].symmetric_contractions, SymmetricContraction)
    data = batch(structures(generator), model)
    assert_same_outputs(ours, model, data)
    converted = [ours.interactions[1].conv_tp, ours.products[1].symmetric_contractions]
    accelerate(ours)
    accelerate(ours)
    assert [ours.interactions[1].conv_tp, ours.products[1].symmetric_contractions] == converted
    assert_converted(ours)
    assert_same_outputs(ours, model, data)


def _types(model) -> list:
    return [type(m) for m in model.modules()]


def test_enabled_cuequivariance_or_openequivariance_is_refused(generator):
    model = mace_model(generator)
    cueq = modules.wrapper_ops.CuEquivarianceConfig()
    cueq.enabled = True  # as in a model MACE built with cuequivariance installed
    model.interactions[1].cueq_config = cueq
    model.products[0].oeq_config = modules.wrapper_ops.OEQConfig()
    model.products[0].oeq_config.enabled = True
    before = _types(model)
    with pytest.raises(NotImplementedError, match=r"cueq_config \(enabled: cuEquivariance kernels\) in "
                                                  r"interactions\.1.*oeq_config .* in products\.0"):
        accelerate(model)
    assert _types(model) == before


def test_unknown_interaction_blocks_are_refused_or_kept(generator):
    model = mace_model(generator)
    Subclass = type("MyInteractionBlock", (modules.RealAgnosticResidualInteractionBlock,), {})
    model.interactions[1].__class__ = Subclass
    before = _types(model)
    with pytest.raises(NotImplementedError, match=r"interaction block class .*MyInteractionBlock \(interactions\.1; "
                                                  r"pass keep_unknown=True"):
        accelerate(model)
    assert _types(model) == before
    ours = accelerate(copy.deepcopy(model), keep_unknown=True)
    assert isinstance(ours.interactions[0].conv_tp, Convolution)
    assert isinstance(ours.interactions[1].conv_tp, o3.TensorProduct) and not hasattr(ours.interactions[1],
                                                                                       "conv_fusion")
    assert all(isinstance(p.symmetric_contractions, SymmetricContraction) for p in ours.products)
    assert_same_outputs(ours, model, batch(structures(generator), model))


def test_other_layers_in_place_of_maces_are_refused(generator):
    model = mace_model(generator)
    model.interactions[0].conv_tp = torch.nn.Identity()
    model.products[1].symmetric_contractions = torch.nn.Identity()
    with pytest.raises(NotImplementedError, match=r"convolution of type torch\.nn\.modules\.linear\.Identity in "
                                                  r"interactions\.0.*symmetric contraction of type .*Identity in "
                                                  r"products\.1"):
        accelerate(model)


def test_what_is_not_a_mace_model_is_refused():
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        accelerate("model.pt")
    with pytest.raises(TypeError, match="holds no MACE interaction or product block"):
        accelerate(torch.nn.Linear(2, 2))


def test_without_maces_package_the_error_says_so(monkeypatch):
    for name in [n for n in sys.modules if n == "mace" or n.startswith("mace.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mace", None)
    with pytest.raises(ImportError, match="needs mace-torch"):
        accelerate(torch.nn.Linear(2, 2))


def test_the_edges_are_checked_once_before_the_model_runs(generator, monkeypatch):
    """A converted model reads its batch's ``edge_index`` values once, at its start (both interactions'
    convolutions find the checked rows), and a new ``edge_index`` is read again; the outputs stay MACE's."""
    from sparse_accumulation import indices

    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    accelerate(ours)  # converting again adds no second hook
    data = batch(structures(generator), model)
    reads = []
    real = indices._summary
    monkeypatch.setattr(indices, "_summary", lambda t: reads.append(t.shape[0]) or real(t))
    at_embedding = []
    ours.node_embedding.register_forward_pre_hook(lambda module, args: at_embedding.append(len(reads)))
    assert_same_outputs(ours, model, data)
    assert reads == [data["edge_index"].shape[1]] * 2  # senders and receivers, once for both interactions
    assert at_embedding == [2]  # before the model's first layer
    fresh = dict(data, edge_index=data["edge_index"].clone())
    assert_same_outputs(ours, model, fresh)
    assert len(reads) == 4
