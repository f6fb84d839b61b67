"""Cost of an AOTInductor package on the CPU: the potential of ``examples/interaction_model.py`` (energies and
forces) run by the library's numba kernels in eager mode against its package, where the rule ops are the
decompositions of :mod:`sparse_accumulation.export` compiled by inductor.

    python benchmarks/aoti_cpu.py [--molecules 8] [--repeats 20]

Sizes: the example's full configuration (12 atoms per molecule, 16 channels, 3 layers), every molecule a
complete graph (132 edges each), float64. Prints the build times, the largest relative differences of the
package's energies and forces from eager, and median times per call.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import interaction_model as example  # noqa: E402

from sparse_accumulation.export import export_for_aoti  # noqa: E402


class EnergiesAndForces(torch.nn.Module):
    """``positions [atoms, 3]`` -> ``(energies [molecules], forces [atoms, 3])`` of fixed molecules."""

    def __init__(self, potential, species, src, dst, molecules: int):
        super().__init__()
        self.potential, self.molecules = potential, molecules
        self.register_buffer("species", species)
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)

    def forward(self, positions):
        positions = positions.detach().requires_grad_(True)
        energies = self.potential(positions, self.species, self.src, self.dst, self.molecules)
        gradient = torch.autograd.grad([energies.sum()], [positions])[0]
        return energies, -gradient


def median_ms(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecules", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    config = dict(example.SIZES["full"], molecules=args.molecules)
    generator = torch.Generator().manual_seed(0)
    positions, species = example.random_molecules(args.molecules, config["atoms"], generator)
    src, dst = example.complete_graph(args.molecules, config["atoms"])
    potential = example.build_model(config, "ours", "cpu", torch.float64)
    model = EnergiesAndForces(potential, species.reshape(-1), src, dst, args.molecules)
    positions = positions.reshape(-1, 3)
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
    print(f"{args.molecules} molecules, {positions.shape[0]} atoms, {src.shape[0]} edges, float64, "
          f"{torch.get_num_threads()} threads")
    print(f"export {exported:.1f} s, compile and package {packaged:.1f} s")
    print(f"relative difference from eager: energies {errors[0]:.1e}, forces {errors[1]:.1e}")
    eager = median_ms(lambda: model(positions), args.repeats)
    package = median_ms(lambda: loaded(positions), args.repeats)
    print(f"energies and forces: eager (numba) {eager:.2f} ms, package {package:.2f} ms, "
          f"package / eager {package / eager:.2f}")


if __name__ == "__main__":
    main()
