"""An ASE calculator for MACE energy models that builds MACE's batch itself, for molecular dynamics.

MACE's own calculator (``mace.calculators.MACECalculator``) runs MACE's data pipeline at every step: a
configuration, an ``AtomicData`` with its neighbour list and labels, a data loader's batch, its copy to the
device. At a few hundred atoms that costs more than the model's call (about 4 ms of the batch alone at 64 atoms
on a 2-core CPU, beside a replayed model call of about 2 ms on an H200). :class:`Calculator` makes the batch
with that pipeline once, and at later steps only recomputes what moves: the positions and the neighbour list,
with MACE's own ``get_neighborhood`` (so the edges are MACE's, in MACE's order, and the cell it returns). A
change of the atomic numbers, the cell, the periodic boundary conditions, the initial charges or magnetic
moments, or the atom count builds the batch again.

Requires mace-torch (and ASE), imported when the calculator is made.
"""
from __future__ import annotations

import importlib
from typing import Optional

import numpy as np
import torch

try:
    from ase.calculators.calculator import Calculator as _AseCalculator, all_changes
    from ase.stress import full_3x3_to_voigt_6_stress
except ImportError:  # pragma: no cover - ASE is an optional dependency (the [mace] extra)
    _AseCalculator, all_changes = object, ()

#: changes of the atoms after which the batch is built again (not only its positions and edges)
REBUILT_ON = frozenset(("numbers", "pbc", "cell", "initial_charges", "initial_magmoms"))


class Calculator(_AseCalculator):
    """ASE calculator of a MACE energy model (``MACE``, ``ScaleShiftMACE``; converted by
    :func:`~sparse_accumulation.mace.accelerate` or not, and in a :class:`~sparse_accumulation.mace.CapturedModel`
    to replay CUDA graphs): ``energy``, ``free_energy``, ``energies`` (per atom), ``forces`` and ``stress``, equal to
    ``mace.calculators.MACECalculator(models=model)``'s.

    Args:
        model: the model; moved to ``device`` and ``default_dtype``.
        device: ``"cpu"``, ``"cuda"`` ... (default: the model's).
        default_dtype: ``"float64"`` (default) or ``"float32"``: the model's and the batch's dtype.
        head: the head of a multi-head model (default: as MACE's calculator, the only head or the one named
            "default").
        **kwargs: ASE's ``Calculator`` arguments.

    Raises:
        ImportError: mace-torch or ASE is not installed.
        ValueError: a model without ``r_max`` and ``atomic_numbers`` (not a MACE model), an unknown dtype, a head
            the model lacks (or none given where the model has several heads and none is named "default").
    """

    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress"]

    def __init__(self, model: torch.nn.Module, device: Optional[str] = None, default_dtype: str = "float64",
                 head: Optional[str] = None, **kwargs):
        _mace()
        if _AseCalculator is object:
            raise ImportError("sparse_accumulation.mace.Calculator needs ASE (pip install ase)")
        super().__init__(**kwargs)
        if not (hasattr(model, "r_max") and hasattr(model, "atomic_numbers")):
            raise ValueError(f"model must be a MACE model (with r_max and atomic_numbers), got "
                             f"{type(model).__name__}")
        if default_dtype not in ("float64", "float32"):
            raise ValueError(f"default_dtype must be 'float64' or 'float32', got {default_dtype!r}")
        self.dtype = getattr(torch, default_dtype)
        if device is None:
            device = next(model.parameters()).device
        self.device = torch.device(device)
        self.model = model.to(self.device, self.dtype)
        heads = list(getattr(model, "heads", None) or ["Default"])
        if head is None:  # as MACE's calculator chooses
            named = [h for h in heads if h.lower() == "default"]
            if len(heads) > 1 and not named:
                raise ValueError(f"head is required: the model has heads {heads}, none named 'default'")
            head = heads[0] if len(heads) == 1 else named[0]
        elif head not in heads:
            raise ValueError(f"head must be one of the model's heads {heads}, got {head!r}")
        self.heads, self.head = heads, head
        self.r_max = float(model.r_max)
        self._batch = None

    def calculate(self, atoms=None, properties=None, system_changes=all_changes) -> None:
        """ASE's calculation: the model's call on the atoms' batch (made or updated, see the module docstring)."""
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        if self._batch is None or REBUILT_ON.intersection(system_changes) or (
                self._batch["positions"].shape[0] != len(atoms)):
            self._batch = self._built(atoms)
        else:
            self._moved(atoms)
        out = self.model(dict(self._batch), compute_stress=True)
        self.results = {"energy": out["energy"].detach()[0].item(),
                        "energies": out["node_energy"].detach().cpu().numpy().astype(float),
                        "forces": out["forces"].detach().cpu().numpy().astype(float)}
        self.results["free_energy"] = self.results["energy"]
        if out.get("stress") is not None:
            self.results["stress"] = full_3x3_to_voigt_6_stress(out["stress"].detach()[0].cpu().numpy().astype(float))

    def _built(self, atoms) -> dict:
        """MACE's batch of ``atoms`` through MACE's data pipeline, on the device in the calculator's dtype."""
        from mace import data
        from mace.tools import AtomicNumberTable, torch_geometric, torch_tools

        table = AtomicNumberTable([int(z) for z in self.model.atomic_numbers])
        with torch_tools.default_dtype(self.dtype):
            config = data.config_from_atoms(atoms, head_name=self.head)
            graph = data.AtomicData.from_config(config, z_table=table, cutoff=self.r_max, heads=self.heads)
        loader = torch_geometric.dataloader.DataLoader([graph], batch_size=1, shuffle=False, drop_last=False)
        batch = next(iter(loader)).to(self.device).to_dict()
        return {k: v.to(self.dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in batch.items()}

    def _moved(self, atoms) -> None:
        """The batch's positions, cell and neighbour list for the atoms' current positions and cell, as MACE's
        pipeline computes them (``mace.data.neighborhood.get_neighborhood``, then MACE's tensors)."""
        from mace.data.neighborhood import get_neighborhood

        positions = atoms.get_positions()
        edge_index, shifts, unit_shifts, cell = get_neighborhood(
            positions=positions, cutoff=self.r_max, pbc=tuple(atoms.get_pbc().tolist()),
            cell=np.array(atoms.get_cell()))
        batch, device, dtype = self._batch, self.device, self.dtype
        batch["positions"] = torch.tensor(positions, dtype=dtype, device=device)
        batch["edge_index"] = torch.tensor(edge_index, dtype=torch.long, device=device)
        batch["shifts"] = torch.tensor(shifts, dtype=dtype, device=device)
        batch["unit_shifts"] = torch.tensor(unit_shifts, dtype=dtype, device=device)
        cell = torch.tensor(cell, dtype=dtype)
        batch["cell"] = cell.view(batch["cell"].shape).to(device)
        if "volume" in batch:  # (a non-periodic direction's cell follows the positions): as MACE's AtomicData, on
            volume = torch.linalg.det(cell)  # the host
            batch["volume"] = volume.view(batch["volume"].shape).to(device)
            if "rcell" in batch:
                rcell = 2 * torch.pi * torch.linalg.inv(cell.mT) if volume.abs() > 0 else torch.zeros_like(cell)
                batch["rcell"] = rcell.view(batch["rcell"].shape).to(device)


def _mace():
    try:
        importlib.import_module("mace.data")
    except ImportError as error:
        raise ImportError("sparse_accumulation.mace.Calculator needs mace-torch (pip install mace-torch)") from error
