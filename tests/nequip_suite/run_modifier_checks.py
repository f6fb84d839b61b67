"""The modifier on a NequIP model built by NequIP's constructor, against the same model unmodified (float64, a
random periodic crystal): energies, forces, stress and the gradients of a force-training loss; state dicts; the
ways a user applies it (Python, ``nequip.model.modify``, NequIP's discovery of modifiers); AOTInductor export with
``nequip.utils.aot.aot_export_model`` (what ``nequip-compile`` runs). Run by ``tests/test_nequip.py`` in a child
pytest (NequIP's fixtures change process-wide state)."""
import copy

import numpy as np
import pytest
import torch
from ase import Atoms
from nequip.data import AtomicDataDict, from_ase
from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper, NeighborListTransform
from nequip.model import NequIPGNNModel, modify
from nequip.model.modify_utils import get_all_modifiers
from nequip.utils.global_state import set_global_state

import sparse_accumulation.nequip as sa_nequip
from sparse_accumulation.nequip.convolution import SparseAccumulationTensorProductScatter

R_MAX, SPECIES = 4.0, ["Si", "O"]


def _model(dtype: str, features=16, seed=0):
    set_global_state(allow_tf32=False)
    return NequIPGNNModel(seed=seed, model_dtype=dtype, type_names=SPECIES, r_max=R_MAX, l_max=2, num_layers=2,
                          num_features=features, parity=True, radial_mlp_depth=1, radial_mlp_width=16,
                          avg_num_neighbors=12.0, per_type_energy_scales=1.0,
                          per_type_energy_shifts={"Si": -3.0, "O": -5.0})


def _crystal(seed: int, atoms: int = 16, side: float = 6.0):
    """A random periodic crystal, no two atoms closer than 1.5, as NequIP's data pipeline makes it."""
    rng = np.random.default_rng(seed)
    positions = []
    while len(positions) < atoms:
        p = rng.uniform(0, side, 3)
        if all(np.linalg.norm((p - q + side / 2) % side - side / 2) > 1.5 for q in positions):
            positions.append(p)
    crystal = Atoms(symbols=SPECIES * (atoms // 2), positions=positions, cell=np.diag([side] * 3)
                    + rng.normal(0, 0.3, (3, 3)), pbc=True)
    data = ChemicalSpeciesToAtomTypeMapper(model_type_names=SPECIES,
                                           chemical_species_to_atom_type_map={s: s for s in SPECIES})(from_ase(crystal))
    return NeighborListTransform(r_max=R_MAX)(data)


def _evaluate(model, data):
    out = model(data.copy())
    return [out[k].detach() for k in (AtomicDataDict.TOTAL_ENERGY_KEY, AtomicDataDict.FORCE_KEY,
                                      AtomicDataDict.STRESS_KEY)]


def _assert_close(got, expected, tolerance):
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, rtol=tolerance, atol=tolerance * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("features", [16, 8], ids=["fused", "per edge on the CPU"])
def test_energies_forces_stress_and_training_gradients_equal_nequips(features):
    plain = _model("float64", features)
    modified = sa_nequip.enable(copy.deepcopy(plain))
    swapped = [m for m in modified.modules() if isinstance(m, SparseAccumulationTensorProductScatter)]
    assert len(swapped) == 2
    for seed in range(2):
        data = _crystal(seed)
        expected = _evaluate(plain, data)
        assert expected[2].abs().max() > 0
        _assert_close(_evaluate(modified, data), expected, 1e-10)

    grads = assert_same_training_gradients(plain, modified, _crystal(5))
    convolution_weights = [n for n in grads if "edge_mlp" in n]
    assert convolution_weights and any(grads[n].abs().max() > 0 for n in convolution_weights)


def assert_same_training_gradients(plain, modified, data) -> dict:
    """The gradient of every parameter of a training step on energies and forces (a double backward) is the same
    for both models (float64, 1e-10 relative); returns the plain model's by name."""
    grads = []
    for model in (plain, modified):
        model.train()
        out = model(data.copy())
        loss = out[AtomicDataDict.TOTAL_ENERGY_KEY].pow(2).sum() + out[AtomicDataDict.FORCE_KEY].pow(2).sum()
        names = [n for n, _ in model.named_parameters()]
        grads.append(dict(zip(names, torch.autograd.grad(loss, list(model.parameters()), allow_unused=True))))
    assert grads[0].keys() == grads[1].keys()
    for name, expected in grads[0].items():
        got = grads[1][name]
        assert (got is None) == (expected is None), name
        if expected is not None:
            assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12 * max(1.0, float(expected.abs().max()))), name
    return grads[0]


def test_state_dicts_are_nequips_both_ways():
    plain = _model("float64")
    modified = sa_nequip.enable(copy.deepcopy(plain))
    assert list(modified.state_dict()) == list(plain.state_dict())
    other = _model("float64", seed=7)
    modified.load_state_dict(other.state_dict(), strict=True)
    data = _crystal(2)
    _assert_close(_evaluate(modified, data), _evaluate(other, data), 1e-10)
    plain.load_state_dict(modified.state_dict(), strict=True)
    _assert_close(_evaluate(plain, data), _evaluate(other, data), 1e-10)


def test_float32_models():
    plain = _model("float32")
    modified = sa_nequip.enable(copy.deepcopy(plain))
    seen = []
    for module in modified.modules():
        if isinstance(module, SparseAccumulationTensorProductScatter):
            module.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    data = _crystal(3)
    got, expected = _evaluate(modified, data), _evaluate(plain, data)
    assert [t.dtype for t in got] == [t.dtype for t in expected]  # (NequIP's forces: float64 positions' gradients)
    assert seen == [torch.float32] * 2  # the convolutions in the model's dtype
    _assert_close(got, expected, 1e-4)


def test_the_ways_to_apply_it():
    assert sa_nequip.MODIFIER in get_all_modifiers(_model("float64")), "NequIP does not find the modifier"
    sa_nequip.register()  # idempotent
    by_modify = modify(_model("float64"), [{"modifier": sa_nequip.MODIFIER}])
    by_config = modify({"_target_": "nequip.model.NequIPGNNModel", "seed": 0, "model_dtype": "float64",
                        "type_names": SPECIES, "r_max": R_MAX, "l_max": 1, "num_layers": 1, "num_features": 4,
                        "avg_num_neighbors": 12.0}, [{"modifier": sa_nequip.MODIFIER}])
    for model in (by_modify, by_config):
        assert any(isinstance(m, SparseAccumulationTensorProductScatter) for m in model.modules())
    with pytest.raises(ValueError, match="holds no NequIP TensorProductScatter"):
        sa_nequip.enable(torch.nn.Linear(2, 2))


def export_and_load(model, data, folder):
    """``(compiled, input keys)``: what ``nequip-compile --mode aotinductor --target ase`` makes of ``model`` (after
    loading a checkpoint and applying modifiers): exported with dynamic atoms and edges (NequIP's two symbolic
    traces at different sizes must agree), compiled, with the library to import recorded, loaded."""
    from nequip.model.inference_models.aotinductor import load_aotinductor_model
    from nequip.scripts._compile_utils import COMPILE_TARGET_DICT
    from nequip.utils.aoti_metadata import embed_custom_ops_libs
    from nequip.utils.aot import aot_export_model

    model.eval()
    target = COMPILE_TARGET_DICT["ase"]
    batch_map = target["batch_map_settings"]({"graph": torch.export.Dim.STATIC,
                                              "node": torch.export.Dim("num_nodes", min=2),
                                              "edge": torch.export.Dim("num_edges", min=2)})
    path = str(folder / "model.nequip.pt2")
    metadata = {**model.metadata, "nequip_aoti_inputs": " ".join(target["input"]),
                "nequip_aoti_outputs": " ".join(target["output"])}
    aot_export_model(model=model, device="cpu", input_fields=target["input"], output_fields=target["output"],
                     data=target["data_settings"]({k: v.clone() for k, v in data.items()}), batch_map=batch_map,
                     output_path=path, seed=1, inductor_configs={"aot_inductor.metadata": metadata})
    assert model.metadata.get("nequip_custom_ops_libs") == "sparse_accumulation"
    embed_custom_ops_libs(path, {"sparse_accumulation"})
    return load_aotinductor_model(path, "cpu", target["input"], target["output"])[0], target["input"]


def test_aotinductor_export_loads_and_equals_eager(tmp_path):
    model = sa_nequip.enable(_model("float64"))
    compiled, inputs = export_and_load(model, _crystal(4), tmp_path)
    for d in (_crystal(4), _crystal(6, atoms=24, side=7.0)):
        expected = _evaluate(model, d)[:2]
        out = compiled({k: d[k] for k in inputs})
        _assert_close([out[AtomicDataDict.TOTAL_ENERGY_KEY], out[AtomicDataDict.FORCE_KEY]], expected, 1e-10)


def test_the_documentation_pages_python_blocks_run_as_written():
    """docs/coming_from_nequip.rst's examples (here: they need NequIP's process-wide settings)."""
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("documentation_tests", root / "tests" / "test_docs.py")
    documentation_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(documentation_tests)
    blocks = documentation_tests.python_blocks(root / "docs" / "coming_from_nequip.rst")
    assert blocks
    namespace = {}
    for block in blocks:
        exec(compile(block, "coming_from_nequip.rst", "exec"), namespace)  # noqa: S102 - the page's examples
