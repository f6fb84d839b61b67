"""MACE's skip connection: e3nn's ``FullyConnectedTensorProduct`` of node features with one-hot node attributes,
against ``sparse_accumulation.mace.ElementLinear`` (one matrix product per element, over tiles of one element).

    python benchmarks/element_linear.py                               # CPU, 10^3 and 10^4 nodes
    python benchmarks/element_linear.py --device cuda --nodes 10000 100000

``--irreps`` to itself (default ``128x0e + 128x1o``, MACE-MP-0 "medium"'s hidden features) with ``--elements``
one-hot attributes (default 89, MACE-MP-0's), float32, elements drawn at random per node. Checked equal in
float64 first (outputs). Modes as a training step runs them (the features and weights requiring gradients):
``fwd``, ``fwd+bwd`` (``out.backward(G)``) and ``double`` (the gradient of ``(out * G).sum()`` with respect to the
features, with ``create_graph``, then the backward of its product with ``H``: what a force-training step asks of
the layer); median ms of ``--repeats`` single calls and the peak memory of one call above what was allocated
before it (as in ``convolution.py``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from convolution import peak_mb  # noqa: E402
from sparse_accumulation.bench.timing import compiled_kernels_only, measure  # noqa: E402
from sparse_accumulation.mace import ElementLinear  # noqa: E402
from symmetric_contraction import make_step  # noqa: E402

MODES = ("fwd", "fwd+bwd", "double")


def main(argv=None) -> None:
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--irreps", default="128x0e + 128x1o")
    parser.add_argument("--elements", type=int, default=89)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    from e3nn import o3

    device = torch.device(args.device)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        tp = o3.FullyConnectedTensorProduct(args.irreps, f"{args.elements}x0e", args.irreps).to(device)
    finally:
        torch.set_default_dtype(previous)
    ours = ElementLinear(tp)
    x = torch.randn(50, tp.irreps_in1.dim, device=device, dtype=torch.float64)
    y = torch.nn.functional.one_hot(torch.randint(0, args.elements, (50,), device=device), args.elements).double()
    error = ((ours(x, y) - tp(x, y)).abs().max() / tp(x, y).abs().max()).item()
    print(f"# {args.irreps} x {args.elements}x0e: float64 relative difference {error:.1e}", flush=True)
    assert error < 1e-12
    tp.float()
    for nodes in args.nodes:
        x = torch.randn(nodes, tp.irreps_in1.dim, device=device)
        elements = torch.randint(0, args.elements, (nodes,), device=device)
        y = torch.nn.functional.one_hot(elements, args.elements).float()
        G = torch.randn(nodes, tp.irreps_out.dim, device=device)
        H = torch.randn(nodes, tp.irreps_in1.dim, device=device)
        for mode in args.modes.split(","):
            found = {}
            for name, f in (("e3nn", tp), ("ours", ours)):
                step = make_step(lambda features, f=f: f(features, y), mode, x, G, H, [tp.weight])
                ms = statistics.median(measure("call", step, device, repeats=args.repeats, warmup=2))
                found[name] = (ms, peak_mb(step, device))
            (e_ms, e_mb), (o_ms, o_mb) = found["e3nn"], found["ours"]
            print(f"  {nodes:>9,} nodes {mode:>8}: e3nn {e_ms:10.3f} ms ({e_mb:8.1f} MB), ours {o_ms:9.3f} ms "
                  f"({o_mb:8.1f} MB), e3nn / ours {e_ms / o_ms:6.1f}x", flush=True)


if __name__ == "__main__":
    main()
