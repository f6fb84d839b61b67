"""Fused "uvw" kernels (``sparse_accumulation.kernels.triton.uvw``, used by the factored instructions of the e3nn
products on CUDA) against e3nn's own ``FullyConnectedTensorProduct`` in float64, to second order; interpreted on
the CPU without a GPU (``interpreted.py``), the public path through the module only on a GPU (``pytest -m cuda``)."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
o3 = pytest.importorskip("e3nn.o3")

import sparse_accumulation.e3nn as ours  # noqa: E402
from sparse_accumulation.e3nn import factored  # noqa: E402
from sparse_accumulation.kernels.triton import launch, uvw, uvw_source  # noqa: E402

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE

# multiplicities that are not powers of two, a second input of its own irreps, every output dimension 1, 3, 5
IRREPS = ("12x0e + 6x1o + 5x2e", "4x0e + 10x1o + 3x2e", "8x0e + 7x1o + 6x2e")


def _e3nn_product(irreps, dtype=torch.float64):
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return o3.FullyConnectedTensorProduct(*irreps)
    finally:
        torch.set_default_dtype(default)


def _fused_product(theirs, dtype=torch.float64):
    """``(specs, coefficients, dim_out)`` of every instruction of ``theirs`` as a fused one."""
    every = frozenset(range(len(theirs.instructions)))
    specs, coefficients = factored.specs(theirs.instructions, every, theirs.irreps_in1, theirs.irreps_in2,
                                         theirs.irreps_out)
    return specs, torch.as_tensor(coefficients, dtype=dtype, device=DEVICE), theirs.irreps_out.dim


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 16 rows and 32 columns, two row blocks per program of the weights' gradient: a few hundred rows
    and these multiplicities take several row blocks, channel tiles and weight-gradient programs."""
    monkeypatch.setattr(uvw_source, "TILE_ROWS", 16)
    monkeypatch.setattr(uvw_source, "TILE_COLUMNS", 32)
    monkeypatch.setattr(uvw, "_BLOCKS_PER_WEIGHT_PROGRAM", 2)


@pytest.mark.parametrize("broadcast", [None, 1])
def test_fused_product_equals_e3nn_to_second_order(generator, small_tiles, broadcast):
    """Outputs, gradients of both inputs and the weights, and a double backward, against e3nn (float64);
    ``broadcast``: which input has one row shared by every row."""
    theirs = _e3nn_product(IRREPS)
    specs, coefficients, dim_out = _fused_product(theirs)
    rows = 40
    x = torch.randn(rows, theirs.irreps_in1.dim, generator=generator, dtype=torch.float64)
    y = torch.randn(1 if broadcast == 1 else rows, theirs.irreps_in2.dim, generator=generator, dtype=torch.float64)
    w = torch.randn(theirs.weight_numel, generator=generator, dtype=torch.float64)
    G = torch.randn(rows, dim_out, generator=generator, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, y, w)]
    expected = theirs(leaves[0], leaves[1], leaves[2])
    mine = [t.to(DEVICE).requires_grad_() for t in (x, y, w)]
    got = factored._Fused.apply(*mine, coefficients, specs, dim_out, rows, rows)
    scale = expected.abs().max().item()
    assert torch.allclose(got.detach().cpu(), expected.detach(), rtol=1e-12, atol=1e-12 * scale)
    want = torch.autograd.grad(expected, leaves, G, create_graph=True)
    have = torch.autograd.grad(got, mine, G.to(DEVICE), create_graph=True)
    for a, b in zip(have, want):
        assert a.shape == b.shape
        assert torch.allclose(a.detach().cpu(), b.detach(), rtol=1e-11, atol=1e-11 * b.abs().max().item())
    # second order: the gradient of a function of the first gradients
    second_want = torch.autograd.grad(sum((g * g).sum() for g in want), leaves)
    second_have = torch.autograd.grad(sum((g * g).sum() for g in have), mine)
    for a, b in zip(second_have, second_want):
        assert torch.allclose(a.cpu(), b, rtol=1e-10, atol=1e-10 * b.abs().max().item())


def test_fused_backward_alone_equals_e3nn(generator, small_tiles):
    """The backward's fused kernels (no double backward asked), for the first input's gradient alone and for
    the others together."""
    theirs = _e3nn_product(IRREPS)
    specs, coefficients, dim_out = _fused_product(theirs)
    rows = 24
    tensors = [torch.randn(rows, theirs.irreps_in1.dim, generator=generator, dtype=torch.float64),
               torch.randn(rows, theirs.irreps_in2.dim, generator=generator, dtype=torch.float64),
               torch.randn(theirs.weight_numel, generator=generator, dtype=torch.float64)]
    G = torch.randn(rows, dim_out, generator=generator, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in tensors]
    want = torch.autograd.grad(theirs(*leaves), leaves, G)
    for asked in ((0,), (1, 2)):
        mine = [t.to(DEVICE).requires_grad_(i in asked) for i, t in enumerate(tensors)]
        out = factored._Fused.apply(*mine, coefficients, specs, dim_out, rows, rows)
        have = torch.autograd.grad(out, [mine[i] for i in asked], G.to(DEVICE))
        for i, a in zip(asked, have):
            assert torch.allclose(a.cpu(), want[i], rtol=1e-11, atol=1e-11 * want[i].abs().max().item())


def test_while_the_kernels_compile_the_portable_chunks_compute_the_call(generator, monkeypatch):
    """Where a kernel is not compiled yet, nothing is launched and the call and its gradients come from the
    torch operations, equal to e3nn's."""
    theirs = _e3nn_product(IRREPS)
    specs, coefficients, dim_out = _fused_product(theirs)
    launched = []
    monkeypatch.setattr(launch, "ready", lambda *args: False)
    monkeypatch.setattr(launch, "launch", lambda *args, **kwargs: launched.append(args))
    rows = 9
    tensors = [torch.randn(rows, theirs.irreps_in1.dim, generator=generator, dtype=torch.float64),
               torch.randn(rows, theirs.irreps_in2.dim, generator=generator, dtype=torch.float64),
               torch.randn(theirs.weight_numel, generator=generator, dtype=torch.float64)]
    leaves = [t.clone().requires_grad_() for t in tensors]
    mine = [t.to(DEVICE).requires_grad_() for t in tensors]
    expected = theirs(*leaves)
    got = factored._Fused.apply(*mine, coefficients, specs, dim_out, rows, 4)  # in chunks of 4 rows
    assert torch.allclose(got.detach().cpu(), expected.detach(), rtol=1e-12, atol=1e-12)
    G = torch.randn(rows, dim_out, generator=generator, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, mine, G.to(DEVICE)), torch.autograd.grad(expected, leaves, G)):
        assert torch.allclose(a.cpu(), b, rtol=1e-11, atol=1e-11 * b.abs().max().item())
    assert not launched


@pytest.mark.parametrize("setting, expected", [("highest", "ieee"), ("high", "tf32x3"), ("medium", "tf32")])
def test_float32_precision_follows_torch(setting, expected):
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        assert uvw.precision(torch.float32) == expected
        assert uvw.precision(torch.float64) == "ieee"
    finally:
        torch.set_float32_matmul_precision(previous)


@interpreted.cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_module_on_cuda_runs_the_fused_kernels_and_equals_e3nn(generator, dtype):
    """``FullyConnectedTensorProduct`` of 64 channels on a GPU with ``factored.FUSED`` on: its "uvw" instructions
    launch the fused kernels (the torch path is not called) and agree with e3nn's forward and backward."""
    irreps = "64x0e + 64x1o + 64x2e"
    theirs = _e3nn_product((irreps,) * 3, dtype).to("cuda")
    mine = ours.FullyConnectedTensorProduct(irreps, irreps, irreps, dtype=dtype).to("cuda")
    mine.load_state_dict(theirs.state_dict())
    rows = 3000
    x, y = (torch.randn(rows, theirs.irreps_in1.dim, dtype=dtype, device="cuda", requires_grad=True)
            for _ in range(2))
    G = torch.randn(rows, theirs.irreps_out.dim, dtype=dtype, device="cuda")
    calls = []
    original = factored._factored_rows
    factored._factored_rows = lambda *args: calls.append(1) or original(*args)
    factored.FUSED = True
    try:
        with launch.waiting():
            got = mine(x, y)
            have = torch.autograd.grad(got, [x, y, *mine.parameters()], G)
    finally:
        factored._factored_rows = original
        factored.FUSED = False
    assert not calls
    expected = theirs(x, y)
    want = torch.autograd.grad(expected, [x, y, *theirs.parameters()], G)
    tolerance = 1e-11 if dtype == torch.float64 else 1e-4
    assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())
    for a, b in zip(have, want):
        assert torch.allclose(a, b, rtol=tolerance, atol=tolerance * b.abs().max().item())
