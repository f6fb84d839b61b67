"""DistributedDataParallel (gloo, 2 CPU processes on loopback) over a model built on the fused products gives
the gradients and parameters of one process on the full batch (float64, to 1e-10)."""
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from products_helpers import DDP_TIMEOUT_S, ddp_data, ddp_worker, free_port, loopback_environment, tiny_model, train

WORLD_SIZE = 2


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_ddp_matches_single_process(tmp_path, monkeypatch):
    # the single-process reference first: it compiles the kernels into the disk cache, so the workers load
    # them instead of compiling for minutes each, at different speeds, inside gloo's timeout
    model = tiny_model()
    x, y = ddp_data()
    grads = train(model, x, y)
    for key, value in loopback_environment().items():
        monkeypatch.setenv(key, value)
    result_path = str(tmp_path / "rank0.pt")
    context = mp.spawn(ddp_worker, args=(WORLD_SIZE, free_port(), result_path), nprocs=WORLD_SIZE, join=False)
    deadline = time.monotonic() + DDP_TIMEOUT_S
    try:
        while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                pytest.fail(f"DDP workers did not finish within {DDP_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)

    distributed = torch.load(result_path)
    assert len(grads) == len(distributed["grads"]) == 2
    for ours, theirs in zip(grads, distributed["grads"]):
        assert ours.abs().max() > 0
        torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-10)
    for ours, theirs in zip(model.parameters(), distributed["params"]):
        torch.testing.assert_close(theirs, ours.detach(), rtol=0, atol=1e-10)
    # the training really moved the weights
    assert not torch.allclose(distributed["params"][0], tiny_model().iteration.products[0].weight.detach())
