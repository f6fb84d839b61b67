"""The hippynn backend: registration, hippynn's own kernel tester on our sums, and a hippynn interaction layer
run on them (forces included) against hippynn's own pure-torch kernels."""
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("hippynn")

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.hippynn import backend  # noqa: E402


@pytest.fixture(scope="module")
def custom_kernels():
    """hippynn.custom_kernels with our kernels registered; the active kernels are restored afterwards."""
    import hippynn.custom_kernels as custom_kernels

    sa.hippynn.register()
    previous = custom_kernels.CUSTOM_KERNELS_ACTIVE
    yield custom_kernels
    custom_kernels.set_custom_kernels(previous if isinstance(previous, str) else "pytorch")


@pytest.fixture
def numpy_seed(generator):
    """hippynn's data generators draw from numpy's global generator: seed it from the test's fresh seed."""
    np.random.seed(generator.initial_seed() % 2**32)


def test_register_is_idempotent_and_rejects_taken_names(custom_kernels):
    from hippynn.custom_kernels.registry import MessagePassingKernels

    kernels = sa.hippynn.register()
    assert sa.hippynn.register("Sparse_Accumulation") is kernels
    assert MessagePassingKernels.get_implementation("sparse_accumulation") is kernels
    assert kernels.envsum is sa.envsum and kernels.sensesum is sa.sensesum and kernels.featsum is sa.featsum
    with pytest.raises(ValueError, match="hippynn already has custom kernels named 'pytorch'"):
        sa.hippynn.register("pytorch")
    with pytest.raises(TypeError, match="name must be a string"):
        sa.hippynn.register(3)


def test_register_without_hippynn(monkeypatch):
    monkeypatch.setitem(sys.modules, "hippynn.custom_kernels.registry", None)
    monkeypatch.setattr(backend, "_registered", {})
    with pytest.raises(ImportError, match="needs hippynn: pip install hippynn"):
        sa.hippynn.register("another_name")


@pytest.mark.slow
def test_hippynn_tester_check_correctness(custom_kernels, numpy_seed, capsys):
    """hippynn's EnvOpsTester: execution, zero pairs, randomised pair order, gradcheck and gradgradcheck, and
    forward checks against hippynn's pytorch kernels on its tiny systems."""
    from hippynn.custom_kernels.test_env import EnvOpsTester

    tester = EnvOpsTester("sparse_accumulation")
    tester.check_correctness(n_grad=1, n_small=3, n_large=0)
    assert "Passed small tensor forward checks!" in capsys.readouterr().out


def test_hippynn_tester_forward_on_a_small_system(custom_kernels, numpy_seed):
    """EnvOpsTester's comparison with hippynn's pytorch kernels on its 'small' system, pairs shuffled."""
    from hippynn.custom_kernels import env_pytorch
    from hippynn.custom_kernels.test_env import TEST_SMALL_PARAMS, EnvOpsTester, get_simulated_data

    tester = EnvOpsTester("sparse_accumulation")
    sense, feat, first, second = get_simulated_data(**TEST_SMALL_PARAMS, dtype=torch.float32, randomize_order=True)
    env = torch.rand(feat.shape[0], sense.shape[1], feat.shape[1])
    for ours, theirs, a, b in ((tester.envsum, env_pytorch.envsum, sense, feat),
                               (tester.sensesum, env_pytorch.sensesum, env, feat),
                               (tester.featsum, env_pytorch.featsum, env, sense)):
        tester.all_close_witherror(ours(a, b, first, second), theirs(a, b, first, second))


def _interaction_layer():
    from hippynn.layers.hiplayers.interactions import InteractLayerVec
    from hippynn.layers.hiplayers.sensitivity import GaussianSensitivityModule

    torch.manual_seed(torch.initial_seed() % 2**31)
    return InteractLayerVec(nf_in=4, nf_out=3, n_dist=5, mind_soft=0.8, maxd_soft=3.0, hard_cutoff=4.0,
                            sensitivity_module=GaussianSensitivityModule, cusp_reg=1e-6).double()


@pytest.mark.filterwarnings("ignore:Using non-standard custom kernel implementation")
def test_interaction_layer_with_forces(custom_kernels, generator):
    """A HIP-NN vector interaction layer, energy and forces (double backward to the weights), on our kernels
    and on hippynn's own pure-torch kernels."""
    layer = _interaction_layer()
    n_atoms = 7
    first = torch.tensor([0, 0, 1, 1, 2, 3, 3, 4, 5, 5, 2, 0])
    second = torch.tensor([1, 2, 0, 3, 4, 1, 5, 2, 3, 0, 4, 1])  # unsorted, a repeated pair; atom 6 alone
    features = torch.randn(n_atoms, 4, generator=generator, dtype=torch.float64)
    # seven corners of a cube of side 1.6, jittered: every pair inside the sensitivity range [0.8, 4.0)
    corners = torch.tensor([[i & 1, (i >> 1) & 1, (i >> 2) & 1] for i in range(n_atoms)], dtype=torch.float64)
    jitter = 0.1 * torch.randn(n_atoms, 3, generator=generator, dtype=torch.float64)
    positions = (1.6 * corners + jitter).requires_grad_()

    def energy_forces_and_weight_gradient(kernels):
        custom_kernels.set_custom_kernels(kernels)
        vectors = positions[second] - positions[first]
        distances = vectors.norm(dim=1)
        energy = layer(features, first, second, distances, vectors).pow(2).sum()
        (forces,) = torch.autograd.grad(energy, positions, create_graph=True)
        weights = torch.autograd.grad(forces.pow(2).sum(), layer.int_weights)[0]
        return energy.detach(), forces.detach(), weights

    ours = energy_forces_and_weight_gradient("sparse_accumulation")
    theirs = energy_forces_and_weight_gradient("_pytorch_raw")
    for got, expected in zip(ours, theirs):
        assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert ours[1].abs().max() > 0 and ours[2].abs().max() > 0
