"""Benchmark of a whole MACE model, as MACE built it and converted by ``sparse_accumulation.mace.accelerate``:
energies and forces (a molecular-dynamics step's model call) on a periodic crystal, with peak memory.

    python benchmarks/mace_model.py --atoms 343                     # CPU
    python benchmarks/mace_model.py --device cuda --atoms 1000 10000 --mode forces train --json mace_model.json

The model: MACE's ``ScaleShiftMACE`` (mace-torch 0.3.16) built with its own constructor, random weights:
``--channels`` x (0e + 1o) hidden irreps, spherical harmonics up to ``--max-ell``, ``--correlation``, two
interactions of ``--interaction``, ``--elements`` elements, ``r_max`` ``--r-max``. The crystal: a simple cubic
lattice of spacing 2.5 Angstrom, ``k^3`` atoms with ``k`` the cube root of ``--atoms`` rounded, positions
jittered, elements drawn at random; its graph made by MACE's data pipeline (neighbour list, one-hot elements).

Variants: ``mace`` (the model as MACE built it), ``accelerated`` (``accelerate`` of a copy), ``cueq`` (a copy
converted by MACE's ``mace.cli.convert_e3nn_cueq``, where cuequivariance is installed) and ``floor`` (not run
unless named in ``--variants``): the accelerated model with its convolutions and symmetric contractions replaced
by stand-ins that cost almost nothing (outputs of the right shapes made from a sum over each input, so that the
backward still reaches every input), the time of the rest of MACE's model, which no faster convolution or
contraction can go under; ``compiled`` (not run unless named): ``torch.compile`` of the accelerated model, called
as ``docs/mace.rst`` says (the positions requiring grad; in training ``torch.autograd.grad`` traced into the graph),
its first call (compilation) reported apart; ``cueq-compiled`` likewise of the cuEquivariance model. A step is
``model(batch, compute_force=True)`` (energies, forces from the gradient of the energy), or with ``--mode
train`` a training step (``training=True``, the squared energies and forces summed, ``backward`` to the
parameters); the median of single steps after two warm-up steps, and ``peak MB``: the peak memory of one step
above what was allocated before it (CUDA's allocator; on the CPU the resident memory, as in ``convolution.py``,
after the memory glibc holds free is handed back). ``--chunk-bytes`` sets the size above which the accelerated
convolutions compute their per-edge weights in chunks of edges (``Convolution.chunk_bytes``). Before timing, the accelerated and cuEquivariance models are
checked against MACE's in float64: energy, forces and stress (the cuEquivariance check reported, not asserted).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from convolution import measure_step  # noqa: E402
from sparse_accumulation.bench.timing import synchronize, compiled_kernels_only  # noqa: E402
from sparse_accumulation.mace import accelerate  # noqa: E402
from symmetric_contraction import cpu_name, versions  # noqa: E402

VARIANTS = ("mace", "accelerated", "cueq", "floor", "compiled", "cueq-compiled")
#: the variants that are another variant compiled
COMPILED = {"compiled": "accelerated", "cueq-compiled": "cueq"}
DEFAULT_VARIANTS = ("mace", "accelerated", "cueq")
#: the elements of the first crystals' atoms; more come from the periodic table in order (MACE-MP-0 has 89)
COMMON = ("H", "C", "N", "O", "Si", "Cu")


def symbols(count: int) -> list:
    """``count`` element symbols: :data:`COMMON` first, then the periodic table's others in order."""
    from ase.data import chemical_symbols

    found = list(COMMON) + [s for s in chemical_symbols[1:] if s not in COMMON]
    if count > len(found):
        raise SystemExit(f"--elements: at most {len(found)}")
    return found[:count]


def make_model(args):
    """MACE's ScaleShiftMACE in float64, its trainable parameters moved off their initial values."""
    from e3nn import o3
    from mace import modules
    from ase.data import atomic_numbers

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = modules.ScaleShiftMACE(
            atomic_inter_scale=1.0, atomic_inter_shift=0.0, r_max=args.r_max, num_bessel=8, num_polynomial_cutoff=5,
            max_ell=args.max_ell, interaction_cls=modules.interaction_classes[args.interaction],
            interaction_cls_first=modules.interaction_classes[args.interaction], num_interactions=2,
            num_elements=args.elements, hidden_irreps=o3.Irreps(f"{args.channels}x0e + {args.channels}x1o"),
            MLP_irreps=o3.Irreps("16x0e"), gate=torch.nn.functional.silu,
            atomic_energies=np.linspace(-5.0, -1.0, args.elements), avg_num_neighbors=30.0,
            atomic_numbers=[atomic_numbers[s] for s in symbols(args.elements)], correlation=args.correlation)
    finally:
        torch.set_default_dtype(previous)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


def make_crystal(atoms: int, elements: int):
    import ase

    k = max(2, round(atoms ** (1 / 3)))
    rng = np.random.default_rng(0)
    grid = np.stack(np.meshgrid(*[np.arange(k)] * 3, indexing="ij"), -1).reshape(-1, 3) * 2.5
    names = symbols(elements)
    return ase.Atoms([names[i] for i in rng.integers(0, elements, len(grid))],
                     positions=grid + rng.uniform(-0.2, 0.2, grid.shape), cell=np.eye(3) * 2.5 * k, pbc=True)


def make_batch(crystal, model, dtype, device) -> dict:
    """MACE's batch of one structure (its configuration, neighbour list, atomic data), in ``dtype`` on ``device``."""
    from mace import data, tools
    from mace.tools import torch_geometric

    table = tools.AtomicNumberTable([int(z) for z in model.atomic_numbers])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        graph = data.AtomicData.from_config(data.config_from_atoms(crystal), z_table=table,
                                            cutoff=float(model.r_max))
    finally:
        torch.set_default_dtype(previous)
    return torch_geometric.Batch.from_data_list([graph]).to(device).to_dict()


def to_cueq(mace, device):
    """A copy of ``mace`` on cuEquivariance, converted by MACE's own converter (``mace.cli.convert_e3nn_cueq``:
    its convolutions fused on CUDA), or None where cuequivariance is not installed."""
    try:
        import cuequivariance_torch  # noqa: F401
        from mace.cli.convert_e3nn_cueq import run
    except ImportError:
        return None
    default = torch.get_default_dtype()
    try:
        return run(copy.deepcopy(mace), device=device.type, return_model=True)
    finally:
        torch.set_default_dtype(default)  # the converter sets the model's dtype as the default


class _FreeConvolution(torch.nn.Module):
    """A stand-in for an accelerated convolution: ``[nodes, dim_out]`` from one pass over each input."""

    def __init__(self, dim_out: int):
        super().__init__()
        self.dim_out = dim_out

    def forward(self, node_feats, edge_attrs, tp_weights, edge_index=None):
        scale = edge_attrs.sum() + tp_weights.sum()
        return (node_feats.sum(-1, keepdim=True) * scale).expand(-1, self.dim_out)


class _FreeContraction(torch.nn.Module):
    """A stand-in for a symmetric contraction: ``[nodes, channels * dim_out]`` from one pass over ``x``."""

    def __init__(self, dim_out: int):
        super().__init__()
        self.dim_out = dim_out

    def forward(self, x, y):
        return (x.sum(-1, keepdim=True) * y.sum(-1)[:, None, None]).expand(-1, -1, self.dim_out).reshape(len(x), -1)


def floor_model(accelerated):
    """A copy of ``accelerated`` whose convolutions and symmetric contractions cost almost nothing."""
    model = copy.deepcopy(accelerated)
    for block in model.interactions:
        block.conv_tp = _FreeConvolution(block.conv_tp.tensor_product.irreps_out.dim)
    for block in model.products:
        contraction = block.symmetric_contractions
        block.symmetric_contractions = _FreeContraction(sum(term.ir.dim for term in contraction.irreps_out))
    return model


def check(mace, accelerated, batch) -> float:
    """The largest relative error of the accelerated model's energy, forces and stress against MACE's."""
    expected = mace(dict(batch), compute_stress=True)
    got = accelerated(dict(batch), compute_stress=True)
    return max(((got[k] - expected[k]).abs().max() / expected[k].abs().max()).item()
               for k in ("energy", "forces", "stress"))


def _step(model, batch, mode):
    """One step of ``model`` on ``batch``: energies and forces (``mode == "forces"``), or a training step."""
    if getattr(model, "_orig_mod", None) is None:
        return _run(model, batch, mode)
    # compiled: the positions require grad before the call, and training traces torch.autograd.grad
    batch = dict(batch, positions=batch["positions"].detach().requires_grad_(True))
    with torch._dynamo.config.patch(trace_autograd_ops=mode == "train"):
        return _run(model, batch, mode)


def _run(model, batch, mode):
    if mode == "forces":
        return model(dict(batch), compute_force=True)["forces"]
    for parameter in model.parameters():
        parameter.grad = None
    out = model(dict(batch), training=True, compute_force=True)  # forces kept differentiable
    loss = out["energy"].square().sum() + out["forces"].square().sum()
    loss.backward()
    return loss


def compare(model, reference, batch, mode) -> float:
    """The largest relative difference of ``model``'s step from ``reference``'s: the forces, or in training the
    loss and every parameter gradient."""
    def outputs(m):
        value = _step(m, batch, mode)
        grads = [] if mode == "forces" else [p.grad.clone() for p in m.parameters() if p.grad is not None]
        return [value.detach()] + grads

    return max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
               for a, b in zip(outputs(model), outputs(reference), strict=True))


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--atoms", type=int, nargs="+", default=[343],
                        help="about this many atoms (a cube of the lattice); several sizes in turn")
    parser.add_argument("--check-atoms", type=int, default=1000,
                        help="the float64 checks run on a crystal of at most this many atoms (default: 1000)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--max-ell", type=int, default=3)
    parser.add_argument("--correlation", type=int, default=3)
    parser.add_argument("--elements", type=int, default=3)
    parser.add_argument("--r-max", type=float, default=5.0)
    parser.add_argument("--interaction", default="RealAgnosticResidualInteractionBlock")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    parser.add_argument("--mode", choices=["forces", "train"], nargs="+", default=["forces"],
                        help="forces: energies and forces (an MD step's model call); train: a training step on "
                             "energies and forces (the loss's gradient with respect to the parameters); "
                             "several in turn")
    parser.add_argument("--repeats", type=int, default=None, help="steps timed (default: 20 on CUDA, 7 on the CPU)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="stop timing a variant after this long")
    parser.add_argument("--chunk-bytes", type=int, default=None,
                        help="the accelerated convolutions' Convolution.chunk_bytes (per-edge weights computed whole "
                             "up to this size, in chunks above it; default: the library's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.chunk_bytes is not None:
        from sparse_accumulation.mace import Convolution

        Convolution.chunk_bytes = args.chunk_bytes
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    repeats = args.repeats or (20 if device.type == "cuda" else 7)
    wanted = args.variants.split(",")
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")

    started = time.perf_counter()
    mace = make_model(args).to(device)
    accelerated = accelerate(copy.deepcopy(mace))
    checked = make_batch(make_crystal(min(min(args.atoms), args.check_atoms), args.elements), mace, torch.float64,
                         device)
    error = check(mace, accelerated, checked)
    assert error < 1e-10, f"the accelerated model differs from MACE's by {error:.3g} (float64)"
    models = {"mace": mace, "accelerated": accelerated}
    cueq_error = None
    if {"cueq", "cueq-compiled"} & set(wanted):
        cueq = to_cueq(mace, device)
        if cueq is None:
            print("# cueq: cuequivariance is not installed here; its variants are skipped", flush=True)
            wanted = [v for v in wanted if v not in ("cueq", "cueq-compiled")]
        else:
            cueq_error = check(mace, cueq.to(torch.float64), checked)
            models["cueq"] = cueq
    if "floor" in wanted:
        models["floor"] = floor_model(accelerated)
    for model in models.values():
        model.to(dtype)
    del checked
    meta = {"command": "python benchmarks/mace_model.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
            "threads": torch.get_num_threads(), "versions": versions(), "dtype": args.dtype,
            "channels": args.channels, "max_ell": args.max_ell, "correlation": args.correlation,
            "elements": args.elements, "r_max": args.r_max, "interaction": args.interaction,
            "check_atoms": min(min(args.atoms), args.check_atoms), "check_float64": error,
            "cueq_check_float64": cueq_error, "setup_seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(meta), flush=True)
    rows = []
    for atoms in args.atoms:
        crystal = make_crystal(atoms, args.elements)
        batch = make_batch(crystal, mace, dtype, device)
        size = {"atoms": len(crystal), "edges": int(batch["edge_index"].shape[1])}
        print(f"# {size['atoms']:,} atoms, {size['edges']:,} edges", flush=True)
        for mode in args.mode:
            found = {}
            for variant in wanted:
                first = None
                if variant in COMPILED:  # compiled afresh for each mode (see docs/mace.rst); the first call compiles
                    torch._dynamo.reset()
                    models[variant] = torch.compile(models[COMPILED[variant]])
                    start = time.perf_counter()
                    try:
                        _step(models[variant], batch, mode)
                    except Exception as error:  # noqa: BLE001 - a model that does not compile is a result
                        rows.append({"variant": variant, "mode": mode, **size, "error": repr(error)[:300]})
                        print(f"  {mode:>6} {variant:>11}: {repr(error)[:300]}", flush=True)
                        continue
                    synchronize(device)
                    first = round(time.perf_counter() - start, 1)
                    difference = compare(models[variant], models[COMPILED[variant]], batch, mode)
                result = measure_step(lambda: _step(models[variant], batch, mode), device, repeats, args.max_seconds)
                if first is not None:
                    result.update(first_call_s=first, difference_to_eager=difference)
                rows.append({"variant": variant, "mode": mode, **size, **result})
                found[variant] = result
                shown = (f"{result['ms']:10.2f} ms (median of {result['samples']})  peak {result['peak_mb']:8.1f} MB"
                         if "ms" in result else result["error"])
                if first is not None:
                    shown += f"  (first call {first} s; {difference:.2g} from eager)"
                print(f"  {mode:>6} {variant:>11}: {shown}", flush=True)
                synchronize(device)
            for ours in ("accelerated", "compiled"):
                for other in ("mace", "cueq", "floor", "cueq-compiled"):
                    if "ms" in found.get(other, {}) and "ms" in found.get(ours, {}):
                        print(f"  {mode:>6} {ours:>11}: {found[ours]['ms'] / found[other]['ms']:.2f}x {other}'s step "
                              f"time")
            if "ms" in found.get("floor", {}) and "ms" in found.get("cueq", {}):
                print(f"  {mode:>6}       floor: {found['floor']['ms'] / found['cueq']['ms']:.2f}x cueq's step time")
        del batch
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
