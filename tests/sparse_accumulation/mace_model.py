"""A small MACE model (mace-torch's ``mace.modules.MACE``, float64) with its symmetric contractions and its
convolutions' tensor products replaced by this library's modules, scripted by MACE's own ``jit.compile``
(``e3nn.util.jit.compile``) and saved: run as ``python mace_model.py FOLDER`` (a process of its own, since
mace-torch's package imports need its training dependencies, which other tests stand in for).

Writes ``FOLDER/model.pt`` (the scripted model), ``FOLDER/data.pt`` (the input) and ``FOLDER/expected.pt`` (MACE's
own energy and forces); raises if the eager or the scripted model with our modules gives other energies, forces
or force-training gradients than MACE's own model. Exits with status 3 where mace-torch cannot be imported.
"""
import copy
import sys

import numpy as np
import torch


def relative(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def build():
    """MACE's model and the same model on this library's modules (the weights shared)."""
    from e3nn import o3
    from mace import modules

    from sparse_accumulation.e3nn import TensorProduct
    from sparse_accumulation.mace import SymmetricContraction

    block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    model = modules.MACE(r_max=4.0, num_bessel=4, num_polynomial_cutoff=3, max_ell=2, interaction_cls=block,
                         interaction_cls_first=block, num_interactions=2, num_elements=2,
                         hidden_irreps=o3.Irreps("4x0e+4x1o"), MLP_irreps=o3.Irreps("4x0e"),
                         atomic_energies=np.array([-1.0, -2.0]), avg_num_neighbors=4.0, atomic_numbers=[1, 8],
                         correlation=3, gate=torch.nn.functional.silu)
    ours = copy.deepcopy(model)
    for product in ours.products:
        product.symmetric_contractions = SymmetricContraction.from_mace(product.symmetric_contractions)
    for interaction in ours.interactions:
        theirs = interaction.conv_tp
        interaction.conv_tp = TensorProduct(
            theirs.irreps_in1, theirs.irreps_in2, theirs.irreps_out,
            [(i.i_in1, i.i_in2, i.i_out, i.connection_mode, i.has_weight) for i in theirs.instructions],
            shared_weights=False, internal_weights=False)
    return model, ours


def data(generator, atoms: int = 6) -> dict:
    """A molecule of ``atoms`` random atoms of MACE's two elements, every pair within the cutoff an edge."""
    positions = 1.5 * torch.randn(atoms, 3, generator=generator)
    species = torch.arange(atoms) % 2
    distances = (positions[:, None] - positions[None]).norm(dim=-1)
    src, dst = torch.nonzero((distances < 4.0) & ~torch.eye(atoms, dtype=torch.bool), as_tuple=True)
    edges = src.shape[0]
    return {"positions": positions, "node_attrs": torch.nn.functional.one_hot(species, 2).to(torch.float64),
            "edge_index": torch.stack([src, dst]), "shifts": torch.zeros(edges, 3),
            "unit_shifts": torch.zeros(edges, 3), "cell": torch.zeros(3, 3),
            "batch": torch.zeros(atoms, dtype=torch.int64), "ptr": torch.tensor([0, atoms]),
            "head": torch.zeros(1, dtype=torch.int64)}


def training_gradients(model, batch, target) -> list:
    """Gradients of a force-matching loss with respect to the model's parameters (MACE's training mode)."""
    out = model(dict(batch), training=True)
    loss = out["energy"].pow(2).sum() + (out["forces"] - target).pow(2).sum()
    parameters = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, parameters))


def main(folder: str) -> None:
    torch.set_default_dtype(torch.float64)
    try:
        from e3nn.util import jit
        model, ours = build()
    except ImportError as error:
        print(f"mace-torch cannot be imported: {error}", file=sys.stderr)
        sys.exit(3)
    generator = torch.Generator().manual_seed(0)
    batch = data(generator)
    expected = model(dict(batch))
    scripted = jit.compile(copy.deepcopy(ours))
    assert isinstance(scripted, torch.jit.ScriptModule)
    for name, candidate in (("eager", ours), ("scripted", scripted)):
        out = candidate(dict(batch))
        for key in ("energy", "forces"):
            error = relative(out[key], expected[key])
            assert error < 1e-12, f"{name} {key}: relative error {error:.3g}"
    target = torch.randn(batch["positions"].shape, generator=generator)
    for a, b in zip(training_gradients(scripted, batch, target), training_gradients(model, batch, target)):
        assert relative(a, b) < 1e-12, f"training gradient: relative error {relative(a, b):.3g}"
    torch.jit.save(scripted, f"{folder}/model.pt")
    torch.save(batch, f"{folder}/data.pt")
    torch.save({key: expected[key].detach() for key in ("energy", "forces")}, f"{folder}/expected.pt")


if __name__ == "__main__":
    main(sys.argv[1])
