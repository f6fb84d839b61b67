"""``enable_SparseAccumulationContracter`` on Allegro models built by Allegro's constructor, against the same
models unmodified (float64, random periodic crystals): energies, forces, stress, the gradients of a
force-training loss, state dicts, the ways to apply it, AOTInductor export. Run by ``tests/test_nequip.py`` in a
child pytest (NequIP's fixtures change process-wide state)."""
import copy

import pytest
import torch
from nequip.data import AtomicDataDict
from nequip.model import modify
from nequip.model.modify_utils import get_all_modifiers
from nequip.utils.global_state import set_global_state

import sparse_accumulation.allegro as sa_allegro
from sparse_accumulation.allegro.contracter import SparseAccumulationContracter

from run_modifier_checks import SPECIES, _assert_close, _crystal, _evaluate, assert_same_training_gradients

pytest.importorskip("allegro")


def _model(dtype="float64", tensor_features=16, layers=2, coupling=True, seed=0):
    from allegro.model import AllegroModel

    set_global_state(allow_tf32=False)
    return AllegroModel(seed=seed, model_dtype=dtype, type_names=SPECIES, r_max=4.0, l_max=2, parity=True,
                        radial_chemical_embed={"_target_": "allegro.nn.TwoBodyBesselScalarEmbed", "num_bessels": 8},
                        radial_chemical_embed_dim=16, scalar_embed_mlp_hidden_layers_depth=1,
                        scalar_embed_mlp_hidden_layers_width=16, num_layers=layers, num_scalar_features=16,
                        num_tensor_features=tensor_features, allegro_mlp_hidden_layers_depth=1,
                        allegro_mlp_hidden_layers_width=16, tp_path_channel_coupling=coupling,
                        readout_mlp_hidden_layers_depth=1, readout_mlp_hidden_layers_width=16,
                        avg_num_neighbors=20.0, per_type_energy_scales=1.0,
                        per_type_energy_shifts={"Si": -3.0, "O": -5.0})


@pytest.mark.parametrize("layers,coupling", [(2, True), (3, False)], ids=["coupled", "3 layers, uncoupled"])
def test_energies_forces_stress_and_training_gradients_equal_allegros(layers, coupling):
    plain = _model(layers=layers, coupling=coupling)
    modified = sa_allegro.enable(copy.deepcopy(plain))
    replaced = [m for m in modified.modules() if isinstance(m, SparseAccumulationContracter)]
    assert len(replaced) == layers - 1  # every layer but the last (diagonal) one
    for seed in range(2):
        data = _crystal(seed)
        _assert_close(_evaluate(modified, data), _evaluate(plain, data), 1e-10)
    grads = assert_same_training_gradients(plain, modified, _crystal(5))
    contraction_weights = [n for n in grads if n.endswith("tps.0.weights")]
    assert contraction_weights and grads[contraction_weights[0]].abs().max() > 0


def test_state_dicts_float32_and_the_ways_to_apply_it():
    plain = _model()
    modified = sa_allegro.enable(copy.deepcopy(plain))
    assert list(modified.state_dict()) == list(plain.state_dict())
    other = _model(seed=3)
    modified.load_state_dict(other.state_dict(), strict=True)
    data = _crystal(2)
    _assert_close(_evaluate(modified, data), _evaluate(other, data), 1e-10)
    single = _model("float32")
    _assert_close(_evaluate(sa_allegro.enable(copy.deepcopy(single)), data), _evaluate(single, data), 1e-4)
    assert sa_allegro.MODIFIER in get_all_modifiers(_model())
    by_modify = modify(_model(), [{"modifier": sa_allegro.MODIFIER}])
    assert any(isinstance(m, SparseAccumulationContracter) for m in by_modify.modules())
    with pytest.raises(ValueError, match="holds no Allegro Contracter"):
        sa_allegro.enable(torch.nn.Linear(2, 2))


def test_aotinductor_export_loads_and_equals_eager(tmp_path):
    from run_modifier_checks import export_and_load

    model = sa_allegro.enable(_model())
    compiled, inputs = export_and_load(model, _crystal(4), tmp_path)
    for d in (_crystal(4), _crystal(6, atoms=24, side=7.0)):
        expected = _evaluate(model, d)[:2]
        out = compiled({k: d[k] for k in inputs})
        _assert_close([out[AtomicDataDict.TOTAL_ENERGY_KEY], out[AtomicDataDict.FORCE_KEY]], expected, 1e-10)
