"""NequIP's own model tests (``EnergyModelTestsMixin``: equivariance, batching, numeric gradients, partial forces,
smoothness, isolated atoms, periodic images) on NequIP models built by NequIP's constructor and modified with
``enable_SparseAccumulation``, and on Allegro models modified with ``enable_SparseAccumulationContracter``, plus
their energies and forces against the unmodified model of the same state.
Run by ``tests/test_nequip.py`` in a child pytest (NequIP's fixtures change process-wide state)."""
import copy

import pytest
import torch
from nequip.data import AtomicDataDict
from nequip.model import modify
from nequip.utils.unittests.model_tests_basic import EnergyModelTestsMixin

from sparse_accumulation.allegro import MODIFIER as ALLEGRO_MODIFIER
from sparse_accumulation.allegro.contracter import SparseAccumulationContracter
from sparse_accumulation.nequip import MODIFIER
from sparse_accumulation.nequip.convolution import SparseAccumulationTensorProductScatter

_SPECIES = ["H", "C", "O"]
_COMMON = {"_target_": "nequip.model.NequIPGNNModel", "seed": 123, "type_names": _SPECIES, "r_max": 4.0,
           "avg_num_neighbors": 20, "per_type_energy_shifts": {"H": 3.45, "C": 5.67, "O": 7.89}, "l_max": 2,
           "parity": True, "radial_mlp_depth": 1, "radial_mlp_width": 8}
_ZBL = {"_target_": "nequip.nn.pair_potential.ZBL", "chemical_species": _SPECIES, "units": "metal"}
#: 16 features (fused kernels on the CPU), 8 (per edge on the CPU), and a different width per layer
CONFIGS = {"16 features, 3 layers": dict(num_features=16, num_layers=3, **_COMMON),
           "8 features, ZBL": dict(num_features=8, num_layers=2, pair_potential=_ZBL, **_COMMON),
           "7, 13, 5 features": dict(num_features=[7, 13, 5], num_layers=2, pair_potential=_ZBL, **_COMMON)}


class TestNequIPOnSparseAccumulation(EnergyModelTestsMixin):
    @pytest.fixture
    def strict_locality(self):
        return False

    @pytest.fixture(scope="class")
    @classmethod
    def equivariance_tol(cls, model_dtype):
        return {"float32": 5e-5, "float64": 1e-7}[model_dtype]

    @pytest.fixture(params=list(CONFIGS), scope="class")
    @classmethod
    def config(cls, request):
        return copy.deepcopy(CONFIGS[request.param])

    #: the modifier applied, and the module it puts in the model
    MODIFIER, REPLACEMENT = MODIFIER, SparseAccumulationTensorProductScatter

    @classmethod
    def make_model(cls, model_config, device):
        model = modify(EnergyModelTestsMixin.make_model(model_config, device), [{"modifier": cls.MODIFIER}])
        assert any(isinstance(m, cls.REPLACEMENT) for m in model.modules())
        return model

    def test_equals_the_unmodified_model(self, model, model_test_data, device, model_dtype):
        modified, config, _ = model
        plain = EnergyModelTestsMixin.make_model(copy.deepcopy(config), device)
        plain.load_state_dict(modified.state_dict(), strict=True)
        tolerance = {"float32": 1e-4, "float64": 1e-10}[model_dtype]
        ours, theirs = modified(model_test_data.copy()), plain(model_test_data.copy())
        for key in (AtomicDataDict.TOTAL_ENERGY_KEY, AtomicDataDict.FORCE_KEY):
            assert torch.allclose(ours[key], theirs[key], rtol=tolerance, atol=tolerance), key


_ALLEGRO = {"_target_": "allegro.model.AllegroModel", "seed": 123, "type_names": _SPECIES, "r_max": 4.0,
            "avg_num_neighbors": 20, "per_type_energy_shifts": {"H": 3.45, "C": 5.67, "O": 7.89}, "l_max": 2,
            "parity": True, "radial_chemical_embed": {"_target_": "allegro.nn.TwoBodyBesselScalarEmbed",
                                                      "num_bessels": 8},
            "radial_chemical_embed_dim": 16, "scalar_embed_mlp_hidden_layers_depth": 1,
            "scalar_embed_mlp_hidden_layers_width": 16, "num_scalar_features": 16,
            "allegro_mlp_hidden_layers_depth": 1, "allegro_mlp_hidden_layers_width": 16,
            "readout_mlp_hidden_layers_depth": 1, "readout_mlp_hidden_layers_width": 16}
#: Allegro with coupled channels and paths over 2 layers, and uncoupled over 3 (two contractions replaced)
ALLEGRO_CONFIGS = {"Allegro, 2 layers": dict(num_layers=2, num_tensor_features=8, **_ALLEGRO),
                   "Allegro, 3 layers, uncoupled": dict(num_layers=3, num_tensor_features=4,
                                                        tp_path_channel_coupling=False, **_ALLEGRO)}


class TestAllegroOnSparseAccumulation(TestNequIPOnSparseAccumulation):
    @pytest.fixture(params=list(ALLEGRO_CONFIGS), scope="class")
    @classmethod
    def config(cls, request):
        return copy.deepcopy(ALLEGRO_CONFIGS[request.param])

    MODIFIER, REPLACEMENT = ALLEGRO_MODIFIER, SparseAccumulationContracter
