"""Learn a rotation-invariant energy of point clouds with a small equivariant network of CG iterations.

    python examples/invariant_energy.py                  # 300 steps on the CPU: 6 s on 2 cores, kernels cached
    python examples/invariant_energy.py --device cuda    # the same on a GPU (Triton kernels)
    python examples/invariant_energy.py --tiny           # a few seconds (what the test suite runs)

The data are made here: random clouds of points and their energy under a known rotation-invariant function
(a pair term and a three-body term in the angles, see :func:`target_energy`). The network sees, around each
point, the density of its neighbours expanded in radial Gaussians times real spherical harmonics (the
library's real basis: the real harmonics of Wikipedia, components ``m + l``), couples these features with
itself twice through :class:`sparse_accumulation.ClebschGordanProduct` (learnable per-path weights, and
learnable channel mixing per degree in between), and reads the energy off the invariant (``L = 0``)
parts of every step.

After training it checks what the construction promises on held-out clouds and random rotations: the
energy does not change when a cloud is rotated, and the ``l = 1`` features rotate like vectors (for real
harmonics ordered ``m = -1, 0, 1``, i.e. ``(y, z, x)``, the rotation matrix with its axes permuted).
"""
from __future__ import annotations

import argparse
import math
import time

import torch

import sparse_accumulation as sa
from sparse_accumulation.products import normalize_irreps, split

#: sizes of the full run and of ``--tiny``
SIZES = {"full": dict(train=1024, test=256, points=6, lmax=2, radial=8, channels=16, hidden=64, steps=300,
                      batch=64),
         "tiny": dict(train=64, test=16, points=4, lmax=2, radial=4, channels=4, hidden=16, steps=120, batch=16)}


# ----------------------------------------------------------------------------------------------------------
# data


def random_clouds(count: int, points: int, generator: torch.Generator) -> torch.Tensor:
    """``[count, points, 3]`` positions, normally distributed with unit spread."""
    return torch.randn(count, points, 3, generator=generator, dtype=torch.float64)


def random_rotations(count: int, generator: torch.Generator) -> torch.Tensor:
    """``[count, 3, 3]`` rotation matrices (determinant +1), uniformly distributed (QR of Gaussian matrices)."""
    q, r = torch.linalg.qr(torch.randn(count, 3, 3, generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    flip = torch.linalg.det(q) < 0
    q[flip, :, 0] = -q[flip, :, 0]
    return q


def _pairs(positions: torch.Tensor) -> tuple:
    """Vectors ``r_ij = x_j - x_i`` ``[..., N, N, 3]``, distances ``[..., N, N]`` and the ``i != j`` mask."""
    vectors = positions.unsqueeze(-3) - positions.unsqueeze(-2)
    n = positions.shape[-2]
    mask = ~torch.eye(n, dtype=torch.bool, device=positions.device)
    distances = torch.where(mask, vectors.norm(dim=-1), torch.ones((), dtype=positions.dtype,
                                                                   device=positions.device))
    return vectors, distances, mask


def target_energy(positions: torch.Tensor) -> torch.Tensor:
    """The function to learn: ``sum_{i != j} exp(-r_ij^2) + sum_i sum_{j != k} exp(-r_ij - r_ik) cos(angle jik)``.

    Distances and angles only, so it is invariant under rotations (and reflections). ``[..., N, 3] -> [...]``.
    """
    vectors, distances, mask = _pairs(positions)
    pair = (torch.exp(-distances**2) * mask).sum((-1, -2))
    unit = vectors / distances.unsqueeze(-1)
    weight = torch.exp(-distances) * mask  # [..., i, j]
    cosines = unit @ unit.transpose(-1, -2)  # [..., i, j, k]: cos of the angle at i between j and k
    different = ~torch.eye(positions.shape[-2], dtype=torch.bool, device=positions.device)
    triple = (weight.unsqueeze(-1) * weight.unsqueeze(-2) * cosines * different).sum((-1, -2, -3))
    return pair + triple


# ----------------------------------------------------------------------------------------------------------
# features


def real_spherical_harmonics(unit: torch.Tensor, lmax: int) -> torch.Tensor:
    """Real spherical harmonics of unit vectors ``[..., 3] -> [..., (lmax + 1)^2]``, blocks ``l = 0 .. lmax``.

    The library's real basis (docs/conventions.rst): ``sqrt(2) N P_l^|m|(cos theta) cos(m phi)`` for
    ``m > 0``, ``sqrt(2) N P_l^|m| sin(|m| phi)`` for ``m < 0`` and ``N P_l^0`` for ``m = 0``, without the
    Condon-Shortley phase, component ``m + l`` within a block. Polynomials in ``x, y, z`` (no angles):
    ``sin^m(theta) e^{i m phi} = (x + i y)^m``, and ``P_l^m = sin^m(theta) Q_l^m(z)`` by recurrence.
    """
    x, y, z = unit.unbind(-1)
    cos_like, sin_like = [torch.ones_like(x)], [torch.zeros_like(x)]  # Re and Im of (x + i y)^m
    for _ in range(lmax):
        c, s = cos_like[-1], sin_like[-1]
        cos_like.append(x * c - y * s)
        sin_like.append(x * s + y * c)
    q = {}
    for m in range(lmax + 1):
        q[m, m] = torch.full_like(z, float(math.prod(range(1, 2 * m, 2))))  # (2m - 1)!!
        if m + 1 <= lmax:
            q[m + 1, m] = (2 * m + 1) * z * q[m, m]
        for l in range(m + 2, lmax + 1):
            q[l, m] = ((2 * l - 1) * z * q[l - 1, m] - (l + m - 1) * q[l - 2, m]) / (l - m)
    blocks = []
    for l in range(lmax + 1):
        components = []
        for m in range(-l, l + 1):
            a = abs(m)
            norm = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - a) / math.factorial(l + a))
            if m == 0:
                components.append(norm * q[l, 0])
            else:
                components.append(math.sqrt(2) * norm * q[l, a] * (cos_like[a] if m > 0 else sin_like[a]))
        blocks.append(torch.stack(components, dim=-1))
    return torch.cat(blocks, dim=-1)


class NeighbourDensity(torch.nn.Module):
    """Around each point, its neighbours in Gaussian radial channels times real harmonics.

    ``[clouds, N, 3] -> [clouds, N, radial, (lmax + 1)^2]``: channel ``n``, block ``l``:
    ``sum_{j != i} exp(-(r_ij - mu_n)^2 / (2 w^2)) Y_l(r_ij / r_ij)``.
    """

    def __init__(self, lmax: int, radial: int, cutoff: float = 3.5):
        super().__init__()
        self.lmax = lmax
        self.register_buffer("centers", torch.linspace(0.3, cutoff, radial))
        self.width = (cutoff - 0.3) / radial

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        vectors, distances, mask = _pairs(positions)
        harmonics = real_spherical_harmonics(vectors / distances.unsqueeze(-1), self.lmax)
        radial = torch.exp(-((distances.unsqueeze(-1) - self.centers) / self.width) ** 2 / 2)
        radial = radial * mask.unsqueeze(-1)
        return torch.einsum("...ijn,...ijd->...ind", radial, harmonics)


# ----------------------------------------------------------------------------------------------------------
# the network


class ChannelMix(torch.nn.Module):
    """A learnable linear map over channels and over the blocks of each degree, one matrix per degree.

    ``[..., channels_in, dim] -> [..., channels_out, dim_out]`` for ``irreps = ((n_l, l), ...)`` (one entry
    per degree, as product outputs are): the ``channels_in * n_l`` blocks of degree ``l`` are mixed into
    ``channels_out`` blocks. The same matrix acts on every component ``m``, so the map commutes with
    rotations. Output irreps: ``((1, l), ...)``.
    """

    def __init__(self, irreps, channels_in: int, channels_out: int):
        super().__init__()
        self.irreps = normalize_irreps(irreps)
        self.irreps_out = tuple((1, l) for _, l in self.irreps)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(channels_out, channels_in * n) / math.sqrt(channels_in * n))
            for n, _ in self.irreps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = split(x, self.irreps)
        mixed = [torch.einsum("oc,...cm->...om", weight, blocks[l].flatten(-3, -2))
                 for weight, (_, l) in zip(self.weights, self.irreps)]
        return torch.cat(mixed, dim=-1)


class InvariantEnergy(torch.nn.Module):
    """Energy of a cloud from CG iterations of neighbour densities.

    ``X1 = mix(density)`` (degrees ``0 .. lmax``), ``X2 = mix(CG(X1, X1))``, ``X3 = CG(X2, X1)`` restricted
    to ``L = 0``; both products are :class:`sparse_accumulation.ClebschGordanProduct` with a learnable weight
    per path (paths with ``l1 + l2 + L`` even). The ``L = 0`` parts of ``X1``, ``X2`` and ``X3`` (2-, 3- and
    4-body invariants) go through a small MLP to an energy per point, summed over the cloud.
    """

    def __init__(self, lmax: int, radial: int, channels: int, hidden: int):
        super().__init__()
        self.density = NeighbourDensity(lmax, radial)
        self.mix1 = ChannelMix(lmax, radial, channels)
        self.product2 = sa.ClebschGordanProduct(lmax, lmax, lmax, parity="even", normalization="component",
                                                weights=True)
        self.mix2 = ChannelMix(self.product2.irreps_out, channels, channels)
        self.product3 = sa.ClebschGordanProduct(self.mix2.irreps_out, lmax, 0, parity="even",
                                                normalization="component", weights=True)
        invariants = 2 * channels + channels * self.product3.irreps_out[0][0]
        self.readout = torch.nn.Sequential(torch.nn.Linear(invariants, hidden), torch.nn.SiLU(),
                                           torch.nn.Linear(hidden, 1))

    def features(self, positions: torch.Tensor) -> tuple:
        """``(X1, X2, X3)``, each ``[clouds, N, channels, dim]`` in the product layout."""
        x1 = self.mix1(self.density(positions))
        x2 = self.mix2(self.product2(x1, x1))
        x3 = self.product3(x2, x1)
        return x1, x2, x3

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        x1, x2, x3 = self.features(positions)
        invariants = torch.cat([x1[..., 0], x2[..., 0], x3.flatten(-2)], dim=-1)  # L = 0 comes first
        return self.readout(invariants).squeeze(-1).sum(-1)


# ----------------------------------------------------------------------------------------------------------
# training and checks


def train(model, positions, energies, steps: int, batch: int, generator, log_every: int) -> list:
    """Adam on the mean squared error of standardised energies; returns the loss of every logged step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    losses = []
    for step in range(steps):
        index = torch.randint(0, len(positions), (batch,), generator=generator).to(positions.device)
        loss = torch.nn.functional.mse_loss(model(positions[index]), energies[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % log_every == 0 or step == steps - 1:
            losses.append(loss.item())
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    return losses


def rotation_errors(model, positions, rotations) -> tuple:
    """Max relative change of the energy under rotation, and of ``l = 1`` features against rotated vectors."""
    rotations = rotations.to(positions)
    rotated = positions @ rotations.transpose(-1, -2)  # x -> R x for every point of cloud c, R = rotations[c]
    with torch.no_grad():
        energy, energy_rotated = model(positions), model(rotated)
        x1, x1_rotated = model.features(positions)[0], model.features(rotated)[0]
    invariance = float((energy_rotated - energy).abs().max() / energy.abs().max())
    order = [1, 2, 0]  # real l = 1 components (m = -1, 0, 1) are (y, z, x)
    D1 = rotations[:, order][:, :, order].unsqueeze(1).unsqueeze(1)  # [clouds, 1, 1, 3, 3]
    vectors, vectors_rotated = x1[..., 1:4], x1_rotated[..., 1:4]
    expected = (D1 @ vectors.unsqueeze(-1)).squeeze(-1)
    equivariance = float((vectors_rotated - expected).abs().max() / expected.abs().max())
    return invariance, equivariance


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--steps", type=int, help="training steps (default: 300, tiny: 120)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = dict(SIZES["tiny" if args.tiny else "full"])
    if args.steps is not None:
        sizes["steps"] = args.steps
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    start = time.perf_counter()

    positions = random_clouds(sizes["train"] + sizes["test"], sizes["points"], generator)
    energies = target_energy(positions)
    mean, std = energies[:sizes["train"]].mean(), energies[:sizes["train"]].std()
    positions = positions.to(device, torch.float32)
    targets = ((energies - mean) / std).to(device, torch.float32)
    train_x, test_x = positions[:sizes["train"]], positions[sizes["train"]:]
    train_y, test_y = targets[:sizes["train"]], targets[sizes["train"]:]

    model = InvariantEnergy(sizes["lmax"], sizes["radial"], sizes["channels"], sizes["hidden"]).to(device)
    print(f"{sizes['train']} training and {sizes['test']} held-out clouds of {sizes['points']} points; model: "
          f"{sum(p.numel() for p in model.parameters())} parameters, products with {model.product2.n_paths} and "
          f"{model.product3.n_paths} paths; device {device}", flush=True)
    def errors():
        """Mean squared errors (standardised energies) on the training and the held-out clouds."""
        with torch.no_grad():
            return tuple(torch.nn.functional.mse_loss(model(x), y).item() for x, y in ((train_x, train_y),
                                                                                       (test_x, test_y)))

    train_before, test_before = errors()
    losses = train(model, train_x, train_y, sizes["steps"], sizes["batch"], generator,
                   max(1, sizes["steps"] // 10))
    train_after, test_after = errors()
    print(f"mean squared error (standardised energies), before -> after training: training clouds "
          f"{train_before:.4f} -> {train_after:.4f}, held-out clouds {test_before:.4f} -> {test_after:.4f}")

    invariance, equivariance = rotation_errors(model, test_x, random_rotations(len(test_x), generator))
    print(f"rotating the held-out clouds: energy max relative change {invariance:.1e}, "
          f"l = 1 features against rotated vectors {equivariance:.1e}")
    tolerance = 1e-4  # float32 rounding; a wrong convention gives errors of order 1
    assert train_after < train_before / 2, f"the loss did not go down: {train_before:.4f} -> {train_after:.4f}"
    assert invariance < tolerance, f"the energy is not rotation-invariant: {invariance:.2e}"
    assert equivariance < tolerance, f"the l = 1 features do not rotate like vectors: {equivariance:.2e}"
    print(f"done in {time.perf_counter() - start:.1f} s")
    return {"losses": losses, "train": (train_before, train_after), "test": (test_before, test_after),
            "invariance": invariance, "equivariance": equivariance}


if __name__ == "__main__":
    main()
