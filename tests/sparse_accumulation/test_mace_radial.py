"""``sparse_accumulation.mace.RadialEmbedding`` against the MACE ``RadialEmbeddingBlock`` it is made from, in
float64: outputs and derivatives to second order (lengths on both sides of the cutoff, trained Bessel weights),
both cutoff modes, its state dict, TorchScript, float32, and what it refuses."""
import pytest
import torch

pytest.importorskip("mace.modules")
from mace.modules.blocks import RadialEmbeddingBlock  # noqa: E402

from sparse_accumulation.mace import RadialEmbedding  # noqa: E402


def _block(r_max, num_bessel, p, **options):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return RadialEmbeddingBlock(r_max=r_max, num_bessel=num_bessel, num_polynomial_cutoff=p, **options)
    finally:
        torch.set_default_dtype(previous)


def _derivatives(block, lengths, G, H):
    """Outputs, the lengths' gradient of a random output weighting and its own gradient (second order), and the
    gradient of the Bessel weights where they are trained."""
    rest = (torch.zeros(4, 2, dtype=torch.float64), torch.zeros(2, lengths.shape[0], dtype=torch.int64),
            torch.tensor([1, 8]))
    radial, cutoff = block(lengths, *rest)
    loss = (radial * G).sum() + (0.0 if cutoff is None else (cutoff * H[:, :1]).sum())
    weights = block.bessel_fn.bessel_weights
    inputs = (lengths, weights) if weights.requires_grad else (lengths,)
    first = torch.autograd.grad(loss, inputs, create_graph=True)
    second = torch.autograd.grad((first[0] * H[:, 1:2]).sum(), inputs, allow_unused=True, materialize_grads=True)
    return [radial, cutoff, *first, *second]


@pytest.mark.parametrize("r_max, num_bessel, p, options", [
    (6.0, 8, 5, {}), (4.5, 10, 6, {"apply_cutoff": False}), (5.0, 4, 2, {})])
@pytest.mark.parametrize("trained", [False, True])
def test_equals_maces_block_to_second_order(generator, r_max, num_bessel, p, options, trained):
    block = _block(r_max, num_bessel, p, **options)
    if trained:  # MACE's fine-tuning makes the Bessel weights a parameter
        block.bessel_fn.bessel_weights = torch.nn.Parameter(
            block.bessel_fn.bessel_weights + 0.1 * torch.rand(num_bessel, generator=generator, dtype=torch.float64))
    ours = RadialEmbedding(block)
    edges = 300  # lengths from 0.2 to beyond the cutoff: both sides of it
    lengths = (0.2 + 1.3 * r_max * torch.rand(edges, 1, generator=generator, dtype=torch.float64)).requires_grad_(True)
    assert (lengths > r_max).any() and (lengths < r_max).any()
    G = torch.randn(edges, num_bessel, generator=generator, dtype=torch.float64)
    H = torch.randn(edges, 2, generator=generator, dtype=torch.float64)
    for got, expected in zip(_derivatives(ours, lengths, G, H), _derivatives(block, lengths, G, H), strict=True):
        if expected is None:
            assert got is None
            continue
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12 * expected.abs().max().item())


def test_state_dict_torchscript_and_float32(generator):
    block = _block(6.0, 8, 5)
    ours = RadialEmbedding(block)
    assert list(ours.state_dict()) == list(block.state_dict())
    assert ours.bessel_fn is block.bessel_fn and ours.cutoff_fn is block.cutoff_fn and ours.out_dim == 8
    lengths = 0.5 + 6 * torch.rand(50, 1, generator=generator, dtype=torch.float64)
    rest = (torch.zeros(4, 2), torch.zeros(2, 50, dtype=torch.int64), torch.tensor([1, 8]))
    expected = block(lengths, *rest)[0]
    assert torch.equal(torch.jit.script(ours)(lengths, *rest)[0], ours(lengths, *rest)[0])
    single = RadialEmbedding(_block(6.0, 8, 5)).float()
    assert single.coefficients.dtype == torch.float32
    assert torch.allclose(single(lengths.float(), *rest)[0].double(), expected, rtol=0, atol=1e-5)


def test_other_radial_parts_are_refused():
    assert RadialEmbedding.refusal(_block(6.0, 8, 5)) is None
    for options, named in [({"radial_type": "gaussian"}, "GaussianBasis"), ({"radial_type": "chebyshev"}, "Chebychev"),
                           ({"distance_transform": "Agnesi"}, "AgnesiTransform")]:
        block = _block(6.0, 8, 5, **options)
        assert named in RadialEmbedding.refusal(block)
        with pytest.raises(TypeError, match=named):
            RadialEmbedding(block)
    assert "RadialEmbeddingBlock expected" in RadialEmbedding.refusal(torch.nn.Identity())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_maces_block_to_second_order(generator):
    """Made from a block already on CUDA (its own tensors there too), float64, both sides of the cutoff."""
    block = _block(6.0, 8, 5).to("cuda")
    ours = RadialEmbedding(block)
    assert all(t.device.type == "cuda" for t in ours.buffers())
    lengths = (0.2 + 8 * torch.rand(4000, 1, generator=generator, dtype=torch.float64)).cuda().requires_grad_(True)
    G = torch.randn(4000, 8, generator=generator, dtype=torch.float64).cuda()
    H = torch.randn(4000, 2, generator=generator, dtype=torch.float64).cuda()
    for got, expected in zip(_derivatives(ours, lengths, G, H), _derivatives(block, lengths, G, H), strict=True):
        if expected is not None:
            assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12 * expected.abs().max().item())
