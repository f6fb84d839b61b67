"""``torch.compile`` of a MACE model converted by ``accelerate``, checked against MACE's eager model (float64):
run as ``python mace_compiled.py [device [mode]]`` (default ``cpu`` and torch.compile's ``default`` mode; a process of its own: dynamo's and inductor's state left by other compiled
tests makes inductor's backward fail there, so the check starts from a fresh one).

An MD step's call (energies, forces and stress; the strain as an input leaf) twice, the compiled call reused, and
a force- and stress-training step (``torch.autograd.grad`` traced into the graph, as ``mace.tools.compile`` sets it)
traced afresh (``aot_eager``), whose parameter gradients must equal MACE's eager ones. Raises on a mismatch; exits with status
3 where mace-torch's package cannot be imported.
"""
import copy
import os
import sys

import torch


def compilable_batch(data: dict, num_graphs: int) -> dict:
    """``data`` as a compiled step takes it: positions that require grad, and the strain (``displacement``) as an
    input leaf, so that the gradient reaching it crosses the graph break at ``torch.autograd.grad``."""
    out = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in data.items()}
    out["positions"].requires_grad_(True)
    out["displacement"] = torch.zeros(num_graphs, 3, 3, dtype=torch.float64, device=out["positions"].device,
                                      requires_grad=True)
    return out


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import test_mace_accelerate as helpers
    except BaseException as error:  # pytest's module-level skip is not an Exception
        print(f"mace-torch's package cannot be imported: {error}", file=sys.stderr)
        sys.exit(3)
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    model = helpers.mace_model(generator, max_ell=1, correlation=2)  # a small graph: compiling takes most of it
    data = helpers.batch(helpers.structures(generator), model)
    model = model.to(device)
    data = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in data.items()}
    graphs = int(data["ptr"].numel() - 1)
    expected = model(compilable_batch(data, graphs), compute_stress=True)
    mode = sys.argv[2] if len(sys.argv) > 2 else "default"
    converted = helpers.accelerate(copy.deepcopy(model))
    compiled = torch.compile(converted, mode=mode)
    for _ in range(3):  # under "reduce-overhead" a warm-up call, a recorded one, a replay
        got = compiled(compilable_batch(data, graphs), compute_stress=True)
        for key in ("energy", "forces", "stress"):
            helpers.assert_close(got[key], expected[key], key)

    def loss(module):
        out = module(compilable_batch(data, graphs), training=True, compute_stress=True)
        return out["energy"].square().sum() + out["forces"].square().sum() + 100 * out["stress"].square().sum()

    ours = helpers.accelerate(copy.deepcopy(model))
    loss(model).backward()
    torch._dynamo.reset()  # graphs compiled for forces give wrong training gradients: compile afresh
    # traced by dynamo and AOTAutograd as inductor would take it, run without inductor's code generation (the MD
    # step above compiles through inductor; generating C++ for the training graph doubled this check's time)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        loss(torch.compile(ours, backend="aot_eager")).backward()
    checked = 0
    for name, theirs in model.named_parameters():
        if theirs.grad is not None:
            helpers.assert_close(ours.get_parameter(name).grad, theirs.grad, name)
            checked += 1
    assert checked > 0, "no parameter gradient to compare"
    print(f"compiled: energies, forces, stress and {checked} parameter gradients equal MACE's")


if __name__ == "__main__":
    main()
