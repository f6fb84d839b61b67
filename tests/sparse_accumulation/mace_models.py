"""MACE's own models as references of the ``sparse_accumulation.mace`` model tests (mace-torch 0.3.16, float64,
random weights): the models, periodic and molecular structures, MACE's batches of them, and the comparison.
Importing it skips the importing test module where mace-torch's package (with the packages its models, data and
calculator import) is not importable."""
import copy
import functools
import importlib

import numpy as np
import pytest
import torch

RTOL = 1e-10
CLASSES = ["RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock",
           "RealAgnosticDensityInteractionBlock", "RealAgnosticDensityResidualInteractionBlock",
           "RealAgnosticAttResidualInteractionBlock", "RealAgnosticResidualNonLinearInteractionBlock"]
SYMBOLS = ("H", "C", "O")


def mace_package():
    """MACE's package with its models, data pipeline and ASE calculator, or skip the module."""
    for name in ("e3nn", "opt_einsum_fx", "ase", "mace.calculators"):
        pytest.importorskip(name)
    modules = importlib.import_module("mace.modules")
    if not hasattr(modules, "MACE"):  # the stand-in package of sparse_accumulation.mace.reference
        pytest.skip("mace-torch's package did not import (installed without its dependencies)",
                    allow_module_level=True)
    return modules


modules = mace_package()
ase = importlib.import_module("ase")
from e3nn import o3  # noqa: E402
from mace import data as mace_data  # noqa: E402
from mace import tools as mace_tools  # noqa: E402
from mace.tools import torch_geometric  # noqa: E402



@functools.lru_cache(maxsize=None)
def _built(interaction: str, scale_shift: bool, max_ell: int, correlation: int, hidden: str, elements: int):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        first = "RealAgnosticInteractionBlock" if interaction == "RealAgnosticAttResidualInteractionBlock" \
            else interaction
        config = dict(r_max=4.0, num_bessel=6, num_polynomial_cutoff=5, max_ell=max_ell,
                      interaction_cls=modules.interaction_classes[interaction],
                      interaction_cls_first=modules.interaction_classes[first], num_interactions=2,
                      num_elements=elements, hidden_irreps=o3.Irreps(hidden), MLP_irreps=o3.Irreps("8x0e"),
                      gate=torch.nn.functional.silu, atomic_energies=np.linspace(-3.0, -1.0, elements),
                      avg_num_neighbors=8.0, atomic_numbers=[ase.data.atomic_numbers[s] for s in SYMBOLS[:elements]],
                      correlation=correlation, radial_MLP=[16, 16])
        if scale_shift:
            return modules.ScaleShiftMACE(atomic_inter_scale=1.3, atomic_inter_shift=-0.2, **config)
        return modules.MACE(**config)
    finally:
        torch.set_default_dtype(previous)


def mace_model(generator, interaction="RealAgnosticResidualInteractionBlock", scale_shift=True, max_ell=2,
               correlation=3, hidden="8x0e + 8x1o", elements=2):
    """A float64 MACE model (built once per configuration: MACE's construction takes seconds), copied, with its
    trainable parameters moved off their initial values by fresh random amounts."""
    model = copy.deepcopy(_built(interaction, scale_shift, max_ell, correlation, hidden, elements))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


def _rng(generator) -> np.random.Generator:
    return np.random.default_rng(int(torch.randint(2 ** 31, (1,), generator=generator)))


def structures(generator, elements=2) -> list:
    """A periodic crystal (a jittered 2x2x2 cubic cell, skewed) and a molecule (jittered points), fresh random
    elements among the model's."""
    rng = _rng(generator)
    grid = np.stack(np.meshgrid(*[np.arange(2)] * 3, indexing="ij"), -1).reshape(-1, 3) * 2.2
    cell = np.eye(3) * 4.4 + rng.uniform(-0.3, 0.3, (3, 3))
    crystal = ase.Atoms([SYMBOLS[i] for i in rng.integers(0, elements, len(grid))],
                        positions=grid @ (cell / 4.4) + rng.uniform(-0.25, 0.25, grid.shape), cell=cell, pbc=True)
    points = np.array([[0, 0, 0], [1.1, 0, 0], [0, 1.1, 0], [0, 0, 1.1], [1.1, 1.1, 0.3]])
    molecule = ase.Atoms([SYMBOLS[i] for i in rng.integers(0, elements, len(points))],
                         positions=points + rng.uniform(-0.15, 0.15, points.shape))
    return [crystal, molecule]


def batch(atoms_list, model) -> dict:
    """MACE's batch of the structures: its configurations, neighbour lists, atomic data and data loader."""
    table = mace_tools.AtomicNumberTable([int(z) for z in model.atomic_numbers])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        graphs = [mace_data.AtomicData.from_config(mace_data.config_from_atoms(atoms), z_table=table,
                                                   cutoff=float(model.r_max)) for atoms in atoms_list]
    finally:
        torch.set_default_dtype(previous)
    loader = torch_geometric.dataloader.DataLoader(graphs, batch_size=len(graphs), shuffle=False, drop_last=False)
    return next(iter(loader)).to_dict()


def assert_close(ours, theirs, what):
    scale = theirs.abs().max().item()
    error = (ours - theirs).abs().max().item()
    assert error <= RTOL * scale, f"{what}: error {error:.3g} for values up to {scale:.3g}"
