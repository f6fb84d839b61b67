"""Benchmark of a whole NequIP or Allegro model, as built and with its model modifiers: energies and forces (a
molecular-dynamics step's model call) and a training step, on a periodic crystal, with peak memory.

    python benchmarks/nequip_model.py --atoms 216                                    # CPU
    python benchmarks/nequip_model.py --device cuda --atoms 1000 10000 100000 --features 32 64 \\
        --mode forces train --json nequip_model.json
    python benchmarks/nequip_model.py --model allegro --atoms 216 --features 16 32   # Allegro

The model: NequIP's ``NequIPGNNModel`` (nequip 0.19) built with its own constructor, random weights:
``--layers`` convolution layers of ``--features`` features, spherical harmonics up to ``--l-max``, one element
(silicon), ``r_max`` ``--r-max``; with ``--model allegro``, Allegro's ``AllegroModel`` (nequip-allegro 0.8) of
``--layers`` layers, ``--features`` tensor features, 64 scalar features and MLPs of width 64. The crystal:
diamond silicon (a = 5.43 Angstrom), ``k^3`` cubic cells of 8 atoms with ``k`` the cube root of ``--atoms / 8``
rounded, positions jittered; its graph made by NequIP's data pipeline (``from_ase``, its neighbour list).

Variants: ``built`` (the model as built), ``ours`` (``enable_SparseAccumulation``, :mod:`sparse_accumulation.nequip`;
for Allegro ``enable_SparseAccumulationContracter``, :mod:`sparse_accumulation.allegro`), ``cueq`` and ``oeq``
(NequIP's ``enable_CuEquivariance`` and ``enable_OpenEquivariance``; for Allegro ``enable_CuEquivarianceContracter``)
and ``triton`` (Allegro's ``enable_TritonContracter``, ``forces`` steps only: it has no double backward), on CUDA
where their packages are installed. A ``forces`` step is
the model's call in evaluation mode (energies and forces: NequIP differentiates the energy inside the call); a
``train`` step is the call in training mode with the squared energies and forces summed and ``backward`` to the
parameters. The median of single steps after two warm-up steps, and ``peak MB`` as in ``mace_model.py``. Before
timing, each variant is checked against NequIP's model in float64 on the smallest crystal (energy and forces).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from convolution import measure_step  # noqa: E402
from sparse_accumulation.bench.timing import compiled_kernels_only, synchronize  # noqa: E402
from symmetric_contraction import cpu_name, versions  # noqa: E402

VARIANTS = ("built", "ours", "cueq", "oeq", "triton")
#: per model, the modifier of each variant (None: the model as built) and the package it needs
MODIFIERS = {"nequip": {"built": (None, None), "ours": ("enable_SparseAccumulation", "sparse_accumulation"),
                        "cueq": ("enable_CuEquivariance", "cuequivariance_torch"),
                        "oeq": ("enable_OpenEquivariance", "openequivariance")},
             "allegro": {"built": (None, None),
                         "ours": ("enable_SparseAccumulationContracter", "sparse_accumulation"),
                         "cueq": ("enable_CuEquivarianceContracter", "cuequivariance_torch"),
                         "triton": ("enable_TritonContracter", "triton")}}


def make_model(args, features: int, dtype: str):
    from nequip.utils.global_state import set_global_state

    set_global_state(allow_tf32=False)
    if args.model == "allegro":
        from allegro.model import AllegroModel

        return AllegroModel(seed=0, model_dtype=dtype, type_names=["Si"], r_max=args.r_max, l_max=args.l_max,
                            parity=True, radial_chemical_embed={"_target_": "allegro.nn.TwoBodyBesselScalarEmbed",
                                                                "num_bessels": 8},
                            radial_chemical_embed_dim=64, scalar_embed_mlp_hidden_layers_depth=1,
                            scalar_embed_mlp_hidden_layers_width=64, num_layers=args.layers, num_scalar_features=64,
                            num_tensor_features=features, allegro_mlp_hidden_layers_depth=1,
                            allegro_mlp_hidden_layers_width=64, readout_mlp_hidden_layers_depth=1,
                            readout_mlp_hidden_layers_width=64, avg_num_neighbors=args.avg_neighbors,
                            per_type_energy_scales=1.0, per_type_energy_shifts={"Si": -5.0})
    from nequip.model import NequIPGNNModel

    return NequIPGNNModel(seed=0, model_dtype=dtype, type_names=["Si"], r_max=args.r_max, l_max=args.l_max,
                          num_layers=args.layers, num_features=features, parity=True, radial_mlp_depth=2,
                          radial_mlp_width=64, avg_num_neighbors=args.avg_neighbors, per_type_energy_scales=1.0,
                          per_type_energy_shifts={"Si": -5.0})


def modified(model, kind: str, variant: str, device):
    """A copy of ``model`` (a ``kind`` model) with the variant's modifier, or None where its package is not
    installed (or it does not run on ``device``)."""
    import importlib.util

    from nequip.model import modify

    import sparse_accumulation.nequip.extension  # noqa: F401  (registers the modifiers where the entry point did not)

    modifier, package = MODIFIERS[kind][variant]
    if modifier is None:
        return copy.deepcopy(model)
    if importlib.util.find_spec(package) is None or (variant != "ours" and device.type != "cuda"):
        return None
    return modify(copy.deepcopy(model), [{"modifier": modifier}])


def make_crystal(atoms: int, seed: int = 0):
    from ase.build import bulk

    k = max(1, round((atoms / 8) ** (1 / 3)))
    crystal = bulk("Si", "diamond", a=5.43, cubic=True).repeat((k, k, k))
    crystal.positions += np.random.default_rng(seed).normal(0, 0.05, crystal.positions.shape)
    return crystal


def make_data(crystal, r_max: float, device) -> dict:
    from nequip.data import from_ase
    from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper, NeighborListTransform

    data = ChemicalSpeciesToAtomTypeMapper(model_type_names=["Si"],
                                           chemical_species_to_atom_type_map={"Si": "Si"})(from_ase(crystal))
    data = NeighborListTransform(r_max=r_max)(data)
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in data.items()}


def _model_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("nequip", "nequip-allegro"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def _step(model, data, mode: str):
    from nequip.data import AtomicDataDict

    if mode == "forces":
        return model(dict(data))[AtomicDataDict.FORCE_KEY]
    for parameter in model.parameters():
        parameter.grad = None
    out = model(dict(data))
    loss = out[AtomicDataDict.TOTAL_ENERGY_KEY].square().sum() + out[AtomicDataDict.FORCE_KEY].square().sum()
    loss.backward()
    return loss


def check(model, reference, data) -> float:
    """The largest relative difference of ``model``'s energy and forces from ``reference``'s."""
    from nequip.data import AtomicDataDict

    keys = (AtomicDataDict.TOTAL_ENERGY_KEY, AtomicDataDict.FORCE_KEY)
    got, expected = model(dict(data)), reference(dict(data))
    return max(((got[k] - expected[k]).abs().max() / expected[k].abs().max()).item() for k in keys)


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", choices=["nequip", "allegro"], default="nequip")
    parser.add_argument("--atoms", type=int, nargs="+", default=[216],
                        help="about this many atoms (a cube of diamond cells); several sizes in turn")
    parser.add_argument("--features", type=int, nargs="+", default=[32], help="features per layer; several in turn")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--l-max", type=int, default=2)
    parser.add_argument("--r-max", type=float, default=5.0)
    parser.add_argument("--avg-neighbors", type=float, default=30.0)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--variants", default=None,
                        help="comma-separated, from " + ", ".join(VARIANTS) + " (default: all of the model's)")
    parser.add_argument("--mode", choices=["forces", "train"], nargs="+", default=["forces", "train"])
    parser.add_argument("--repeats", type=int, default=None, help="steps timed (default: 20 on CUDA, 5 on the CPU)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="stop timing a variant after this long")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    repeats = args.repeats or (20 if device.type == "cuda" else 5)
    wanted = args.variants.split(",") if args.variants else list(MODIFIERS[args.model])
    unknown = sorted(set(wanted) - set(MODIFIERS[args.model]))
    if unknown:
        parser.error(f"unknown variants {unknown} for {args.model}; choose from {', '.join(MODIFIERS[args.model])}")

    meta = {"command": "python benchmarks/nequip_model.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
            "threads": torch.get_num_threads(), "versions": {**versions(), **_model_versions()},
            "model": args.model, "dtype": args.dtype,
            "layers": args.layers,
            "l_max": args.l_max, "r_max": args.r_max}
    print(json.dumps(meta), flush=True)
    rows = []
    for features in args.features:
        # the float64 check, on the smallest crystal
        reference = make_model(args, features, "float64").to(device)
        checked = make_data(make_crystal(min(args.atoms)), args.r_max, device)
        models, errors = {}, {}
        for variant in wanted:
            model = modified(reference, args.model, variant, device)
            if model is None:
                print(f"# {variant}: not installed here, or not for {device.type}; skipped", flush=True)
                continue
            errors[variant] = check(model, reference, checked)
            print(f"# {features} features, {variant}: {errors[variant]:.2g} from the model as built (float64)",
                  flush=True)
        if "ours" in errors:
            assert errors["ours"] < 1e-10, f"our modifier's model differs from the built one by {errors['ours']:.3g}"
        base = make_model(args, features, args.dtype).to(device)
        models = {v: modified(base, args.model, v, device) for v in errors}
        for atoms in args.atoms:
            data = make_data(make_crystal(atoms), args.r_max, device)
            size = {"features": features, "atoms": int(data["pos"].shape[0]),
                    "edges": int(data["edge_index"].shape[1])}
            print(f"# {features} features: {size['atoms']:,} atoms, {size['edges']:,} edges", flush=True)
            for mode in args.mode:
                found = {}
                for variant, model in models.items():
                    if mode == "train" and variant == "triton":
                        continue  # inference only (no double backward)
                    model.train(mode == "train")
                    result = measure_step(lambda: _step(model, data, mode), device, repeats, args.max_seconds)
                    rows.append({"variant": variant, "mode": mode, **size, **result,
                                 "check_float64": errors[variant]})
                    found[variant] = result
                    shown = (f"{result['ms']:10.2f} ms (median of {result['samples']})  "
                             f"peak {result['peak_mb']:8.1f} MB" if "ms" in result else result["error"])
                    print(f"  {mode:>6} {variant:>7}: {shown}", flush=True)
                    synchronize(device)
                if "ms" in found.get("ours", {}):
                    ratios = {other: round(found["ours"]["ms"] / found[other]["ms"], 3)
                              for other in found if other != "ours" and "ms" in found[other]}
                    print(f"  {mode:>6}    ours / others: {ratios}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
