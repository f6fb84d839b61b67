"""``sparse_accumulation.e3nn.SphericalHarmonics`` against e3nn's ``o3.SphericalHarmonics`` in float64: values,
first and second derivatives on fresh random vectors, zero vectors, every normalization, subsets of degrees and
pseudovector inputs; TorchScript; dtype moves; what is refused."""
import pytest
import torch

o3 = pytest.importorskip("e3nn.o3")

from sparse_accumulation.e3nn import InvalidArgumentError, SphericalHarmonics  # noqa: E402
from sparse_accumulation.e3nn.spherical_harmonics import MAX_L  # noqa: E402

CASES = [
    # MACE's edge harmonics; a range of degrees given as lmax; a subset with a gap; one degree; pseudovectors;
    # the largest degree supported
    ("1x0e + 1x1o + 1x2e + 1x3o", True, "component", None),
    (3, False, "integral", None),
    ([1, 3, 2, 1], True, "norm", None),
    ([2], False, "component", None),
    ("1x1e + 1x2e", True, "integral", "1x1e"),
    (MAX_L, True, "component", None),
]


def _e3nn(*args):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return o3.SphericalHarmonics(*args)
    finally:
        torch.set_default_dtype(previous)


def _derivatives(module, x, G, H):
    out = module(x)
    (first,) = torch.autograd.grad((out * G).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad((first * H).sum(), x)
    return out, first, second


@pytest.mark.parametrize("irreps_out, normalize, normalization, irreps_in", CASES)
def test_equals_e3nns_to_second_order(generator, irreps_out, normalize, normalization, irreps_in):
    theirs = _e3nn(irreps_out, normalize, normalization, irreps_in)
    ours = SphericalHarmonics.from_e3nn(theirs).double()
    assert ours.irreps_out == theirs.irreps_out and ours._lmax == theirs._lmax
    x = (3 * torch.randn(4, 9, 3, generator=generator, dtype=torch.float64)).requires_grad_(True)
    G = torch.randn(4, 9, theirs.irreps_out.dim, generator=generator, dtype=torch.float64)
    H = torch.randn(4, 9, 3, generator=generator, dtype=torch.float64)
    for got, expected in zip(_derivatives(ours, x, G, H), _derivatives(theirs, x, G, H), strict=True):
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, rtol=1e-11, atol=1e-11 * expected.abs().max().item())


def test_zero_vectors_and_empty_inputs_give_e3nns_values():
    theirs = _e3nn("1x0e + 1x1o + 1x2e", True, "component")
    ours = SphericalHarmonics.from_e3nn(theirs).double()
    zeros = torch.zeros(3, 3, dtype=torch.float64)
    assert torch.equal(ours(zeros), theirs(zeros))
    assert ours(torch.zeros(0, 2, 3, dtype=torch.float64)).shape == (0, 2, 9)
    constant = _e3nn("1x0e", True, "integral")  # degree 0 alone: no tensor powers at all
    vectors = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.equal(SphericalHarmonics.from_e3nn(constant).double()(vectors), constant(vectors))


def test_float32_within_float32_rounding_and_torchscript(generator):
    theirs = _e3nn("1x0e + 1x1o + 1x2e + 1x3o", True, "component")
    ours = SphericalHarmonics.from_e3nn(theirs).double().float()  # coefficients remade from float64, not rounded twice
    assert ours.matrix.dtype == torch.float32
    x = torch.randn(50, 3, generator=generator, dtype=torch.float64)
    expected = theirs(x)
    assert torch.allclose(ours(x.float()).double(), expected, rtol=0, atol=2e-6)
    scripted = torch.jit.script(ours)
    assert torch.equal(scripted(x.float()), ours(x.float()))
    assert ours.state_dict() == {}  # e3nn's module saves nothing either


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidArgumentError, match="normalization"):
        SphericalHarmonics(2, True, "unit")
    with pytest.raises(InvalidArgumentError, match="parity"):
        SphericalHarmonics("1x2o", True)
    with pytest.raises(InvalidArgumentError, match="vector"):
        SphericalHarmonics(2, True, irreps_in="2x1o")
    with pytest.raises(NotImplementedError, match="lmax"):
        SphericalHarmonics(MAX_L + 1, True)
    with pytest.raises(TypeError, match="o3.SphericalHarmonics"):
        SphericalHarmonics.from_e3nn(torch.nn.Identity())
    with pytest.raises(InvalidArgumentError, match="last dimension"):
        SphericalHarmonics(2, True)(torch.zeros(4, 2))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-11), (torch.float32, 1e-5)])
def test_cuda_equals_e3nns_to_second_order(generator, dtype, rtol):
    """On CUDA, e3nn's module and ours in ``dtype``, edges enough for several thread blocks."""
    theirs = _e3nn("1x0e + 1x1o + 1x2e + 1x3o", True, "component").to("cuda", dtype)
    ours = SphericalHarmonics.from_e3nn(theirs).to("cuda", dtype)
    x = (3 * torch.randn(5000, 3, generator=generator, dtype=torch.float64)).to("cuda", dtype).requires_grad_(True)
    G = torch.randn(5000, 16, generator=generator, dtype=torch.float64).to("cuda", dtype)
    H = torch.randn(5000, 3, generator=generator, dtype=torch.float64).to("cuda", dtype)
    for got, expected in zip(_derivatives(ours, x, G, H), _derivatives(theirs, x, G, H), strict=True):
        assert got.device.type == "cuda"
        assert torch.allclose(got, expected, rtol=rtol, atol=rtol * expected.abs().max().item())
