"""``sparse_accumulation.mace.ReshapeIrreps`` against MACE's ``reshape_irreps`` it replaces, in float64: values and
gradients to second order, TorchScript, and what it refuses."""
import pytest
import torch

pytest.importorskip("mace.modules")
from mace.modules.irreps_tools import reshape_irreps  # noqa: E402

from sparse_accumulation.mace.reshape import ReshapeIrreps  # noqa: E402


@pytest.mark.parametrize("irreps", ["4x0e + 4x1o + 4x2e + 4x3o", "3x1o + 3x0e + 3x1e", "5x0e"])
def test_equals_maces_to_second_order(generator, irreps):
    theirs = reshape_irreps(irreps)
    ours = ReshapeIrreps.from_mace(theirs)
    x = torch.randn(9, theirs.irreps.dim, generator=generator, dtype=torch.float64, requires_grad=True)
    G = torch.randn(9, *theirs(x).shape[1:], generator=generator, dtype=torch.float64)
    H = torch.randn_like(x)
    results = []
    for module in (ours, theirs):
        out = module(x)
        (first,) = torch.autograd.grad((out * G * out).sum(), x, create_graph=True)  # second order through x
        (second,) = torch.autograd.grad((first * H).sum(), x)
        results.append((out, first, second))
    for got, expected in zip(*results, strict=True):
        assert torch.equal(got, expected)
    assert torch.equal(torch.jit.script(ours)(x), results[1][0])
    assert ours.state_dict() == {}


def test_bad_inputs_and_other_layouts_are_refused():
    ours = ReshapeIrreps("2x0e + 2x1o")
    with pytest.raises(ValueError, match=r"\[N, 8\]"):
        ours(torch.zeros(3, 9))
    with pytest.raises(ValueError, match="one multiplicity"):
        ReshapeIrreps("2x0e + 3x1o")
    with pytest.raises(TypeError, match="reshape_irreps"):
        ReshapeIrreps.from_mace(torch.nn.Identity())
