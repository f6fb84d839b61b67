"""Triton kernels (``sparse_accumulation.kernels.triton_gpu``) against a brute-force float64 loop.

Without a GPU (CI) the kernels run on CPU tensors under the Triton interpreter; on a CUDA machine the same
tests run compiled on CUDA tensors (plus the larger ``test_gpu_*`` ones), unless ``TRITON_INTERPRET=1`` was set
from outside.

When triton reads ``TRITON_INTERPRET``: ``triton.jit`` reads it when a function is decorated. The kernel module
creates (decorates) its generated kernels lazily and keys its cache on the flag, and its generated code calls
only triton builtins and helpers it defines itself (not triton's own ``@jit`` library functions such as
``tl.sum``/``tl.zeros``, which are decorated once, when triton is imported). So setting the variable here works
whether or not triton was imported before; it is set before any import anyway, and restored when this module's
tests are done. One process cannot mix modes for triton's library: interpreted kernels then compiled ones.
"""
import os

import torch

_PREVIOUS_INTERPRET = os.environ.get("TRITON_INTERPRET")
INTERPRET = _PREVIOUS_INTERPRET == "1" or not torch.cuda.is_available()
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
DEVICE = "cpu" if INTERPRET else "cuda"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

triton = pytest.importorskip("triton")

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.kernels import triton_gpu  # noqa: E402
from sparse_accumulation.rules import prepare_rule  # noqa: E402

# Only this module's tests run interpreted (the fixture below sets the variable again for them): other test
# modules collected after this one must see the environment as it was.
if _PREVIOUS_INTERPRET is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _PREVIOUS_INTERPRET

STRATEGIES = triton_gpu.STRATEGIES + ("pieces+tile", "tile+pieces")
LOAD_STRATEGIES = ("tile", "pieces", "columns")  # the dC kernel only loads
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True, scope="module")
def _interpreter():
    if INTERPRET:
        os.environ["TRITON_INTERPRET"] = "1"
    yield
    if _PREVIOUS_INTERPRET is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _PREVIOUS_INTERPRET


def make_rule(name):
    """(prepared rule, m1, m2, mu as numpy, M1, M2, output_size)."""
    rng = np.random.default_rng({"random": 1, "cg_like": 2, "single": 3, "wide": 4, "odd": 5}[name])
    if name == "random":
        # unsorted, duplicated entries; output column 5 (the last) is never hit
        M1, M2, O, nnz = 5, 3, 6, 24
        m1 = rng.integers(0, M1, nnz)
        m2 = rng.integers(0, M2, nnz)
        mu = rng.integers(0, O - 1, nnz)
        m1[-3:], m2[-3:], mu[-3:] = m1[0], m2[0], mu[0]
    elif name == "cg_like":
        # sizes and sparsity of a real CG rule l1=2, l2=1 -> L=2 (|m1 + m2| pattern), shuffled
        l1, l2, L = 2, 1, 2
        entries = [(a + l1, b + l2, abs(a + b) + L) for a in range(-l1, l1 + 1) for b in range(-l2, l2 + 1)
                   if abs(a + b) <= L]
        entries += [(a + l1, b + l2, -abs(a + b) + L) for a in range(-l1, l1 + 1) for b in range(-l2, l2 + 1)
                    if 0 < abs(a + b) <= L]
        rng.shuffle(entries)
        m1, m2, mu = (np.array(x) for x in zip(*entries))
        M1, M2, O = 2 * l1 + 1, 2 * l2 + 1, 2 * L + 1
    elif name == "single":
        # one-component inputs, a power-of-two output with one column unused
        M1, M2, O = 1, 1, 2
        m1, m2, mu = np.array([0, 0]), np.array([0, 0]), np.array([0, 0])
    elif name == "wide":
        # power-of-two sizes (no column padding), output larger than the inputs
        M1, M2, O, nnz = 4, 2, 8, 30
        m1, m2, mu = rng.integers(0, M1, nnz), rng.integers(0, M2, nnz), rng.integers(0, O, nnz)
    elif name == "odd":
        # sizes of three power-of-two segments (7 = 4 + 2 + 1); X1's columns 4..6 and output column 6 unused
        M1, M2, O, nnz = 7, 7, 7, 40
        m1, m2, mu = rng.integers(0, 4, nnz), rng.integers(0, M2, nnz), rng.integers(0, O - 1, nnz)
    else:
        raise ValueError(name)
    rule = prepare_rule(torch.as_tensor(m1), torch.as_tensor(m2), torch.as_tensor(mu), M1, M2, O)
    return rule, m1, m2, mu, M1, M2, O


def reference(X1, X2, C, m1, m2, mu, O):
    X1, X2, C = (t.detach().cpu().double().numpy() for t in (X1, X2, C))
    m1, m2, mu = (np.asarray(a) for a in (m1, m2, mu))
    out = np.zeros((X1.shape[0], O))
    for k in range(len(C)):
        out[:, mu[k]] += X1[:, m1[k]] * X2[:, m2[k]] * C[k]
    return out


def reference_dC(G, X1, X2, m1, m2, mu):
    G, X1, X2 = (t.detach().cpu().double().numpy() for t in (G, X1, X2))
    return np.array([np.sum(G[:, mu[k]] * X1[:, m1[k]] * X2[:, m2[k]]) for k in range(len(m1))])


def inputs(R, M1, M2, nnz, dtype, transposed=False, device=DEVICE, seed=None):
    """Fresh random inputs (a fixed ``seed`` only where a test compares two draws)."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    if transposed:  # [R, M] views of contiguous [M, R] tensors
        X1 = torch.randn(M1, R, generator=g).to(dtype).to(device).T
        X2 = torch.randn(M2, R, generator=g).to(dtype).to(device).T
    else:
        X1 = torch.randn(R, M1, generator=g).to(dtype).to(device)
        X2 = torch.randn(R, M2, generator=g).to(dtype).to(device)
    C = torch.randn(nnz, generator=g).to(dtype).to(device)
    return X1, X2, C


def assert_close(actual, expected, dtype):
    actual = actual.detach().cpu().double().numpy()
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCES[dtype], atol=TOLERANCES[dtype] * scale)


def poison_allocator(nbytes):
    """Best effort: leave NaNs in memory the next allocation may reuse."""
    torch.full((nbytes // 4 + 16,), float("nan"), dtype=torch.float32)


def test_is_available():
    assert triton_gpu.is_available()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["random", "cg_like", "single", "wide", "odd"])
@pytest.mark.parametrize("R", [0, 1, 7, 33])
def test_forward_float64(strategy, name, R):
    rule, m1, m2, mu, M1, M2, O = make_rule(name)
    X1, X2, C = inputs(R, M1, M2, rule.nnz, torch.float64)
    poison_allocator(R * O * 8)
    out = triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy)
    assert out.shape == (R, O) and out.dtype == torch.float64 and out.is_contiguous()
    expected = reference(X1, X2, C, m1, m2, mu, O)
    assert_close(out, expected, torch.float64)
    unused = sorted(set(range(O)) - set(mu.tolist()))
    if unused and R:
        assert torch.equal(out[:, unused].cpu(), torch.zeros(R, len(unused), dtype=torch.float64))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["random", "cg_like"])
def test_forward_dtypes(strategy, dtype, name):
    rule, m1, m2, mu, M1, M2, O = make_rule(name)
    X1, X2, C = inputs(33, M1, M2, rule.nnz, dtype)
    out = triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy)
    assert out.dtype == dtype and out.shape == (33, O)
    # the reference sees the rounded 16-bit inputs
    assert_close(out, reference(X1, X2, C, m1, m2, mu, O), dtype)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_transposed(strategy, dtype):
    rule, m1, m2, mu, M1, M2, O = make_rule("random")
    X1, X2, C = inputs(33, M1, M2, rule.nnz, dtype, transposed=True)
    assert not X1.is_contiguous() and X1.stride(0) == 1
    out = triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy)
    assert_close(out, reference(X1, X2, C, m1, m2, mu, O), dtype)
    # mixed: X1 transposed, X2 a column slice of a wider tensor
    wide = torch.randn(33, M2 + 4, dtype=dtype, device=DEVICE)[:, 2:2 + M2]
    out = triton_gpu.accumulate(X1, wide, C, rule, O, strategy=strategy)
    assert_close(out, reference(X1, wide, C, m1, m2, mu, O), dtype)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_forward_int64_offsets(strategy, monkeypatch):
    """The int64 offset path, forced on small tensors."""
    monkeypatch.setattr(triton_gpu, "_INT32_LIMIT", 1)
    rule, m1, m2, mu, M1, M2, O = make_rule("random")
    X1, X2, C = inputs(33, M1, M2, rule.nnz, torch.float64, transposed=True)
    assert triton_gpu._needs_int64(X1)
    out = triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy)
    assert_close(out, reference(X1, X2, C, m1, m2, mu, O), torch.float64)
    G = torch.randn(33, O, dtype=torch.float64, device=DEVICE)
    dC = triton_gpu.accumulate_dC(G, X1, X2, rule, strategy=strategy)
    assert_close(dC, reference_dC(G, X1, X2, m1, m2, mu), torch.float64)


@pytest.mark.parametrize("strategy", LOAD_STRATEGIES)
@pytest.mark.parametrize("name", ["random", "cg_like", "single", "wide", "odd"])
@pytest.mark.parametrize("R", [0, 1, 33, 70])
def test_dC_float64(strategy, name, R):
    rule, m1, m2, mu, M1, M2, O = make_rule(name)
    X1, X2, _ = inputs(R, M1, M2, rule.nnz, torch.float64)
    G = torch.randn(R, O, dtype=torch.float64, device=DEVICE)
    dC = triton_gpu.accumulate_dC(G, X1, X2, rule, strategy=strategy)
    assert dC.shape == (rule.nnz,) and dC.dtype == torch.float64
    assert_close(dC, reference_dC(G, X1, X2, m1, m2, mu), torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dC_dtypes_transposed(dtype):
    rule, m1, m2, mu, M1, M2, O = make_rule("cg_like")
    X1, X2, _ = inputs(70, M1, M2, rule.nnz, dtype, transposed=True)
    G = torch.randn(O, 70).to(dtype).to(DEVICE).T
    dC = triton_gpu.accumulate_dC(G, X1, X2, rule)
    assert dC.dtype == dtype
    expected = reference_dC(G, X1, X2, m1, m2, mu)
    # a sum over 70 rows: compare to the scale of the summed magnitudes
    scale = reference_dC(G.abs(), X1.abs(), X2.abs(), m1, m2, mu).max()
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype]
    np.testing.assert_allclose(dC.double().cpu().numpy(), expected, rtol=0, atol=tol * scale)


def test_swapped_rules_give_gradients():
    """Kernels on ``rule.swapped(...)`` compute dX1 and dX2 (what the autograd layer relies on)."""
    rule, m1, m2, mu, M1, M2, O = make_rule("random")
    X1, X2, C = inputs(7, M1, M2, rule.nnz, torch.float64)
    X1.requires_grad_(True)
    X2.requires_grad_(True)
    C.requires_grad_(True)
    index = [torch.as_tensor(a, device=DEVICE) for a in (m1, m2, mu)]
    out = torch.zeros(7, O, dtype=torch.float64, device=DEVICE).index_add(
        1, index[2], X1[:, index[0]] * X2[:, index[1]] * C)
    G = torch.randn(7, O, dtype=torch.float64, device=DEVICE)
    dX1, dX2, dC = torch.autograd.grad(out, (X1, X2, C), G)
    got1 = triton_gpu.accumulate(G, X2.detach(), C.detach(), rule.swapped("X1"), M1)
    got2 = triton_gpu.accumulate(X1.detach(), G, C.detach(), rule.swapped("X2"), M2)
    got_c = triton_gpu.accumulate_dC(G, X1.detach(), X2.detach(), rule)
    for got, want in ((got1, dX1), (got2, dX2), (got_c, dC)):
        assert_close(got, want.cpu().numpy(), torch.float64)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_deterministic(strategy):
    rule, m1, m2, mu, M1, M2, O = make_rule("cg_like")
    X1, X2, C = inputs(70, M1, M2, rule.nnz, torch.float32)
    G = torch.randn(70, O, device=DEVICE)
    first = triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy)
    second = triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy)
    assert torch.equal(first, second)
    first = triton_gpu.accumulate_dC(G, X1, X2, rule, strategy=strategy)
    second = triton_gpu.accumulate_dC(G, X1, X2, rule, strategy=strategy)
    assert torch.equal(first, second)


@pytest.mark.parametrize("kind", ["fwd", "grad"])
def test_auto_kernel_both_store_branches(kind):
    """The "auto" kernel holds both store strategies behind the STORE_TILE constexpr that autotuning sets
    (one configuration runs here): each branch writes every element right."""
    rule, m1, m2, mu, M1, M2, O = make_rule("random")  # widths 5, 3, 6: tile and pieces stores differ
    R = 37
    X1, X2, C = inputs(R, M1, M2, rule.nnz, torch.float32)
    G = torch.randn(R, O, device=DEVICE)
    kernel = triton_gpu._row_kernel(kind, rule, "auto", "tl.float32")
    grid = (triton.cdiv(R, 32),)
    for flag in (0, 1):
        if kind == "fwd":
            out = torch.full((R, O), float("nan"), device=DEVICE)
            kernel.fn[grid](X1, X2, C, out, R, *X1.stride(), *X2.stride(), R.bit_length(), 3, BLOCK_R=32,
                            IDX64=False, STORE_TILE=flag, num_warps=1)
            assert_close(out, reference(X1, X2, C, m1, m2, mu, O), torch.float32)
        else:
            d1 = torch.full((R, M1), float("nan"), device=DEVICE)
            d2 = torch.full((R, M2), float("nan"), device=DEVICE)
            kernel.fn[grid](G, X1, X2, C, d1, d2, R, *G.stride(), *X1.stride(), *X2.stride(), R.bit_length(), 7,
                            BLOCK_R=32, IDX64=False, STORE_TILE=flag, num_warps=1)
            assert_close(d1, reference(G, X2, C, mu, m2, m1, M1), torch.float32)
            assert_close(d2, reference(X1, G, C, m1, mu, m2, M2), torch.float32)


def test_empty_rule_and_strategy_check():
    rule = prepare_rule(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                        torch.zeros(0, dtype=torch.int64), 3, 3, 4)
    X1, X2, C = inputs(5, 3, 3, 0, torch.float32)
    assert torch.equal(triton_gpu.accumulate(X1, X2, C, rule, 4).cpu(), torch.zeros(5, 4))
    assert triton_gpu.accumulate_dC(torch.randn(5, 4, device=DEVICE), X1, X2, rule).shape == (0,)
    with pytest.raises(ValueError):
        triton_gpu.accumulate(X1, X2, C, rule, 4, strategy="nope")


def test_generated_source_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_ACCUMULATION_TRITON_CACHE", str(tmp_path))
    source = "import triton\n\ndef f():\n    return 42\n"
    fn = triton_gpu._load_function(source, "f")
    assert fn() == 42
    files = [p for p in os.listdir(tmp_path) if p.endswith(".py")]
    assert len(files) == 1 and open(tmp_path / files[0]).read() == source


# ---------------------------------------------------------------------------------------------------------
# GPU (compiled kernels), skipped without CUDA

cuda = pytest.mark.skipif(INTERPRET, reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")


def _big_rule(seed=0, sizes=(17, 17, 17), nnz=361):
    rng = np.random.default_rng(seed)
    M1, M2, O = sizes
    m1, m2 = rng.integers(0, M1, nnz), rng.integers(0, M2, nnz)
    mu = rng.integers(0, O - 1, nnz)  # last output column unused
    rule = prepare_rule(torch.as_tensor(m1), torch.as_tensor(m2), torch.as_tensor(mu), M1, M2, O)
    return rule, m1, m2, mu, M1, M2, O


@cuda
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_gpu_forward(strategy, dtype, transposed):
    rule, m1, m2, mu, M1, M2, O = _big_rule()
    X1, X2, C = inputs(5003, M1, M2, rule.nnz, dtype, transposed=transposed, device="cuda")
    out = triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy)
    assert out.is_cuda and out.dtype == dtype and out.shape == (5003, O)
    expected = reference(X1, X2, C, m1, m2, mu, O)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    scale = np.abs(expected).max()
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=tol, atol=tol * scale)
    assert torch.count_nonzero(out[:, O - 1]) == 0
    assert torch.equal(out, triton_gpu.accumulate(X1, X2, C, rule, O, strategy=strategy))


@cuda
@pytest.mark.parametrize("strategy", LOAD_STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gpu_dC(strategy, dtype):
    rule, m1, m2, mu, M1, M2, O = _big_rule()
    X1, X2, _ = inputs(20011, M1, M2, rule.nnz, dtype, device="cuda")
    G = torch.randn(20011, O, dtype=dtype, device="cuda")
    dC = triton_gpu.accumulate_dC(G, X1, X2, rule, strategy=strategy)
    expected = reference_dC(G, X1, X2, m1, m2, mu)
    scale = reference_dC(G.abs(), X1.abs(), X2.abs(), m1, m2, mu).max()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(dC.double().cpu().numpy(), expected, rtol=0, atol=tol * scale)
    assert torch.equal(dC, triton_gpu.accumulate_dC(G, X1, X2, rule, strategy=strategy))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["random", "cg_like", "odd"])
def test_fused_input_gradients(strategy, name):
    """One kernel computes dX1 and dX2 (columns no nonzero reaches are zero) as the swapped-rule forwards do."""
    rule, m1, m2, mu, M1, M2, O = make_rule(name)
    X1, X2, C = inputs(33, M1, M2, rule.nnz, torch.float32)
    G = torch.randn(33, O, device=DEVICE)
    d1, d2 = triton_gpu.accumulate_input_gradients(G, X1.T.contiguous().T, X2, C, rule, strategy=strategy)
    expected1 = reference(G, X2, C, mu, m2, m1, M1)
    expected2 = reference(X1, G, C, m1, mu, m2, M2)
    assert_close(d1, expected1, torch.float32)
    assert_close(d2, expected2, torch.float32)


def test_public_api_gradients_on_triton():
    """sa.accumulate(implementation="triton"): first and second derivatives match the reference."""
    rule, m1, m2, mu, M1, M2, O = make_rule("random")
    index = [torch.as_tensor(a, device=DEVICE) for a in (m1, m2, mu)]
    X1, X2, C = inputs(6, M1, M2, rule.nnz, torch.float64)
    X1.requires_grad_(True)
    X2.requires_grad_(True)
    C.requires_grad_(True)

    def f(a, b, c):
        return sa.accumulate(a, b, index[2], O, index[0], index[1], c, implementation="triton")

    assert torch.autograd.gradcheck(f, (X1, X2, C))

    def second(function):
        y = function(X1, X2, index[2], O, index[0], index[1], C).pow(2).sum()
        g1, g2 = torch.autograd.grad(y, (X1, X2), create_graph=True)
        return torch.autograd.grad(g1.pow(2).sum() + (g2 * X2).sum(), (X1, X2, C))

    ours = second(lambda *args: sa.accumulate(*args, implementation="triton"))
    for got, want in zip(ours, second(sa.reference.index_add)):
        assert_close(got, want.detach().cpu().numpy(), torch.float64)
