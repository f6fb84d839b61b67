"""What a MACE model's call keeps for its backward per edge: the tensors its autograd graph saved whose first
dimension is the edge count, by the operation that saved them, for MACE's model and the accelerated one.

    python benchmarks/per_edge_memory.py --atoms 64 --channels 128
    python benchmarks/per_edge_memory.py --atoms 64 --channels 128 --chunk-bytes 1048576 --train

The model: as ``benchmarks/md.py`` builds it (``ScaleShiftMACE``, ``--channels`` x (0e + 1o), spherical
harmonics up to 3, correlation 3, two residual interactions, 89 elements, r_max 6), float32, on a rattled rock-salt
NaCl crystal. The call: ``model(batch, training=True, compute_force=False)`` with the positions requiring grad
(what a forces step keeps until its backward), and with ``--train`` the parameters requiring grad too. Each saved
tensor is counted once (by its storage), however many graph nodes hold it; device-independent (run on the CPU).
Not counted: what ``torch.utils.checkpoint`` holds to recompute a chunk (the chunked convolutions' inputs: the
radial network's input features, the spherical harmonics, the edges: about 100 bytes an edge).
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from mace_model import make_batch, make_model  # noqa: E402
from md import nacl  # noqa: E402
from sparse_accumulation.mace import Convolution, accelerate  # noqa: E402


def saved_per_edge(model, batch, train: bool) -> dict:
    """``{(node type, shape per edge, dtype): bytes per edge}`` of the tensors the call's graph saved with one row
    per edge (each storage counted once)."""
    for p in model.parameters():
        p.requires_grad_(train)
    data = dict(batch)
    data["positions"] = data["positions"].clone().requires_grad_(True)
    out = model(data, training=True, compute_force=False)
    edges = batch["edge_index"].shape[1]
    seen_nodes, seen_storage, stack = set(), set(), [out["energy"].sum().grad_fn]
    found = collections.Counter()
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        for attr in dir(node):
            if attr.startswith("__") or attr in ("next_functions", "metadata", "saved_variables"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # noqa: BLE001 - attributes a node cannot give (freed buffers, unpacking errors)
                continue
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != edges:
                    continue
                storage = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
                if storage in seen_storage:
                    continue
                seen_storage.add(storage)
                found[(type(node).__name__, tuple(t.shape[1:]), str(t.dtype).replace("torch.", ""))] += (
                    t[0].numel() * t.element_size())
        stack.extend(f for f, _ in node.next_functions)
    return dict(found)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--atoms", type=int, default=64)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--train", action="store_true", help="the parameters require grad too")
    parser.add_argument("--chunk-bytes", type=int, default=None,
                        help="Convolution.chunk_bytes of the accelerated model")
    args = parser.parse_args(argv)
    if args.chunk_bytes is not None:
        Convolution.chunk_bytes = args.chunk_bytes
    model_args = argparse.Namespace(channels=args.channels, max_ell=3, correlation=3, elements=89, r_max=6.0,
                                    interaction="RealAgnosticResidualInteractionBlock")
    mace = make_model(model_args).float()
    batch = make_batch(nacl(args.atoms), mace, torch.float32, torch.device("cpu"))
    print(f"# {batch['positions'].shape[0]} atoms, {batch['edge_index'].shape[1]} edges; "
          f"{'training' if args.train else 'forces'} call; chunk_bytes {Convolution.chunk_bytes}")
    for name, model in (("mace", mace), ("accelerated", accelerate(copy.deepcopy(mace)))):
        found = saved_per_edge(model, batch, args.train)
        print(f"{name}: {sum(found.values())} bytes per edge saved for the backward")
        for (node, shape, dtype), size in sorted(found.items(), key=lambda kv: -kv[1]):
            print(f"  {size:7d}  {node:34s} {str(shape):14s} {dtype}")


if __name__ == "__main__":
    main()
