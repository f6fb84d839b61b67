"""MACE's LoRA fine-tuning (``mace.modules.lora``) on accelerated models, against the same adapters on MACE's own
model (float64, random weights): the adapters MACE adds are all there, under the same names; outputs, gradients
of a training step and merged models equal MACE's; a merged model stays equivariant."""
import copy

import numpy as np
import pytest
import torch

from mace_models import assert_close, batch, mace_model, structures  # skips without MACE
from rotation_helpers import random_rotation  # noqa: E402

lora = pytest.importorskip("mace.modules.lora")

from sparse_accumulation.mace import accelerate  # noqa: E402

ADAPTERS = (lora.LoRAO3Linear, lora.LoRADenseLinear, lora.LoRAFCLayer)


def adapter_names(model) -> dict:
    return {name: type(module).__name__ for name, module in model.named_modules() if isinstance(module, ADAPTERS)}


def with_adapters(generator):
    """MACE's model and its accelerated copy, each with MACE's LoRA adapters, the adapters' weights equal and
    random (their initialisation leaves B at zero, which would hide a missing adapter)."""
    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    for m in (model, ours):
        lora.inject_lora(m, rank=2, alpha=1.5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    ours.load_state_dict(model.state_dict(), strict=True)
    return model, ours


def test_the_adapters_are_maces_and_the_outputs_and_gradients_equal(generator):
    model, ours = with_adapters(generator)
    names = adapter_names(model)
    assert len(names) > 10 and adapter_names(ours) == names
    assert [n for n, p in ours.named_parameters() if p.requires_grad] == \
        [n for n, p in model.named_parameters() if p.requires_grad]
    data = batch(structures(generator), model)
    outputs = []
    for m in (model, ours):
        out = m(dict(data), training=True)
        (out["energy"].square().sum() + out["forces"].square().sum()).backward()
        outputs.append(out)
    for key in ("energy", "forces"):
        assert_close(outputs[1][key], outputs[0][key], key)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n, _ in trained)
    for name, p in trained:
        assert_close(ours.get_parameter(name).grad, p.grad, name)
    with torch.no_grad():  # without gradients MACE's adapters compute with merged weights
        energies = [m(dict(data), compute_force=False)["energy"] for m in (model, ours)]
    assert_close(energies[1], energies[0], "energy without gradients")
    assert_close(energies[1], outputs[0]["energy"], "energy without gradients")


def test_merged_models_equal_maces_and_stay_equivariant(generator):
    model, ours = with_adapters(generator)
    data = batch(structures(generator), model)
    before = ours(dict(data))
    for m in (model, ours):
        lora.merge_lora_weights(m)
    assert adapter_names(ours) == {} and adapter_names(model) == {}
    merged, theirs = ours(dict(data)), model(dict(data))
    for key in ("energy", "forces"):
        assert_close(merged[key], theirs[key], key)
        assert_close(merged[key], before[key], key)
    seed = int(torch.randint(2 ** 31, (1,), generator=generator))
    rotation = torch.from_numpy(random_rotation(np.random.default_rng(seed)))
    rotated = dict(data)
    for key in ("positions", "cell", "shifts"):
        rotated[key] = data[key] @ rotation.T
    turned = ours(rotated)
    assert_close(turned["energy"], merged["energy"], "energy of the rotated structures")
    assert_close(turned["forces"], merged["forces"] @ rotation.T, "forces of the rotated structures")
