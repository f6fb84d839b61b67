"""examples/interaction_model.py under ``torchrun``: DistributedDataParallel over gloo, each process on its share
of every batch, trains the parameters that one process trains on the whole batches."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "interaction_model.py"
ARGS = ("--tiny", "--dtype", "float64", "--steps", "3")
TIMEOUT_S = 300


def _run(*command):
    """Run ``command`` from the repository's root on this checkout's package, gloo on the loopback interface;
    its standard output."""
    environment = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=TIMEOUT_S,
                            cwd=ROOT, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _load_example():
    spec = importlib.util.spec_from_file_location("interaction_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_two_processes_train_the_parameters_of_one(tmp_path):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    # one process first: it compiles numba's float64 kernels into the disk cache, from which the two load them
    out_one = _run(str(EXAMPLE), *ARGS, "--save", str(one))
    # --standalone: a rendezvous on a free port of localhost, no network needed
    out_two = _run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(EXAMPLE), *ARGS,
                   "--save", str(two))
    assert "2 processes (gloo)" in out_two and out_two.count("mean loss over an epoch") == 1  # rank 0 prints
    # the printed losses are the whole batch's, the mean of the two shares' losses
    steps = [[line for line in out.splitlines() if line.startswith("step")] for out in (out_one, out_two)]
    assert len(steps[0]) == 3 and [line.split("(")[0] for line in steps[0]] == [
        line.split("(")[0] for line in steps[1]]

    expected, got = torch.load(one), torch.load(two)
    assert expected.keys() == got.keys()
    # The runs differ only in the order of sums: one process sums each gradient over the batch's 4 molecules,
    # two processes over 2 each, and gloo's allreduce adds the halves. That is rounding at 1e-16 relative
    # (1.5e-16 of each tensor's largest entry measured after the 3 Adam steps); a share, weight or reduction
    # gone wrong shows at 1e-3 or more.
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-10, atol=1e-12, msg=name)

    # and the 3 steps trained: the parameters left their seeded initial values
    example = _load_example()
    torch.manual_seed(0)  # the example's default --seed
    initial = example.build_model(example.SIZES["tiny"], "ours", "cpu", torch.float64).state_dict()
    changed = [name for name in expected if not torch.equal(initial[name], expected[name])]
    assert len(changed) > len(expected) // 2, changed


@pytest.mark.parametrize("processes, args, message", [
    ("2", ["--batch", "3"], "--batch 3 does not split into equal shares for 2 processes: give a multiple of 2"),
    ("1", ["--batch", "17"], "--batch 17 is more than the 16 molecules of the data"),
    ("2", ["--device", "cuda:1"], "--device cuda:1 names one GPU; under torchrun each process takes the GPU of "
                                  "its local rank: give --device cuda"),
])
def test_torchrun_arguments_are_checked_before_the_process_group(monkeypatch, capsys, processes, args, message):
    """Under torchrun's environment (no process group started) the batch must split equally, and the GPU is the
    local rank's."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", processes), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        _load_example().main(["--tiny", *args])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {message}")
    assert not (dist.is_available() and dist.is_initialized())
