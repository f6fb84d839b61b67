"""Cost of an AOTInductor package on the CPU: a message-passing tensor product
(:class:`sparse_accumulation.e3nn.TensorProduct`, its rule op) with energies and forces, run by the library's
numba kernels in eager mode against its package, where the rule ops are the decompositions of
:mod:`sparse_accumulation.export` compiled by inductor.

    python benchmarks/aoti_cpu.py [--atoms 64] [--neighbours 16] [--channels 4] [--repeats 20]

The model: node features ``channels x (0e + 1o)`` of every atom, times the spherical harmonics ``0e + 1o`` of
its edges' vectors, every "uvu" path weighted per edge by a linear radial map, summed at the edge's
destination; the energy is the sum of ``tanh`` of the scalars; forces are minus its gradient. Edges: each
atom's ``neighbours`` next atoms (cyclically), float64. Prints the build times, the largest relative
differences of the package's energies and forces from eager, and median times per call.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from e3nn import o3

from sparse_accumulation.e3nn import TensorProduct
from sparse_accumulation.export import export_for_aoti

from cpu import median_ms


class EnergyAndForces(torch.nn.Module):
    """``positions [atoms, 3]`` -> ``(energy [], forces [atoms, 3])`` over fixed edges."""

    def __init__(self, atoms: int, neighbours: int, channels: int):
        super().__init__()
        irreps = o3.Irreps(f"{channels}x0e + {channels}x1o")
        instructions = [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 1, "uvu", True),
                        (1, 1, 0, "uvu", True)]
        self.tp = TensorProduct(irreps, "0e + 1o", irreps, instructions, shared_weights=False,
                                internal_weights=False, dtype=torch.float64)
        self.sh = o3.SphericalHarmonics("0e + 1o", normalize=True, normalization="component")
        self.radial = torch.nn.Linear(3, self.tp.weight_numel, dtype=torch.float64)
        self.features = torch.nn.Parameter(torch.randn(atoms, irreps.dim, dtype=torch.float64))
        self.channels = channels
        src = torch.arange(atoms).repeat_interleave(neighbours)
        self.register_buffer("src", src)
        self.register_buffer("dst", (src + torch.arange(1, neighbours + 1).repeat(atoms)) % atoms)

    def forward(self, positions):
        positions = positions.detach().requires_grad_(True)
        vectors = positions[self.dst] - positions[self.src]
        lengths = vectors.pow(2).sum(-1, keepdim=True).sqrt()
        weights = self.radial(torch.cat([lengths, lengths.cos(), lengths.sin()], dim=-1))
        nodes = self.tp(self.features, self.sh(vectors), weights, indices_1=self.src, indices_out=self.dst,
                        size_out=positions.shape[0])
        energy = nodes[:, :self.channels].tanh().sum()
        return energy, -torch.autograd.grad([energy], [positions])[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=64)
    parser.add_argument("--neighbours", type=int, default=16)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = EnergyAndForces(args.atoms, args.neighbours, args.channels)
    positions = 3 * torch.randn(args.atoms, 3, dtype=torch.float64)
    expected = model(positions)

    start = time.perf_counter()
    program = export_for_aoti(model, (positions,), trace_autograd=True)
    exported = time.perf_counter() - start
    path = os.path.join(tempfile.mkdtemp(), "model.pt2")
    start = time.perf_counter()
    torch._inductor.aoti_compile_and_package(program, package_path=path)
    packaged = time.perf_counter() - start
    loaded = torch._inductor.aoti_load_package(path)
    got = loaded(positions)
    errors = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, expected)]
    print(f"{args.atoms} atoms, {model.src.shape[0]} edges, {args.channels} channels, float64, "
          f"{torch.get_num_threads()} threads")
    print(f"export {exported:.1f} s, compile and package {packaged:.1f} s")
    print(f"relative difference from eager: energies {errors[0]:.1e}, forces {errors[1]:.1e}")
    eager = median_ms(lambda: model(positions), args.repeats, warmup=1)
    package = median_ms(lambda: loaded(positions), args.repeats, warmup=1)
    print(f"energies and forces: eager (numba) {eager:.2f} ms, package {package:.2f} ms, "
          f"package / eager {package / eager:.2f}")


if __name__ == "__main__":
    main()
