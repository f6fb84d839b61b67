"""Operations per forces call of a MACE model, by layer, and the tensors alive at its peak (device independent).

    python benchmarks/op_counts.py --atoms 64 --channels 32
    python benchmarks/op_counts.py --atoms 1000 --channels 64 --memory --chunk-bytes 16777216

On a GPU each operation is at least one kernel, and in a small system's captured step each costs its launch
rather than its arithmetic, so the count of operations bounds what a replay costs. The model: MACE's
``ScaleShiftMACE`` as in ``benchmarks/md.py`` (``--channels`` x (0e + 1o), max_ell 3, correlation 3, two
residual interactions, 89 elements, r_max 6), on a rattled NaCl crystal, float32 on the CPU. Variants: ``mace``
(as MACE built it), ``ours-maces-edges`` (``accelerate``, then MACE's own spherical harmonics, radial embedding and
reshapes put back) and ``ours`` (``accelerate``). Counted: the aten and library operations a third call
dispatches (views, shape queries and ``detach`` left out), forward by the model's layer that ran them (two levels
deep), and the backward of the forces as one group. With ``--memory``: the largest total of live tensors the call
makes (storages, outputs of the operations seen by a dispatch mode, so calls take the registered ops' path) and
which were alive then; with ``--layers``: the operations of each edge layer alone (forward, and the backward of
its outputs' sum), MACE's and e3nn's against the converted one; with ``--resident``: the growth of the process's resident memory over a call (three
calls, as ``benchmarks/convolution.py`` measures it: after ``malloc_trim``) and the median time of five.
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from convolution import peak_mb  # noqa: E402
from md import nacl, with_maces_edge_layers  # noqa: E402
from sparse_accumulation.bench.timing import elapsed_ms  # noqa: E402
from mace_model import make_batch, make_model  # noqa: E402
from sparse_accumulation.mace import Convolution, accelerate  # noqa: E402

NOT_COUNTED = {"detach", "view", "_unsafe_view", "t", "transpose", "expand", "split_with_sizes", "split", "slice",
               "select", "unsqueeze", "squeeze", "permute", "alias", "as_strided", "unbind", "_reshape_alias",
               "reshape", "sym_size", "sym_numel", "lift_fresh", "empty"}


def _name(func) -> str:
    return str(func).split(".")[-2] if str(func).startswith("aten.") else str(func)


class _Layers:
    """The model's layers (two levels deep) currently running, by forward hooks."""

    def __init__(self, model):
        self.stack = []
        for name, module in model.named_modules():
            if name and name.count(".") <= 1:
                module.register_forward_pre_hook(lambda m, a, name=name: self.stack.append(name))
                module.register_forward_hook(self._left)

    def _left(self, module, args, output) -> None:  # (a forward hook's result would replace the output)
        self.stack.pop()

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else "(model's forward, the forces' backward)"


class _Counting(TorchDispatchMode):
    def __init__(self, layers):
        super().__init__()
        self.layers, self.counts = layers, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _name(func) not in NOT_COUNTED:
            self.counts[self.layers.current] += 1
        return func(*args, **(kwargs or {}))


class _LiveTensors(TorchDispatchMode):
    """The peak of the bytes held by the storages the operations make, and what held them then."""

    def __init__(self, layers):
        super().__init__()
        self.layers, self.live, self.total, self.peak, self.at_peak = layers, {}, 0, 0, {}

    def _free(self, key):
        self.total -= self.live.pop(key)[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key in inputs or key in self.live or key == 0:
                continue
            size = t.untyped_storage().nbytes()
            self.live[key] = (size, f"{self.layers.current}: {_name(func)} {tuple(t.shape)}")
            weakref.finalize(t, self._free, key)
            self.total += size
            if self.total > self.peak:
                self.peak, self.at_peak = self.total, dict(self.live)
        return out


def count_layers(mace, batch) -> None:
    """Forward and backward operations of MACE's spherical harmonics, radial embedding and first interaction's
    reshape, and of their conversions, on the batch's edges."""
    from mace.modules.utils import get_edge_vectors_and_lengths

    ours = accelerate(copy.deepcopy(mace))
    vectors, lengths = get_edge_vectors_and_lengths(batch["positions"], batch["edge_index"], batch["shifts"])
    rest = (batch["node_attrs"], batch["edge_index"], mace.atomic_numbers)
    message = torch.randn(batch["positions"].shape[0], mace.interactions[0].irreps_out.dim)
    layers = [("spherical harmonics", lambda m: m.spherical_harmonics, vectors, ()),
              ("radial embedding", lambda m: m.radial_embedding, lengths, rest),
              ("message reshape", lambda m: m.interactions[0].reshape, message, ())]
    for what, layer_of, x, extra in layers:
        counts = []
        for model in (mace, ours):
            x = x.detach().requires_grad_(True)
            unnamed = _Layers(torch.nn.Module())  # (no layers to name: the layer alone runs)
            with _Counting(unnamed) as forward:
                out = layer_of(model)(x, *extra)
                out = out[0] if isinstance(out, tuple) else out
            with _Counting(unnamed) as backward:
                torch.autograd.grad(out.sum(), x)
            counts.append(f"{sum(forward.counts.values())} + {sum(backward.counts.values())}")
        print(f"{what}: MACE's {counts[0]}, converted {counts[1]} (forward + backward)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--atoms", type=int, default=64)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--variants", default="mace,ours-maces-edges,ours")
    parser.add_argument("--memory", action="store_true", help="also the live tensors at the call's peak")
    parser.add_argument("--layers", action="store_true", help="also each edge layer alone, forward and backward")
    parser.add_argument("--resident", action="store_true", help="also the resident memory a call adds, and its time")
    parser.add_argument("--chunk-bytes", type=int, default=None, help="Convolution.chunk_bytes")
    args = parser.parse_args()
    if args.chunk_bytes is not None:
        Convolution.chunk_bytes = args.chunk_bytes
    options = argparse.Namespace(r_max=6.0, max_ell=3, interaction="RealAgnosticResidualInteractionBlock",
                                 elements=89, channels=args.channels, correlation=3)
    mace = make_model(options).float()
    cpu = torch.device("cpu")
    batch = make_batch(nacl(args.atoms), mace, torch.float32, cpu)
    print(f"# {args.atoms} atoms, {batch['edge_index'].shape[1]} edges, {args.channels} channels, float32")
    if args.layers:
        count_layers(mace, batch)
    for variant in args.variants.split(","):
        model = copy.deepcopy(mace) if variant == "mace" else accelerate(copy.deepcopy(mace))
        if variant == "ours-maces-edges":
            with_maces_edge_layers(model, mace, cpu, torch.float32)
        layers = _Layers(model)
        for _ in range(2):
            model(dict(batch), compute_force=True)
        with _Counting(layers) as counting:
            model(dict(batch), compute_force=True)
        print(f"{variant}: {sum(counting.counts.values())} operations")
        for layer, count in counting.counts.most_common():
            print(f"  {count:5d}  {layer}")
        if args.memory:
            with _LiveTensors(layers) as tracking:
                model(dict(batch), compute_force=True)
            print(f"  live tensors at the peak: {tracking.peak / 1e6:.1f} MB")
            held = collections.Counter()
            for size, what in tracking.at_peak.values():
                held[what] += size
            for what, size in held.most_common(8):
                print(f"  {size / 1e6:8.1f} MB  {what}")
        if args.resident:
            def call():
                return model(dict(batch), compute_force=True)["forces"]

            grown = sorted(peak_mb(call, cpu) for _ in range(3))
            times = sorted(elapsed_ms(call, cpu) for _ in range(5))
            print(f"  resident memory a call adds: {', '.join(f'{mb:.0f}' for mb in grown)} MB; {times[2]:.0f} ms")


if __name__ == "__main__":
    main()
