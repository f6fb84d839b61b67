"""The fused ``Linear`` kernel (``sparse_accumulation.ops.linear``, ``kernels/triton/linear.py``: shared-weight
float32 calls of at most ``FUSED_MAX_ROWS`` rows) against e3nn's ``o3.Linear`` in float64: outputs and every
gradient to second order; interpreted on the CPU without a GPU (``interpreted.py``), compiled under
``pytest -m cuda``."""
import copy

import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
o3 = pytest.importorskip("e3nn.o3")

from sparse_accumulation.e3nn import Linear  # noqa: E402
from sparse_accumulation.e3nn import linear as linear_module  # noqa: E402
from sparse_accumulation.kernels.triton import linear as linear_kernels  # noqa: E402
from sparse_accumulation.ops import linear as fused  # noqa: E402

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE

CASES = [
    # MACE's irreps in small; an output no input reaches (1e)
    ("6x0e + 5x1o + 3x2e", "4x0e + 3x1o + 2x2e + 2x1e", {}),
    # more channels than a tile of outputs (64) and of the contraction (32); biases
    ("70x0e + 40x1o", "66x0e + 35x1o", {"biases": True}),
    # repeated irreps summed into one output, and one input feeding two outputs; an input no output reads (3o)
    ("2x0e + 3x1o + 2x0e + 1x2e + 2x1o + 1x3o", "4x0e + 2x1o + 2x0e", {"biases": [False, False, True]}),
    # zero multiplicities on both sides; e3nn's path normalisation and instructions of one's own
    ("0x0e + 3x1o + 2x0e", "2x0e + 0x1o + 1x1o", {}),
    ("3x0e + 2x1o + 4x0e", "2x0e + 1x1o", {"path_normalization": "path", "instructions": [(0, 0), (1, 1), (2, 0)]}),
]


def _e3nns(irreps_in, irreps_out, kwargs, generator):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        module = o3.Linear(irreps_in, irreps_out, **kwargs)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
    return module


@pytest.fixture
def fused_calls(monkeypatch):
    """Every call takes the kernel (also on the interpreter's CPU tensors); the launches are counted."""
    calls = []
    original = linear_kernels.linear
    monkeypatch.setattr(linear_module, "FUSED_MAX_ROWS", 10 ** 6)
    monkeypatch.setattr(fused, "available", lambda x: x.dtype == torch.float32)
    monkeypatch.setattr(linear_kernels, "linear", lambda *args: calls.append(1) or original(*args))
    return calls


def _derivatives(module, x, params, G, H):
    """Output, first gradients (x and parameters) for the output gradient G, and the gradients of gx . H with
    respect to x, G (a force training step's loss reaches the layers upstream through it) and the parameters."""
    out = module(x)
    G = G.requires_grad_()
    first = torch.autograd.grad((out * G).sum(), (x, *params), create_graph=True)
    second = torch.autograd.grad((first[0] * H).sum(), (x, G, *params), allow_unused=True, materialize_grads=True)
    return [out, *first, *second]


@pytest.mark.parametrize("irreps_in, irreps_out, kwargs", CASES)
def test_fused_linear_equals_e3nns_to_second_order(generator, fused_calls, irreps_in, irreps_out, kwargs):
    _assert_equal_to_e3nns(generator, irreps_in, irreps_out, kwargs)
    assert len(fused_calls) == 3  # the map, the inputs' gradient, that gradient's own with respect to G


def test_while_the_kernel_compiles_torchs_operations_compute_the_same(generator, fused_calls, monkeypatch):
    """A launch that finds its kernel still compiling returns None; the same map runs on torch operations."""
    monkeypatch.setattr(linear_kernels, "linear", lambda *args: fused_calls.append(1))
    _assert_equal_to_e3nns(generator, *CASES[2])
    assert len(fused_calls) == 3


def _assert_equal_to_e3nns(generator, irreps_in, irreps_out, kwargs):
    theirs = _e3nns(irreps_in, irreps_out, kwargs, generator)
    ours = Linear.from_e3nn(_e3nns(irreps_in, irreps_out, kwargs, generator))
    ours.load_state_dict(theirs.state_dict())
    ours = ours.to(DEVICE, torch.float32)
    rows = 45  # two blocks of rows
    x = torch.randn(rows, theirs.irreps_in.dim, generator=generator, dtype=torch.float64)
    G = torch.randn(rows, theirs.irreps_out.dim, generator=generator, dtype=torch.float64)
    H = torch.randn(rows, theirs.irreps_in.dim, generator=generator, dtype=torch.float64)
    expected = _derivatives(theirs, x.clone().requires_grad_(), list(theirs.parameters()), G, H)
    got = _derivatives(ours, x.to(DEVICE, torch.float32).requires_grad_(), list(ours.parameters()),
                       G.to(DEVICE, torch.float32), H.to(DEVICE, torch.float32))
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == e.shape, i
        assert (g.double().cpu() - e).abs().max() <= 2e-6 * max(e.abs().max().item(), 1.0), i


def test_a_gradient_of_the_inputs_alone_computes_no_weight_gradient(generator, fused_calls, monkeypatch):
    """As MACE takes the forces: ``torch.autograd.grad`` of the inputs only runs the transposed kernel, not the
    weights' gradient (whose torch operations would run and be dropped); a backward into the parameters runs
    it."""
    theirs = _e3nns("5x0e + 4x1o", "3x0e + 6x1o", {"biases": True}, generator)
    ours = Linear.from_e3nn(copy.deepcopy(theirs)).to(DEVICE, torch.float32)
    computed = []
    original = fused.LinearTables.weight_gradient
    monkeypatch.setattr(fused.LinearTables, "weight_gradient", lambda *a: computed.append(1) or original(*a))
    x = torch.randn(20, theirs.irreps_in.dim, generator=generator).to(DEVICE).requires_grad_()
    (gx,) = torch.autograd.grad(ours(x).square().sum(), x)
    assert not computed and len(fused_calls) == 2
    expected = torch.autograd.grad(theirs(x.detach().double().cpu().requires_grad_()).square().sum(),
                                   list(theirs.parameters()))
    ours(x).square().sum().backward()
    assert computed
    for p, e in zip(ours.parameters(), expected, strict=True):
        assert (p.grad.double().cpu() - e).abs().max() <= 2e-6 * e.abs().max()


def test_calls_beyond_the_row_limit_or_in_float64_take_torchs_operations(generator, fused_calls, monkeypatch):
    theirs = _e3nns("5x0e + 4x1o", "3x0e + 6x1o", {}, generator)
    ours = Linear.from_e3nn(copy.deepcopy(theirs)).to(DEVICE, torch.float32)
    monkeypatch.setattr(linear_module, "FUSED_MAX_ROWS", 10)
    x = torch.randn(11, theirs.irreps_in.dim, generator=generator)
    ours(x.to(DEVICE))
    ours.double()(x.double().to(DEVICE)[:5])
    assert not fused_calls
    ours.float()(x.to(DEVICE)[:10])
    assert fused_calls


@pytest.mark.parametrize("blocks", [(16, 16, 16), (32, 32, 64)])
def test_the_kernel_compiles_for_a_cuda_target(monkeypatch, tmp_path, blocks):
    """The interpreter runs what the compiler may refuse: the generated source compiled for sm_90 (Triton's compiler
    and ptxas run without a GPU), with the products in full float32 precision (no tensor-core instructions)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from sparse_accumulation.kernels.triton import build

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    name = "sparse_accumulation_linear_compile_test"
    source = linear_kernels._SOURCE.format(name=name, segment_fields=linear_kernels.SEGMENT_FIELDS,
                                           path_fields=linear_kernels.PATH_FIELDS)
    function = triton.jit(build.load_function(source, name))
    signature = {**{p: "*fp32" for p in ("X", "W", "ALPHA", "BIAS", "OUT")}, "SEGMENTS": "*i32", "PATHS": "*i32",
                 "rows": "i32", "dim_in": "i32", "dim_out": "i32",
                 "BLOCK_R": "constexpr", "BLOCK_K": "constexpr", "BLOCK_N": "constexpr"}
    constants = dict(zip(("BLOCK_R", "BLOCK_K", "BLOCK_N"), blocks))
    try:
        compiled = triton.compile(ASTSource(function, signature, constants), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4, "num_stages": 1})
    except RuntimeError as error:  # pragma: no cover - Triton without its NVIDIA backend or ptxas
        if "ptxas" in str(error) or "backend" in str(error):
            pytest.skip(f"Triton cannot compile for a CUDA target here: {error}")
        raise
    assert "mma" not in compiled.asm["ptx"] and "fma.rn.f32" in compiled.asm["ptx"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_linear_runs_where_the_limit_allows_on_cuda(generator, monkeypatch):
    """On CUDA with the implementation's own choice (``available``): the kernel runs, equal to e3nn's."""
    monkeypatch.setattr(linear_module, "FUSED_MAX_ROWS", 4096)
    theirs = _e3nns("32x0e + 32x1o + 32x2e + 32x3o", "32x0e + 32x1o + 32x2e + 32x3o", {}, generator)
    ours = Linear.from_e3nn(copy.deepcopy(theirs)).to("cuda", torch.float32)
    x = torch.randn(300, theirs.irreps_in.dim, generator=generator, dtype=torch.float64)
    assert fused.available(x.to("cuda", torch.float32))
    got = ours(x.to("cuda", torch.float32)).double().cpu()
    expected = theirs(x)
    assert (got - expected).abs().max() <= 2e-6 * expected.abs().max()
