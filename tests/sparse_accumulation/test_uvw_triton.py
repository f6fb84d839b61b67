"""Fused "uvw" kernels (``sparse_accumulation.kernels.triton.uvw``: the shared-weight "uvw" instructions of the e3nn
products in float32 on CUDA) against e3nn's own ``FullyConnectedTensorProduct`` in float64, to second order;
interpreted on the CPU without a GPU (``interpreted.py``), the module on a GPU under ``pytest -m cuda``."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
o3 = pytest.importorskip("e3nn.o3")

import sparse_accumulation.e3nn as ours  # noqa: E402
from sparse_accumulation.ops import factored  # noqa: E402
from sparse_accumulation.kernels.triton import launch, uvw, uvw_source  # noqa: E402

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE

# multiplicities that are not powers of two, inputs of different irreps (either input the one of fewer
# components: both roles of the kernels), output dimensions 1, 3, 5, more output channels than a tile holds
IRREPS = ("3x0e + 3x1o + 2x2e", "2x0e + 2x1o + 3x2e", "18x0e + 2x1o + 2x2e")
# an l = 3 output beside l = 2 inputs: instructions beyond what the kernels take
IRREPS_L3 = ("2x2e + 3x3o", "3x1o + 2x2e", "2x3o + 17x2e")


def _e3nn_product(irreps, dtype=torch.float64):
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return o3.FullyConnectedTensorProduct(*irreps)
    finally:
        torch.set_default_dtype(default)


def _fused_product(theirs):
    """``(specs, coefficients, dim_out)`` of every instruction of ``theirs``, float32 on the kernels' device."""
    every = frozenset(range(len(theirs.instructions)))
    specs, coefficients = factored.specs(theirs.instructions, every, theirs.irreps_in1, theirs.irreps_in2,
                                         theirs.irreps_out)
    return specs, torch.as_tensor(coefficients, dtype=torch.float32, device=DEVICE), theirs.irreps_out.dim


@pytest.fixture
def small_tiles(monkeypatch):
    """Row blocks of 16 rows, output tiles of 16 channels, one weight-gradient program per row block: a few
    dozen rows take several row blocks, output tiles and partial sums of the weights' gradient."""
    monkeypatch.setattr(uvw_source, "ROWS", {kind: 16 for kind in uvw_source.ROWS})
    monkeypatch.setattr(uvw_source, "BLOCK_W", 16)
    monkeypatch.setattr(uvw, "_WEIGHT_PROGRAMS_PER_SM", 10**6)


def _close(got, expected, tolerance=2e-5):
    """float32 against float64, relative to the largest magnitude."""
    assert got.shape == expected.shape
    error = ((got.detach().double().cpu() - expected.detach()).abs().max() / expected.abs().max()).item()
    assert error < tolerance, error


def _operands(theirs, generator, rows, y_rows=None):
    """``x [rows]``, ``y [y_rows or rows]`` and the weights, float64."""
    x = torch.randn(rows, theirs.irreps_in1.dim, generator=generator, dtype=torch.float64)
    y = torch.randn(y_rows or rows, theirs.irreps_in2.dim, generator=generator, dtype=torch.float64)
    w = torch.randn(theirs.weight_numel, generator=generator, dtype=torch.float64)
    return x, y, w


@pytest.mark.slow
def test_fused_product_equals_e3nn_to_second_order(generator, small_tiles):
    """Outputs, gradients of both inputs and the weights (the fused kernels) and a double backward (recomputed
    on torch operations) against e3nn in float64; the second input of one row shared by every row (``q`` of
    some instructions, ``p`` of others: stride 0 in both roles)."""
    theirs = _e3nn_product(IRREPS)
    specs, coefficients, dim_out = _fused_product(theirs)
    rows = 20  # two row blocks of 16
    tensors = _operands(theirs, generator, rows, y_rows=1)
    G = torch.randn(rows, dim_out, generator=generator, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in tensors]
    expected = theirs(leaves[0], leaves[1], leaves[2])
    mine = [t.float().to(DEVICE).requires_grad_() for t in tensors]
    launches = []
    with pytest.MonkeyPatch.context() as patch:
        original = launch.launch
        patch.setattr(launch, "launch", lambda *a, **k: launches.append(a[0]) or original(*a, **k))
        got = factored._Fused.apply(*mine, coefficients, specs, dim_out, rows, rows)
        have = torch.autograd.grad(got, mine, G.float().to(DEVICE), retain_graph=True)
    assert len(launches) == 4 * len(specs)  # forward, both inputs' gradients and the weights' per instruction
    _close(got, expected)
    want = torch.autograd.grad(expected, leaves, G, create_graph=True)
    for a, b in zip(have, want):
        _close(a, b)
    # second order: the gradient of a function of the first gradients
    have = torch.autograd.grad(got, mine, G.float().to(DEVICE), create_graph=True)
    second_want = torch.autograd.grad(sum((g * g).sum() for g in want), leaves)
    second_have = torch.autograd.grad(sum((g * g).sum() for g in have), mine)
    for a, b in zip(second_have, second_want):
        _close(a, b)


@pytest.mark.slow
def test_fused_backward_of_some_operands_equals_e3nn(generator, small_tiles):
    """The first input's gradient alone, then the second input's and the weights' (kernels launched only for
    what is asked)."""
    theirs = _e3nn_product(IRREPS)
    specs, coefficients, dim_out = _fused_product(theirs)
    rows = 17
    tensors = _operands(theirs, generator, rows)
    G = torch.randn(rows, dim_out, generator=generator, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in tensors]
    want = torch.autograd.grad(theirs(*leaves), leaves, G)
    for asked in ((0,), (1, 2)):
        mine = [t.float().to(DEVICE).requires_grad_(i in asked) for i, t in enumerate(tensors)]
        out = factored._Fused.apply(*mine, coefficients, specs, dim_out, rows, rows)
        have = torch.autograd.grad(out, [mine[i] for i in asked], G.float().to(DEVICE))
        for i, a in zip(asked, have):
            _close(a, want[i])


def test_while_the_kernels_compile_the_torch_operations_compute_the_call(generator, monkeypatch):
    """Where a kernel is not compiled yet, nothing is launched: the call and its gradients come from the torch
    operations in chunks, equal to e3nn's."""
    theirs = _e3nn_product(IRREPS)
    specs, coefficients, dim_out = _fused_product(theirs)
    launched = []
    monkeypatch.setattr(launch, "ready", lambda *args: False)
    monkeypatch.setattr(launch, "launch", lambda *args, **kwargs: launched.append(args))
    rows = 9
    tensors = _operands(theirs, generator, rows)
    leaves = [t.clone().requires_grad_() for t in tensors]
    mine = [t.float().to(DEVICE).requires_grad_() for t in tensors]
    expected = theirs(*leaves)
    got = factored._Fused.apply(*mine, coefficients, specs, dim_out, rows, 4)  # in chunks of 4 rows
    _close(got, expected)
    G = torch.randn(rows, dim_out, generator=generator, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, mine, G.float().to(DEVICE)), torch.autograd.grad(expected, leaves, G)):
        _close(a, b)
    assert not launched


_MIXED_IRREPS = ("3x0e + 5x1o + 2x2e", "4x0e + 2x1o + 2x2e", "18x0e + 3x1o + 2x2e")
_MIXED_INSTRUCTIONS = [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (2, 2, 2, "uuw", True), (1, 2, 1, "uvw", True)]


def _mixed_product():
    """e3nn's and this library's TensorProduct of "uvw" instructions and a "uuw" one, every one factored."""
    irreps, instructions = _MIXED_IRREPS, _MIXED_INSTRUCTIONS
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        theirs = o3.TensorProduct(*irreps, instructions)
    finally:
        torch.set_default_dtype(default)
    mine = ours.TensorProduct(*irreps, instructions, dtype=torch.float32).to(DEVICE)
    mine.load_state_dict({k: v.float() for k, v in theirs.state_dict().items()})
    assert len(mine._factored_specs) == len(instructions)
    return theirs, mine


@pytest.mark.parametrize("setting, grad, fits, fused", [
    ("auto", False, True, True), ("auto", True, True, False), ("auto", True, False, True),
    ("always", False, True, True), ("off", False, False, False)])
def test_module_takes_the_fused_kernels_as_the_setting_says(generator, monkeypatch, small_tiles, setting, grad, fits,
                                                            fused):
    """A float32 product on a device of ``FUSED_DEVICES``: with ``fused``, its factored "uvw" instructions run on
    the kernels (no torch operations for them) and its "uuw" one on torch operations; else all on torch
    operations. ``"auto"`` takes the kernels without gradients or where the intermediates exceed the budget
    (``fits`` False: a budget of one byte). Values and gradients equal e3nn's either way (on small tiles: several
    row blocks, output tiles and partial sums of the weights' gradient); float64 never takes them."""
    monkeypatch.setattr(factored, "FUSED_DEVICES", ("cuda", DEVICE))
    monkeypatch.setattr(factored, "FACTORED_MIN_PATHS", 1)
    monkeypatch.setattr(factored, "FACTORED_MIN_UUW_PATHS", 1)
    monkeypatch.setattr(factored, "FUSED", setting)
    theirs, mine = _mixed_product()
    if not fits:
        mine._factored_chunk_bytes = 1
    rows = 21
    x, y, _ = _operands(theirs, generator, rows)
    leaves = [x.clone().requires_grad_(), y.clone().requires_grad_()]
    expected = theirs(*leaves)
    computed = []
    original = factored._factored_rows
    monkeypatch.setattr(factored, "_factored_rows", lambda *a: computed.append([s[11] for s in a[4]]) or original(*a))
    inputs = [t.float().to(DEVICE).requires_grad_(grad) for t in (x, y)]
    with torch.set_grad_enabled(grad):
        got = mine(*inputs)
    _close(got, expected)
    if fused:
        assert computed and all(modes == [1] for modes in computed)  # the "uuw" instruction only
    else:
        assert computed and any(0 in modes for modes in computed)
    if grad:
        G = torch.randn(rows, theirs.irreps_out.dim, generator=generator, dtype=torch.float64)
        want = torch.autograd.grad(expected, leaves + [theirs.weight], G)
        have = torch.autograd.grad(got, inputs + [mine.weight], G.float().to(DEVICE))
        for a, b in zip(have, want):
            _close(a, b)
    computed.clear()
    mine64 = ours.TensorProduct(*_MIXED_IRREPS, _MIXED_INSTRUCTIONS, dtype=torch.float64).to(DEVICE)
    mine64.load_state_dict(theirs.state_dict())
    mine64(x.to(DEVICE), y.to(DEVICE))
    assert any(0 in modes for modes in computed)


def test_instructions_beyond_the_measured_shapes_run_on_torch_operations(generator, monkeypatch):
    """With the kernels ``"always"``, a product of l = 2 and l = 3 irreps runs the l <= 2 instructions on the
    kernels and the others on torch operations, equal to e3nn; ``q`` of more than 64 channels is not taken."""
    monkeypatch.setattr(factored, "FUSED_DEVICES", ("cuda", DEVICE))
    monkeypatch.setattr(factored, "FUSED", "always")
    monkeypatch.setattr(factored, "FACTORED_MIN_PATHS", 1)
    theirs = _e3nn_product(IRREPS_L3)
    mine = ours.FullyConnectedTensorProduct(*IRREPS_L3, dtype=torch.float32).to(DEVICE)
    mine.load_state_dict({k: v.float() for k, v in theirs.state_dict().items()})
    taken = [spec for spec in mine._factored_specs if uvw.supported(spec)]
    assert taken and len(taken) < len(mine._factored_specs)
    assert all(max(spec[2], spec[5], spec[8]) <= 5 for spec in taken)
    computed = []
    original = factored._factored_rows
    monkeypatch.setattr(factored, "_factored_rows", lambda *a: computed.extend(a[4]) or original(*a))
    x, y, _ = _operands(theirs, generator, 19)
    _close(mine(x.float().to(DEVICE), y.float().to(DEVICE)), theirs(x, y))
    assert sorted(map(tuple, computed)) == sorted(tuple(spec) for spec in mine._factored_specs
                                                  if spec not in taken)
    # [in1 start, mul1, d1, in2 start, mul2, d2, out start, mul_out, d_out, weight start, coefficient start, mode]
    assert uvw.supported([0, 65, 5, 0, 64, 3, 0, 8, 5, 0, 0, 0])  # q: the second input, 64 channels
    assert not uvw.supported([0, 64, 5, 0, 65, 3, 0, 8, 5, 0, 0, 0])
    assert not uvw.supported([0, 8, 1, 0, 8, 1, 0, 8, 1, 0, 0, 1])  # "uuw"


@pytest.mark.parametrize("value, setting", [("auto", "auto"), (" Always", "always"), ("off", "off"), ("0", "off"),
                                            ("1", "always")])
def test_fused_setting_reads_the_environment_value(value, setting):
    assert factored._fused_setting(value) == setting


def test_an_unknown_fused_setting_is_refused():
    with pytest.raises(ValueError, match="SPARSE_ACCUMULATION_FUSED_UVW"):
        factored._fused_setting("sometimes")


@pytest.mark.parametrize("setting, expected", [("highest", "tf32x3"), ("high", "tf32"), ("medium", "tf32")])
def test_float32_precision_follows_torch(setting, expected):
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        assert uvw.precision() == expected
    finally:
        torch.set_float32_matmul_precision(previous)


@interpreted.cuda
@pytest.mark.cuda
def test_module_on_cuda_runs_the_fused_kernels_and_equals_e3nn(generator, monkeypatch):
    """``FullyConnectedTensorProduct`` of 64 channels in float32 on a GPU with the fused kernels ``"always"``: its
    "uvw" instructions launch them (no torch path) and its forward and backward agree with e3nn's in float64 as
    closely as e3nn's own float32 does."""
    monkeypatch.setattr(factored, "FUSED", "always")
    irreps = "64x0e + 64x1o + 64x2e"
    theirs = _e3nn_product((irreps,) * 3).to("cuda")
    theirs32 = _e3nn_product((irreps,) * 3, torch.float32).to("cuda")
    theirs32.load_state_dict(theirs.state_dict())
    mine = ours.FullyConnectedTensorProduct(irreps, irreps, irreps, dtype=torch.float32).to("cuda")
    mine.load_state_dict(theirs.state_dict())
    rows = 3000
    x, y = (torch.randn(rows, theirs.irreps_in1.dim, dtype=torch.float64, device="cuda", requires_grad=True)
            for _ in range(2))
    G = torch.randn(rows, theirs.irreps_out.dim, dtype=torch.float64, device="cuda")
    want = [theirs(x, y).detach(), *torch.autograd.grad(theirs(x, y), [x, y, *theirs.parameters()], G)]
    calls = []
    original = factored._factored_rows
    factored._factored_rows = lambda *args: calls.append(1) or original(*args)
    try:
        with launch.waiting():
            x32, y32 = (t.detach().float().requires_grad_() for t in (x, y))
            got = mine(x32, y32)
            have = [got.detach(), *torch.autograd.grad(got, [x32, y32, *mine.parameters()], G.float())]
    finally:
        factored._factored_rows = original
    assert not calls
    x32, y32 = (t.detach().float().requires_grad_() for t in (x, y))
    out32 = theirs32(x32, y32)
    e3nn32 = [out32.detach(), *torch.autograd.grad(out32, [x32, y32, *theirs32.parameters()], G.float())]
    for a, b, c in zip(have, want, e3nn32):
        error = ((a.double() - b).abs().max() / b.abs().max()).item()
        theirs_error = ((c.double() - b).abs().max() / b.abs().max()).item()
        assert error < max(4 * theirs_error, 1e-6), (error, theirs_error)
