"""A NequIP-like interatomic potential on this library's message passing, trained on energies and forces.

    python examples/interaction_model.py                         # CPU, a few minutes
    python examples/interaction_model.py --tiny                  # under a minute on two CPU cores (CI runs it)
    python examples/interaction_model.py --device cuda --compile default      # or reduce-overhead

The model: atom types embedded as scalars; ``--layers`` interaction layers, each the fused message-passing
product of :class:`sparse_accumulation.e3nn.TensorProduct` (node features of the edge's source times the
edge's spherical harmonics, every "uvu" path weighted per edge by a radial network, summed at the edge's
destination, nothing per edge materialised), a linear mixing of the paths, a self-interaction of the layer's
input, and a gated nonlinearity; the energy is a linear readout of the scalars summed over each molecule.
Forces are minus the gradient of the energy with respect to positions, taken with ``create_graph=True``, so a
training step runs second derivatives through every layer.

The data are made here: random molecules of ``--atoms`` atoms of two elements, their energy a smooth pair
potential (Morse, with a cutoff) and their forces its exact gradient. Each molecule is a complete graph (every
ordered pair of its atoms), which the radial network's smooth cutoff turns into a radius graph; so every batch
has the same shapes, and compiled steps never recompile.

``--backend`` swaps the message-passing product: ``ours`` (the fused product above), ``e3nn`` (e3nn's
``TensorProduct`` on gathered rows, then ``index_add``) or ``cueq`` (cuEquivariance's ``ChannelWiseTensorProduct``
with its gather and scatter indices, when it is installed); ``benchmarks/model_step.py`` times the three.
After training, the example checks that the learnt energy does not change, and the forces rotate with the
molecule, under random rotations.

Several processes, with DistributedDataParallel (gloo between CPU processes, NCCL between GPUs)::

    torchrun --nproc_per_node=2 examples/interaction_model.py --tiny             # two CPU processes
    torchrun --nproc_per_node=4 examples/interaction_model.py --device cuda      # one GPU per process

Launched by ``torchrun``, each process takes an equal share of the ``--batch`` molecules of every step (rank
``r`` the ``r``-th consecutive share; with ``--device cuda``, the GPU of its local rank), so ``--batch`` must be
a multiple of the number of processes. The loss is a mean over molecules and DDP averages the processes'
gradients, so a step on N processes is the step of one process over the whole batch, eager or compiled, up to
the order of the sums: with ``--dtype float64``, the parameters that ``--save PATH`` writes after the tiny run on
2 or 4 processes and on one agree to 2.5e-16 (relative). Rank 0 alone prints and saves.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import time
import warnings

import torch

#: sizes of the full run and of ``--tiny``
SIZES = {"full": dict(molecules=96, atoms=12, channels=16, layers=3, radial=8, hidden=32, steps=150, batch=8),
         "tiny": dict(molecules=16, atoms=6, channels=4, layers=2, radial=4, hidden=8, steps=25, batch=4)}
CUTOFF = 3.0
#: the degrees of the spherical harmonics and of the node features (parities of the harmonics)
SH_IRREPS = "0e + 1o + 2e + 3o"
KEPT = ("0e", "1o", "2e")


# ----------------------------------------------------------------------------------------------------------
# data


def random_molecules(count: int, atoms: int, generator: torch.Generator) -> tuple:
    """``(positions [count, atoms, 3], species [count, atoms])``: atoms spread in a ball (no two closer than
    0.8), two elements."""
    positions = torch.empty(count, atoms, 3, dtype=torch.float64)
    radius = 0.9 * atoms ** (1 / 3)
    for c in range(count):
        placed = []
        while len(placed) < atoms:
            candidate = (torch.rand(3, generator=generator, dtype=torch.float64) * 2 - 1) * radius
            if candidate.norm() <= radius and all((candidate - p).norm() > 0.8 for p in placed):
                placed.append(candidate)
        positions[c] = torch.stack(placed)
    species = torch.randint(0, 2, (count, atoms), generator=generator)
    return positions, species


def complete_graph(molecules: int, atoms: int, device=None) -> tuple:
    """``(src, dst)``: every ordered pair of distinct atoms of each molecule (atoms numbered molecule after
    molecule), sorted by destination."""
    i, j = torch.meshgrid(torch.arange(atoms), torch.arange(atoms), indexing="ij")
    keep = i != j
    dst, src = i[keep], j[keep]
    offsets = (torch.arange(molecules) * atoms)[:, None]
    return (src[None] + offsets).reshape(-1).to(device), (dst[None] + offsets).reshape(-1).to(device)


def cutoff_envelope(r: torch.Tensor) -> torch.Tensor:
    """A smooth cutoff: 1 at 0, 0 with zero slope and curvature at ``CUTOFF``."""
    x = (r / CUTOFF).clamp(max=1.0)
    return 1 - 10 * x ** 3 + 15 * x ** 4 - 6 * x ** 5


def target_energy(positions: torch.Tensor, species: torch.Tensor) -> torch.Tensor:
    """``[molecules]`` energies of a Morse pair potential (depth and range per pair of elements), cut off."""
    count, atoms, _ = positions.shape
    src, dst = complete_graph(1, atoms)
    r = (positions[:, src] - positions[:, dst]).norm(dim=-1)
    pair = species[:, src] + species[:, dst]                 # 0, 1 or 2
    depth = torch.tensor([1.0, 0.7, 0.4], dtype=positions.dtype)[pair]
    r0 = torch.tensor([1.1, 1.3, 1.5], dtype=positions.dtype)[pair]
    morse = depth * ((1 - torch.exp(-1.5 * (r - r0))) ** 2 - 1)
    return 0.5 * (morse * cutoff_envelope(r)).sum(-1)       # each pair appears twice


def energies_and_forces(positions: torch.Tensor, species: torch.Tensor) -> tuple:
    """The targets: energies ``[molecules]`` and forces ``[molecules, atoms, 3]`` (float64)."""
    positions = positions.clone().requires_grad_()
    energy = target_energy(positions, species)
    forces = -torch.autograd.grad(energy.sum(), positions)[0]
    return energy.detach(), forces


# ----------------------------------------------------------------------------------------------------------
# the model


def _o3():
    from e3nn import o3

    return o3


class RadialNetwork(torch.nn.Module):
    """Per-edge weights from the edge length: sine Bessel functions times the cutoff envelope, then an MLP."""

    def __init__(self, basis: int, hidden: int, outputs: int):
        super().__init__()
        self.register_buffer("frequencies", torch.arange(1, basis + 1) * math.pi / CUTOFF)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(basis, hidden), torch.nn.SiLU(),
                                       torch.nn.Linear(hidden, outputs))

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        bessel = torch.sin(self.frequencies * r[:, None]) / r[:, None]
        return self.mlp(bessel * cutoff_envelope(r)[:, None])


class IrrepsLinear(torch.nn.Module):
    """A linear map between e3nn-layout features that mixes channels within each irrep type (equivariant): the
    output irreps of one type get a learnt ``[mul_in, mul_out]`` map of all input channels of that type (one
    matrix product per type)."""

    def __init__(self, irreps_in, irreps_out):
        super().__init__()
        o3 = _o3()
        self.irreps_in, self.irreps_out = o3.Irreps(irreps_in), o3.Irreps(irreps_out)
        starts_in, starts_out = [0], [0]
        for mul, ir in self.irreps_in:
            starts_in.append(starts_in[-1] + mul * ir.dim)
        for mul, ir in self.irreps_out:
            starts_out.append(starts_out[-1] + mul * ir.dim)
        # per irrep type (plain ints for torch.compile): input blocks (start, mul), output blocks (start, mul), dim
        self.types = []
        weights = []
        for ir in sorted({ir for _, ir in self.irreps_out}, key=lambda ir: (ir.l, ir.p)):
            sources = tuple((starts_in[i], mul) for i, (mul, other) in enumerate(self.irreps_in) if other == ir)
            targets = tuple((starts_out[i], mul) for i, (mul, other) in enumerate(self.irreps_out) if other == ir)
            mul_in, mul_out = sum(m for _, m in sources), sum(m for _, m in targets)
            self.types.append((sources, targets, ir.dim))
            weights.append(torch.nn.Parameter(torch.randn(max(mul_in, 1), mul_out) / math.sqrt(max(mul_in, 1))))
        self.weights = torch.nn.ParameterList(weights)
        self.dim_out = starts_out[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(x.shape[0], self.dim_out)
        for (sources, targets, dim), weight in zip(self.types, self.weights):
            if not sources:
                continue
            inputs = torch.cat([x[:, start:start + mul * dim].reshape(-1, mul, dim) for start, mul in sources], 1)
            mixed = torch.einsum("num,uv->nvm", inputs, weight)
            first = 0
            for start, mul in targets:
                out[:, start:start + mul * dim] = mixed[:, first:first + mul].reshape(x.shape[0], mul * dim)
                first += mul
        return out


class Gate(torch.nn.Module):
    """Scalars through SiLU; each ``l > 0`` irrep times the sigmoid of a gate scalar per channel."""

    def __init__(self, channels: int, degrees):
        super().__init__()
        self.channels, self.degrees = channels, tuple(degrees)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.channels
        scalars, gates = x[:, :c], torch.sigmoid(x[:, c:c * len(self.degrees)])
        pieces, start = [torch.nn.functional.silu(scalars)], c * len(self.degrees)
        for i, l in enumerate(self.degrees[1:]):
            block = x[:, start:start + c * (2 * l + 1)].reshape(-1, c, 2 * l + 1)
            pieces.append((block * gates[:, i * c:(i + 1) * c, None]).reshape(x.shape[0], -1))
            start += c * (2 * l + 1)
        return torch.cat(pieces, dim=1)


def _paths(irreps_in, irreps_sh):
    """``(irreps_mid, instructions)``: every "uvu" path of the inputs into a kept irrep, each into its own
    output irrep (NequIP's convolution)."""
    o3 = _o3()
    kept = [o3.Irrep(k) for k in KEPT]
    mid, instructions = [], []
    for i1, (mul, ir1) in enumerate(irreps_in):
        for i2, (_, ir2) in enumerate(irreps_sh):
            for ir in ir1 * ir2:
                if ir in kept:
                    instructions.append((i1, i2, len(mid), "uvu", True))
                    mid.append((mul, ir))
    return o3.Irreps(mid), instructions


class Convolution(torch.nn.Module):
    """``h[i] = sum over edges e into i of tp(x[src_e], sh_e, w_e)`` with one of three products."""

    def __init__(self, irreps_in, irreps_sh, backend: str):
        super().__init__()
        o3 = _o3()
        self.backend = backend
        irreps_mid, instructions = _paths(o3.Irreps(irreps_in), o3.Irreps(irreps_sh))
        args = (irreps_in, irreps_sh, irreps_mid, instructions)
        if backend == "ours":
            from sparse_accumulation.e3nn import TensorProduct

            self.tp = TensorProduct(*args, shared_weights=False, internal_weights=False)
        elif backend == "e3nn":
            self.tp = o3.TensorProduct(*args, shared_weights=False, internal_weights=False)
        elif backend == "cueq":
            import cuequivariance as cue
            import cuequivariance_torch as cuet

            self.tp = cuet.ChannelWiseTensorProduct(
                cue.Irreps("O3", str(o3.Irreps(irreps_in))), cue.Irreps("O3", str(o3.Irreps(irreps_sh))),
                [cue.O3(ir.l, ir.p) for _, ir in irreps_mid], layout=cue.mul_ir, shared_weights=False,
                internal_weights=False)
            irreps_mid = o3.Irreps(str(self.tp.irreps_out))
        else:
            raise ValueError(f"backend must be one of ours, e3nn, cueq; got {backend!r}")
        self.irreps_mid, self.weight_numel = irreps_mid, self.tp.weight_numel

    def forward(self, x, sh, weights, src, dst, nodes: int):
        if self.backend == "e3nn":
            messages = self.tp(x[src], sh, weights)
            return torch.zeros(nodes, messages.shape[1], dtype=x.dtype, device=x.device).index_add(0, dst, messages)
        return self.tp(x, sh, weights, indices_1=src, indices_out=dst, size_out=nodes)


class Interaction(torch.nn.Module):
    """Convolution, linear mixing of its paths (plus a self-interaction of the input), gated nonlinearity."""

    def __init__(self, irreps_in, channels: int, config: dict, backend: str, neighbours: float):
        super().__init__()
        o3 = _o3()
        self.conv = Convolution(irreps_in, SH_IRREPS, backend)
        self.radial = RadialNetwork(config["radial"], config["hidden"], self.conv.weight_numel)
        degrees = [o3.Irrep(k).l for k in KEPT]
        gated = o3.Irreps(f"{channels}x0e") * len(KEPT) + o3.Irreps("+".join(f"{channels}x{k}" for k in KEPT[1:]))
        self.mix = IrrepsLinear(self.conv.irreps_mid, gated)
        self.skip = IrrepsLinear(irreps_in, gated)
        self.gate = Gate(channels, degrees)
        self.scale = 1 / math.sqrt(neighbours)
        self.irreps_out = o3.Irreps("+".join(f"{channels}x{k}" for k in KEPT))

    def forward(self, x, sh, r, src, dst):
        h = self.conv(x, sh, self.radial(r), src, dst, x.shape[0])
        return self.gate(self.mix(h) * self.scale + self.skip(x))


class Potential(torch.nn.Module):
    """Energies of molecules from positions, species and the graph of each molecule's atom pairs."""

    def __init__(self, config: dict, backend: str = "ours"):
        super().__init__()
        o3 = _o3()
        channels = config["channels"]
        self.embedding = torch.nn.Embedding(2, channels)
        irreps = o3.Irreps(f"{channels}x0e")
        layers = []
        for _ in range(config["layers"]):
            layers.append(Interaction(irreps, channels, config, backend, config["atoms"] - 1))
            irreps = layers[-1].irreps_out
        self.layers = torch.nn.ModuleList(layers)
        self.readout = torch.nn.Linear(channels, 1)
        self.lmax = o3.Irreps(SH_IRREPS).lmax

    def forward(self, positions, species, src, dst, molecules: int):
        """``positions [atoms, 3]``, ``species [atoms]`` -> energies ``[molecules]``."""
        vectors = positions[src] - positions[dst]
        r = vectors.norm(dim=-1)
        sh = _o3().spherical_harmonics(list(range(self.lmax + 1)), vectors, normalize=True,
                                       normalization="component")
        x = self.embedding(species)
        for layer in self.layers:
            x = layer(x, sh, r, src, dst)
        atom_energy = self.readout(x[:, :self.readout.in_features]).squeeze(-1)
        return atom_energy.reshape(molecules, -1).sum(-1)


def loss_and_predictions(model, positions, species, src, dst, energies, forces):
    """``(loss, predicted energies, predicted forces)``: energy MSE per atom squared plus force MSE; the
    forces taken with ``create_graph=True``, so the loss's gradient runs second derivatives."""
    molecules, atoms = energies.shape[0], positions.shape[0] // energies.shape[0]
    positions = positions.detach().requires_grad_()
    predicted = model(positions, species, src, dst, molecules)
    predicted_forces = -torch.autograd.grad(predicted.sum(), positions, create_graph=True)[0]
    loss = ((predicted - energies) ** 2).mean() / atoms ** 2 + ((predicted_forces - forces) ** 2).mean()
    return loss, predicted, predicted_forces


class TrainingLoss(torch.nn.Module):
    """``loss(positions, species, src, dst, energies, forces)``, a function of ``model``, as a module holding the
    model's parameters (for DistributedDataParallel to wrap)."""

    def __init__(self, model: torch.nn.Module, loss):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *inputs):
        return self.loss(*inputs)


def compiled(function, mode: str):
    """``function`` compiled (``mode``: none, default or reduce-overhead), with autograd.grad traced into the
    graph where this torch can (the forces of the loss)."""
    if mode == "none":
        return function
    if hasattr(torch._dynamo.config, "trace_autograd_ops"):
        torch._dynamo.config.trace_autograd_ops = True
    return torch.compile(function, mode=None if mode == "default" else mode)


# ----------------------------------------------------------------------------------------------------------
# training and checks


def batches(positions, species, energies, forces, size: int, device, dtype, rank: int = 0, ranks: int = 1):
    """Batches of ``size`` molecules, of which this process takes the ``rank``-th of ``ranks`` equal consecutive
    shares of ``share = size // ranks`` molecules: flat positions ``[share * atoms, 3]``, species, energies,
    forces."""
    share = size // ranks
    for start in range(0, positions.shape[0] - size + 1, size):
        part = slice(start + rank * share, start + (rank + 1) * share)
        yield (positions[part].reshape(-1, 3).to(device, dtype), species[part].reshape(-1).to(device),
               energies[part].to(device, dtype), forces[part].reshape(-1, 3).to(device, dtype))


#: what ``--backend cueq`` imports, and how to install it
CUEQ_MODULES = ("cuequivariance", "cuequivariance_torch")
CUEQ_INSTALL = ("pip install cuequivariance-torch (and, for its CUDA kernels, cuequivariance-ops-torch-cu12 "
                "or -cu13)")


def _positive(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = "int"  # argparse names the type in its message for a value that is not a number
    return parse


#: the environment torchrun gives each process it starts
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def build_model(config: dict, backend: str, device, dtype) -> Potential:
    """The potential made in ``dtype`` (its parameters, coefficients and radial frequencies; float32 is torch's
    default), on ``device``."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return Potential(config, backend).to(device)
    finally:
        torch.set_default_dtype(default)


def main(argv=None) -> dict:
    """Train and check as ``argv`` (the command line's by default) says, on DDP's share of each batch when
    ``torchrun`` launched this process; :func:`train`'s results."""
    full, tiny = SIZES["full"], SIZES["tiny"]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small sizes and few steps (under a minute)")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda (default: cpu); under torchrun, cuda is the GPU of each local rank")
    parser.add_argument("--compile", choices=("none", "default", "reduce-overhead"), default="none",
                        help="torch.compile the training step: default mode, or reduce-overhead (CUDA graphs; "
                             "--device cuda); default: none (eager)")
    parser.add_argument("--backend", choices=("ours", "e3nn", "cueq"), default="ours",
                        help="the message-passing product (default: ours); cueq needs cuEquivariance: "
                             + CUEQ_INSTALL)
    parser.add_argument("--layers", type=_positive(1), default=None,
                        help=f"interaction layers (default: {full['layers']}, tiny: {tiny['layers']})")
    parser.add_argument("--atoms", type=_positive(2), default=None,
                        help=f"atoms per molecule (default: {full['atoms']}, tiny: {tiny['atoms']})")
    parser.add_argument("--steps", type=_positive(1), default=None,
                        help=f"training steps (default: {full['steps']}, tiny: {tiny['steps']})")
    parser.add_argument("--batch", type=_positive(1), default=None,
                        help=f"molecules per step, over all processes (default: {full['batch']}, tiny: "
                             f"{tiny['batch']}; at most the {full['molecules']} or {tiny['molecules']} molecules "
                             f"of the data, and under torchrun a multiple of the number of processes)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="dtype of the model and the data (default: float32)")
    parser.add_argument("--save", metavar="PATH", default=None,
                        help="write the trained model's state dict to PATH (torch.save; rank 0 under torchrun)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the model (default: 0)")
    args = parser.parse_args(argv)
    if args.backend == "cueq":
        missing = [name for name in CUEQ_MODULES if importlib.util.find_spec(name) is None]
        if missing:
            parser.error(f"--backend cueq needs cuEquivariance, which is not installed (no module "
                         f"{' or '.join(missing)}): {CUEQ_INSTALL}")
    config = dict(SIZES["tiny" if args.tiny else "full"])
    for name in ("layers", "atoms", "steps", "batch"):
        if getattr(args, name) is not None:
            config[name] = getattr(args, name)
    if config["batch"] > config["molecules"]:
        parser.error(f"--batch {config['batch']} is more than the {config['molecules']} molecules of the data")
    device = torch.device(args.device)
    distributed = all(name in os.environ for name in TORCHRUN_VARIABLES)
    if not distributed:
        return train(args, config, device)
    ranks, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if config["batch"] % ranks:
        parser.error(f"--batch {config['batch']} does not split into equal shares for {ranks} processes: give a "
                     f"multiple of {ranks}")
    if device.type == "cuda":
        if device.index is not None:
            parser.error(f"--device {args.device} names one GPU; under torchrun each process takes the GPU of its "
                         f"local rank: give --device cuda")
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return train(args, config, device, rank, ranks, distributed=True)
    finally:
        torch.distributed.destroy_process_group()


def train(args, config: dict, device, rank: int = 0, ranks: int = 1, distributed: bool = False) -> dict:
    """Train as ``args`` say on this process's share of every batch (all of it in one process; with
    ``distributed``, DistributedDataParallel over the initialised process group of ``ranks`` processes), check
    the trained model under rotations, and return the losses and the checks' errors."""
    show = print if rank == 0 else (lambda *_, **__: None)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)  # the same initial parameters on every process (DDP also sends rank 0's)

    positions, species = random_molecules(config["molecules"], config["atoms"], generator)
    energies, forces = energies_and_forces(positions, species)
    model = build_model(config, args.backend, device, dtype)
    share = config["batch"] // ranks
    src, dst = complete_graph(share, config["atoms"], device)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    step_loss = compiled(lambda *inputs: loss_and_predictions(model, *inputs)[0], args.compile)
    if distributed:
        # DDP wraps the whole loss, compiled or not: compiling a call of a DDP module breaks the graph at the
        # module, and the forces' autograd.grad then fails in the compiled backward. find_unused_parameters:
        # the first layer's self-interaction holds weights for the l > 0 irreps its scalar input lacks, which
        # get no gradient, and DDP expects one for every parameter. (static_graph would allow them too, but its
        # first step averages the gradients when the first backward through the loss ends, the forces'
        # autograd.grad's, before the parameters have any.)
        step_loss = torch.nn.parallel.DistributedDataParallel(
            TrainingLoss(model, step_loss), device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=True)
        # the readout's [1, channels] weight gets gradients of strides (1, 1), the same layout for a dimension of
        # size 1, which DDP reports as it copies them into its buckets
        warnings.filterwarnings("ignore", "Grad strides do not match bucket view strides")

    processes = f", {ranks} processes ({torch.distributed.get_backend()})" if distributed else ""
    show(f"{config['molecules']} molecules of {config['atoms']} atoms, {src.shape[0] * ranks} edges per batch, "
         f"{sum(p.numel() for p in model.parameters())} parameters, backend {args.backend}, "
         f"compile {args.compile}, {device}{processes}")
    epoch = list(batches(positions, species, energies, forces, config["batch"], device, dtype, rank, ranks))
    losses, started = [], time.perf_counter()
    for step in range(config["steps"]):
        p, s, e, f = epoch[step % len(epoch)]
        if args.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        loss = step_loss(p, s, src, dst, e, f)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if distributed:  # the loss of the whole batch: the mean of the processes' equal shares
            loss = loss.detach().clone()
            torch.distributed.all_reduce(loss)
            loss /= ranks
        losses.append(loss.item())
        if step % max(1, config["steps"] // 5) == 0 or step == config["steps"] - 1:
            show(f"step {step:4d}  loss {losses[-1]:.4f}  ({time.perf_counter() - started:.1f} s)", flush=True)
    first = sum(losses[:len(epoch)]) / len(epoch)
    last = sum(losses[-len(epoch):]) / len(epoch)
    show(f"mean loss over an epoch: first {first:.4f}, last {last:.4f}")
    if args.save is not None and rank == 0:
        torch.save(model.state_dict(), args.save)
        show(f"saved the trained model's state dict to {args.save}")

    # the learnt energy is invariant and its forces rotate with the molecules
    p, s, _, _ = epoch[0]
    rotation = _o3().rand_matrix(dtype=torch.float64).to(device, dtype)
    centered = p.reshape(share, -1, 3)
    centered = (centered - centered.mean(1, keepdim=True)).reshape(-1, 3)
    rotated = centered @ rotation.T
    zeros_e = torch.zeros(share, device=device, dtype=dtype)
    zeros_f = torch.zeros_like(p)
    _, energy, force = loss_and_predictions(model, centered, s, src, dst, zeros_e, zeros_f)
    _, energy_rotated, force_rotated = loss_and_predictions(model, rotated, s, src, dst, zeros_e, zeros_f)
    invariance = ((energy_rotated - energy).abs().max() / energy.abs().max()).item()
    equivariance = ((force_rotated - force @ rotation.T).abs().max() / force.abs().max()).item()
    show(f"rotating the molecules: energies change by {invariance:.1e}, forces rotate to within "
         f"{equivariance:.1e} (relative)")
    return {"loss": (first, last), "invariance": invariance, "equivariance": equivariance}


if __name__ == "__main__":
    main()
