"""NequIP's train-time compile (``compile_mode="compile"``: ``CompileGraphModel``, NequIP's symbolic tracing then
``torch.compile``) of a model with ``enable_SparseAccumulation``: forces and every parameter gradient of a
force-training step equal the eager unmodified model's (float64), at the traced size and another. Run by
``tests/test_nequip.py`` (``-m long``: the compile takes minutes on a small CPU machine)."""
import torch
from nequip.data import AtomicDataDict
from nequip.model import NequIPGNNModel, modify
from nequip.utils.global_state import set_global_state

from run_modifier_checks import R_MAX, SPECIES, _crystal, assert_same_training_gradients


def test_train_time_compile_equals_the_eager_model():
    set_global_state(allow_tf32=False)
    arguments = dict(seed=0, model_dtype="float64", type_names=SPECIES, r_max=R_MAX, l_max=2, num_layers=2,
                     num_features=16, parity=True, radial_mlp_depth=1, radial_mlp_width=16, avg_num_neighbors=12.0,
                     per_type_energy_scales=1.0, per_type_energy_shifts={"Si": -3.0, "O": -5.0})
    plain = NequIPGNNModel(**arguments)
    compiled = modify(NequIPGNNModel(compile_mode="compile", **arguments), [{"modifier": "enable_SparseAccumulation"}])
    compiled.load_state_dict(plain.state_dict())
    # two frames: NequIP runs single frames eagerly
    data = AtomicDataDict.batched_from_list([_crystal(0), _crystal(1)])
    assert_same_training_gradients(plain, compiled, data)
    assert len(compiled._compiled_cache[0]) == 1, "the model was not compiled"
    other = AtomicDataDict.batched_from_list([_crystal(3, atoms=24, side=7.0), _crystal(4)])
    got, expected = compiled(other.copy()), plain(other.copy())
    for key in (AtomicDataDict.TOTAL_ENERGY_KEY, AtomicDataDict.FORCE_KEY):
        assert torch.allclose(got[key], expected[key], rtol=1e-10, atol=1e-12), key
