"""A child process of ``test_mace_captured.py``: a training step of a converted MACE model captured by hand into one
CUDA graph (warmed up on a side stream, as torch asks), after what a user's process may run before it: an eager
forces call on the default stream while the kernels still compile, and a :class:`CapturedModel`'s forces capture.
The replayed parameter gradients must equal an eager step's (float32). Exit status 0 when they do."""
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mace_models import batch, mace_model, structures  # noqa: E402

from sparse_accumulation.mace import CapturedModel, accelerate  # noqa: E402


def main(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    model = mace_model(generator).to("cuda", torch.float32)
    ours = accelerate(copy.deepcopy(model))
    data = {k: (v.to("cuda", torch.float32) if v.is_floating_point() else v.to("cuda"))
            if isinstance(v, torch.Tensor) else v for k, v in batch(structures(generator), model).items()}
    ours(dict(data), compute_force=True)
    CapturedModel(ours)(dict(data), compute_force=True)
    params = [p for p in ours.parameters() if p.requires_grad]

    def step():
        out = ours(data, training=True, compute_force=True)
        (out["energy"].square().sum() + out["forces"].square().sum()).backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for p in params:
        p.grad = None
    step()
    expected = [None if p.grad is None else p.grad.clone() for p in params]
    assert any(want is not None for want in expected)
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    for p, want in zip(params, expected):
        if want is None:
            assert p.grad is None or not p.grad.any(), tuple(p.shape)
            continue
        error = (p.grad - want).abs().max().item()
        assert error <= 1e-4 * max(want.abs().max().item(), 1e-30), (tuple(p.shape), error)
    print("replayed gradients equal the eager step's", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
