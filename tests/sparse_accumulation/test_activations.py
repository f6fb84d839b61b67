"""``sparse_accumulation.ops.activations.silu`` against autograd of ``x * sigmoid(x)`` in float64 (values and
derivatives to the third order) and finite differences; the fused second derivative on CUDA."""
import pytest
import torch

from sparse_accumulation.ops import activations
from sparse_accumulation.ops.activations import silu

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _plain(x):
    return x * torch.sigmoid(x)


def _derivatives(f, x, g, gg, ggg):
    """The value of ``f``, its gradient for ``g``, that gradient's gradient for ``gg`` (with respect to ``x``
    and ``g``) and the third order for ``ggg``: each taken with the graph kept, as a training step on forces
    and a Hessian-vector product take them."""
    x, g = (t.clone().requires_grad_() for t in (x, g))
    y = f(x)
    (dx,) = torch.autograd.grad(y, x, g, create_graph=True)
    second = torch.autograd.grad(dx, (x, g), gg, create_graph=True)
    third = torch.autograd.grad(second[0], x, ggg)
    return (y, dx, *second, *third)


@pytest.mark.parametrize("device", [pytest.param(d, marks=[pytest.mark.cuda] if d == "cuda" else []) for d in DEVICES])
def test_silu_and_its_derivatives_equal_autograds_in_float64(generator, device):
    x, g, gg, ggg = (torch.randn(3, 1500, generator=generator, dtype=torch.float64).to(device) * 3
                     for _ in range(4))
    for ours, theirs in zip(_derivatives(silu, x, g, gg, ggg), _derivatives(_plain, x, g, gg, ggg)):
        assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def test_silu_against_finite_differences(generator):
    x = torch.randn(40, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(silu, (x,))
    assert torch.autograd.gradgradcheck(silu, (x,))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_second_derivative_runs_on_the_fused_kernel_on_cuda(generator, monkeypatch, dtype):
    """A training step's backward (no third order wanted) takes the Triton kernel, with autograd's result."""
    calls = []
    from sparse_accumulation.kernels.triton import activations as triton_activations

    original = triton_activations.silu_second_order
    monkeypatch.setattr(triton_activations, "silu_second_order", lambda *a: calls.append(1) or original(*a))
    x, g, gg = (torch.randn(1000, 64, generator=generator, dtype=torch.float64).to("cuda", dtype) for _ in range(3))
    found, expected = ([], [])
    for f, out in ((silu, found), (_plain, expected)):
        xx, gg_ = x.clone().requires_grad_(), g.clone().requires_grad_()
        (dx,) = torch.autograd.grad(f(xx), xx, gg_, create_graph=True)
        out.extend(torch.autograd.grad(dx, (xx, gg_), gg))
    assert calls == [1]
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(found, expected):
        assert torch.allclose(a, b, rtol=tolerance, atol=tolerance * float(b.abs().max()))


def test_silu_without_gradients_or_while_compiling_is_torchs(monkeypatch):
    x = torch.randn(10)
    assert torch.equal(silu(x), torch.nn.functional.silu(x))
    with torch.inference_mode():
        assert torch.equal(silu(x.requires_grad_()), torch.nn.functional.silu(x))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    y = silu(x.requires_grad_())
    assert y.grad_fn.name() == "SiluBackward0"


def test_silu_compiles_to_torchs(generator):
    x = torch.randn(8, 5, generator=generator, requires_grad=True)
    compiled = torch.compile(silu, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    (dx,) = torch.autograd.grad(y.sum(), x)
    assert torch.allclose(y, torch.nn.functional.silu(x))
    assert torch.allclose(dx, torch.autograd.grad(_plain(x).sum(), x)[0], atol=1e-6)
