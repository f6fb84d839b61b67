"""Triton kernels (``sparse_accumulation.kernels.triton_accumulate``) against a brute-force float64 loop.

Without a GPU (CI) the kernels run on CPU tensors under the Triton interpreter; on a CUDA machine the same
tests run compiled on CUDA tensors, unless ``TRITON_INTERPRET=1`` was set from outside; the larger tests marked
``cuda`` run only there (``pytest -m cuda``).

When triton reads ``TRITON_INTERPRET``: ``triton.jit`` reads it when a function is decorated. The kernel module
creates (decorates) its generated kernels lazily and keys its cache on the flag, and its generated code calls
only triton builtins and helpers it defines itself (not triton's own ``@jit`` library functions such as
``tl.sum``/``tl.zeros``, which are decorated once, when triton is imported). So setting the variable here works
whether or not triton was imported before; it is set before any import anyway, and restored when this module's
tests are done.
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
from sparse_accumulation.kernels import layout  # noqa: E402
from sparse_accumulation.kernels.triton import accumulate as triton_accumulate  # noqa: E402
from sparse_accumulation.kernels.triton import build, launch  # noqa: E402

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

# Only this module's tests run interpreted (the fixture below sets the variable again for them): other test
# modules collected after this one must see the environment as it was.
if _PREVIOUS_INTERPRET is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _PREVIOUS_INTERPRET

STRATEGIES = triton_accumulate.STRATEGIES + ("pieces+tile", "tile+pieces")
LOAD_STRATEGIES = ("tile", "pieces", "columns")  # the dC kernel only loads
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
cuda = pytest.mark.skipif(INTERPRET, reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")


@pytest.fixture(autouse=True, scope="module")
def _interpreter():
    if INTERPRET:
        os.environ["TRITON_INTERPRET"] = "1"
    yield
    if _PREVIOUS_INTERPRET is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _PREVIOUS_INTERPRET


def make_rule(name, weight_size=None):
    """``(rule, indices)``: a Rule and its index arrays as numpy, the operands' then the output's:
    ``(m1, m2, mu)`` or ``(m1, m2, w, mu)``."""
    rng = np.random.default_rng({"random": 1, "cg_like": 2, "single": 3, "wide": 4, "odd": 5, "big": 6}[name])
    if name == "random":
        # unsorted, duplicated entries; output column 5 (the last) is never hit
        M1, M2, O, nnz = 5, 3, 6, 24
        m1, m2, mu = rng.integers(0, M1, nnz), rng.integers(0, M2, nnz), rng.integers(0, O - 1, nnz)
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
    else:  # "big": the widths of l = 8, random indices, the last output column unused
        M1, M2, O, nnz = 17, 17, 17, 361
        m1, m2, mu = rng.integers(0, M1, nnz), rng.integers(0, M2, nnz), rng.integers(0, O - 1, nnz)
    w = None if weight_size is None else rng.integers(0, weight_size, len(m1))
    indices = [m1, m2, mu] if w is None else [m1, m2, w, mu]
    return sa.Rule(m1, m2, mu, O, input_sizes=(M1, M2), w=w, weight_size=weight_size), indices


def reference(operands, indices, C, O):
    """``out[a, b, mu[k]] += prod_i operands_i[a, b, indices_i[k]] * C[k]`` in float64, with broadcasting."""
    arrays = [t.detach().cpu().double().numpy() for t in operands]
    shape = np.broadcast_shapes(*(a.shape[:2] for a in arrays))
    arrays = [np.broadcast_to(a, shape + a.shape[2:]) for a in arrays]
    c = C.detach().cpu().double().numpy()
    out = np.zeros(shape + (O,))
    for k in range(len(c)):
        term = c[k]
        for a, index in zip(arrays, indices[:len(arrays)]):
            term = term * a[:, :, index[k]]
        out[:, :, indices[len(arrays)][k]] += term
    return out


def reference_gradient(G, operands, indices, C, j):
    """The gradient of operand ``j``: the rule with slot ``j`` and the output swapped, summed to its shape."""
    swapped = [G if i == j else t for i, t in enumerate(operands)]
    order = [len(operands) if i == j else i for i in range(len(operands))] + [j]
    full = reference(swapped, [indices[i] for i in order], C, operands[j].shape[2])
    axes = tuple(d for d in (0, 1) if operands[j].shape[d] == 1 and full.shape[d] != 1)
    return full.sum(axes, keepdims=True) if axes else full


def reference_dC(G, operands, indices):
    arrays = [t.detach().cpu().double().numpy() for t in [G] + list(operands)]
    shape = np.broadcast_shapes(*(a.shape[:2] for a in arrays))
    arrays = [np.broadcast_to(a, shape + a.shape[2:]) for a in arrays]
    order = [indices[len(operands)]] + list(indices[:len(operands)])
    return np.array([np.sum(np.prod([a[:, :, index[k]] for a, index in zip(arrays, order)], axis=0))
                     for k in range(len(indices[0]))])


def randn(*shape, dtype=torch.float64, generator=None):
    return torch.randn(*shape, generator=generator).to(dtype).to(DEVICE)


def operands_for(rule, shapes, dtype=torch.float64, transposed=False):
    """Fresh random operands of the given leading shapes (``[A_i, B_i]``), and coefficients."""
    sizes = list(rule.input_sizes) + ([rule.weight_size] if rule.weighted else [])
    result = []
    for (a, b), size in zip(shapes, sizes):
        t = randn(size, b, a, dtype=dtype).permute(2, 1, 0) if transposed else randn(a, b, size, dtype=dtype)
        result.append(t)
    return result, randn(rule.nnz, dtype=dtype)


def assert_close(actual, expected, dtype):
    actual = actual.detach().cpu().double().numpy()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCES[dtype], atol=TOLERANCES[dtype] * scale)


def poison_allocator(nbytes):
    """Best effort: leave NaNs in memory the next allocation may reuse."""
    torch.full((nbytes // 4 + 16,), float("nan"), dtype=torch.float32, device=DEVICE)


def rows_of(*operands):
    return layout.plan(operands, ["X1", "X2", "W"][:len(operands)])[1]


def _call(rule, operands, C, **options):
    X1, X2, *rest = operands
    return triton_accumulate.accumulate(X1, X2, rest[0] if rest else None, C, rule, rows_of(*operands), **options)


def _backward(G, rule, operands, C, *wanted):
    X1, X2, *rest = operands
    return triton_accumulate.accumulate_backward(G, X1, X2, rest[0] if rest else None, C, rule, rows_of(*operands),
                                          *wanted)


def _dC(G, rule, operands, **options):
    X1, X2, *rest = operands
    return triton_accumulate.accumulate_dC(G, X1, X2, rest[0] if rest else None, rule, rows_of(*operands), **options)


def test_is_available():
    assert triton_accumulate.is_available()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["random", "cg_like", "single", "wide", "odd"])
@pytest.mark.parametrize("R", [0, 1, 33])
def test_forward_float64(strategy, name, R):
    rule, indices = make_rule(name)
    operands, C = operands_for(rule, [(R, 1), (R, 1)])
    poison_allocator(R * rule.output_size * 8)
    out = _call(rule, operands, C, strategy=strategy)
    assert out.shape == (R, 1, rule.output_size) and out.dtype == torch.float64 and out.is_contiguous()
    assert_close(out, reference(operands, indices, C, rule.output_size), torch.float64)
    unused = sorted(set(range(rule.output_size)) - set(indices[2].tolist()))
    if unused and R:
        assert torch.count_nonzero(out[:, :, unused]) == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forward_dtypes(strategy, dtype):
    rule, indices = make_rule("cg_like")
    operands, C = operands_for(rule, [(33, 1), (33, 1)], dtype)
    out = _call(rule, operands, C, strategy=strategy)
    assert out.dtype == dtype
    # the reference sees the rounded 16-bit inputs
    assert_close(out, reference(operands, indices, C, rule.output_size), dtype)


# leading shapes of (X1, X2[, W]) against a broadcast (A, B) = (5, 7)
BROADCASTS = [[(35, 1), (35, 1), (35, 1)], [(5, 7), (5, 1), (5, 7)], [(5, 7), (1, 7), (5, 1)],
              [(5, 7), (1, 1), (1, 7)], [(1, 7), (5, 7), (1, 1)]]


@pytest.mark.parametrize("strategy", ["auto", "columns", "tile"])
@pytest.mark.parametrize("shapes", BROADCASTS)
@pytest.mark.parametrize("weighted", [False, True])
def test_broadcast_operands_forward_gradients_and_dC(strategy, shapes, weighted):
    """Operands that broadcast are read in place; their gradients are summed over what they broadcast."""
    rule, indices = make_rule("random", weight_size=4 if weighted else None)
    operands, C = operands_for(rule, shapes[:3 if weighted else 2], transposed=True)
    out = _call(rule, operands, C, strategy=strategy)
    assert_close(out, reference(operands, indices, C, rule.output_size), torch.float64)
    G = randn(*out.shape)
    grads = _backward(G, rule, operands, C, True, True, weighted, True)
    for j, operand in enumerate(operands):
        assert_close(grads[j], reference_gradient(G, operands, indices, C, j), torch.float64)
    assert_close(grads[3], reference_dC(G, operands, indices), torch.float64)


def test_gradients_take_the_shape_of_each_call():
    """Operands of different leading shapes that fold into the same row space (``[4, 5, M]`` and ``[20, M]``)
    share a call plan; each call's gradients still have its own operands' shapes and values."""
    rule, indices = make_rule("random")
    for lead in ((4, 5), (20,), (2, 10)):
        X1, X2 = (randn(*lead, size) for size in rule.input_sizes)
        C = randn(rule.nnz)
        G = randn(*lead, rule.output_size)
        grads = _backward(G, rule, [X1, X2], C, True, True, False, False)
        flat = [t.reshape(20, 1, -1) for t in (X1, X2)]
        for j, operand in enumerate((X1, X2)):
            assert grads[j].shape == operand.shape
            expected = reference_gradient(G.reshape(20, 1, -1), flat, indices, C, j)
            assert_close(grads[j].reshape(20, 1, -1), expected, torch.float64)


@pytest.mark.parametrize("lead, B", [(5, 8), (3, 32), (7, 2)])
@pytest.mark.parametrize("weighted", [False, True])
def test_gradients_summed_over_runs_of_rows_in_the_kernel(lead, B, weighted, monkeypatch):
    """Operands shared by runs of B rows (B a power of two): the fused gradient kernel sums their gradients
    in registers; the values equal the reference and the per-row gradients summed afterwards."""
    rule, indices = make_rule("random", weight_size=4 if weighted else None)
    operands, C = operands_for(rule, [(lead, B), (lead, 1), (lead, 1)][:3 if weighted else 2])
    G = randn(lead, B, rule.output_size)
    triton_accumulate._plans.clear()
    summed = _backward(G, rule, operands, C, True, True, weighted, False)
    plans = [plan for key, plan in triton_accumulate._plans.plans.items() if key[0] == "grad"]
    assert plans and all(dims is None for _, dims in plans[-1][1]), "a gradient is summed after the kernel"
    for j, operand in enumerate(operands):
        assert summed[j].shape == operand.shape
        assert_close(summed[j], reference_gradient(G, operands, indices, C, j), torch.float64)
    monkeypatch.setattr(triton_accumulate.configs, "SUMMED_INNER_MAX", 0)
    per_row = _backward(G, rule, operands, C, True, True, weighted, False)
    for a, b in zip(summed[:len(operands)], per_row):
        assert_close(a, b.double().numpy(), torch.float64)


@pytest.mark.parametrize("weighted", [False, True])
def test_gradients_one_at_a_time_and_unfused(weighted, monkeypatch):
    """Single gradients, and every gradient when the rule is too wide for the fused kernel, come from the
    forward kernel of the swapped rule."""
    rule, indices = make_rule("odd", weight_size=3 if weighted else None)
    operands, C = operands_for(rule, [(4, 5), (4, 1), (1, 5)][:3 if weighted else 2])
    G = randn(4, 5, rule.output_size)
    slots = len(operands)
    for fused_width in (17, 0):
        monkeypatch.setattr(triton_accumulate.configs, "FUSED_GRADIENTS_MAX_WIDTH", fused_width)
        for j in range(slots):
            wanted = [i == j for i in range(3)]
            grads = _backward(G, rule, operands, C, *wanted, False)
            assert grads[3] is None and all(g is None for i, g in enumerate(grads[:3]) if i != j)
            assert_close(grads[j], reference_gradient(G, operands, indices, C, j), torch.float64)


@pytest.mark.parametrize("strategy", ["auto", "pieces"])
def test_int64_offsets(strategy, monkeypatch):
    """The 64-bit offset path, forced on small tensors, with and without an inner dimension."""
    monkeypatch.setattr(triton_accumulate, "_INT32_LIMIT", 1)
    rule, indices = make_rule("random")
    for shapes in ([(33, 1), (33, 1)], [(3, 11), (3, 1)]):
        operands, C = operands_for(rule, shapes, transposed=True)
        out = _call(rule, operands, C, strategy=strategy)
        assert_close(out, reference(operands, indices, C, rule.output_size), torch.float64)
        G = randn(*out.shape)
        dC = _dC(G, rule, operands, strategy=strategy)
        assert_close(dC, reference_dC(G, operands, indices), torch.float64)


@pytest.mark.parametrize("strategy", LOAD_STRATEGIES)
@pytest.mark.parametrize("name", ["random", "cg_like", "single", "wide", "odd"])
@pytest.mark.parametrize("R", [0, 1, 70])
def test_dC_float64(strategy, name, R):
    rule, indices = make_rule(name)
    operands, _ = operands_for(rule, [(R, 1), (R, 1)])
    G = randn(R, 1, rule.output_size)
    dC = _dC(G, rule, operands, strategy=strategy)
    assert dC.shape == (rule.nnz,) and dC.dtype == torch.float64
    assert_close(dC, reference_dC(G, operands, indices), torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dC_dtypes_transposed(dtype):
    rule, indices = make_rule("cg_like")
    operands, _ = operands_for(rule, [(70, 1), (70, 1)], dtype, transposed=True)
    G = randn(rule.output_size, 1, 70, dtype=dtype).permute(2, 1, 0)
    dC = _dC(G, rule, operands)
    assert dC.dtype == dtype
    # a sum over 70 rows: compare to the scale of the summed magnitudes
    scale = reference_dC(G.abs(), [t.abs() for t in operands], indices).max()
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype]
    np.testing.assert_allclose(dC.double().cpu().numpy(), reference_dC(G, operands, indices), rtol=0,
                               atol=tol * scale)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_deterministic(strategy):
    rule, indices = make_rule("cg_like")
    operands, C = operands_for(rule, [(10, 7), (10, 1)], torch.float32)
    G = randn(10, 7, rule.output_size, dtype=torch.float32)
    for _ in range(2):
        first = _call(rule, operands, C, strategy=strategy)
        second = _call(rule, operands, C, strategy=strategy)
        assert torch.equal(first, second)
        first = _backward(G, rule, operands, C, True, True, False, True)
        second = _backward(G, rule, operands, C, True, True, False, True)
        assert all(torch.equal(a, b) for a, b in zip(first, second) if a is not None)


@pytest.mark.parametrize("kind", ["fwd", "grad"])
def test_auto_kernel_both_store_branches(kind):
    """The "auto" kernel holds both store strategies behind the STORE_TILE constexpr that autotuning sets
    (one configuration runs here): each branch writes every element right."""
    rule, indices = make_rule("random")  # widths 5, 3, 6: tile and pieces stores differ
    R = 37
    (X1, X2), C = operands_for(rule, [(R, 1), (R, 1)], torch.float32)
    G = randn(R, 1, rule.output_size, dtype=torch.float32)
    operands = [X1, X2] if kind == "fwd" else [G, X1, X2]
    rows = rows_of(*operands)
    static, strides = triton_accumulate._layout(operands, rows.operands, R, 1, [rule.output_size])
    kernel = triton_accumulate._row_kernel(kind, rule, static, "auto", "tl.float32",
                                   () if kind == "fwd" else ((0, False), (1, False)))
    ints = triton_accumulate._int_args(static, strides, R, 1)
    grid = (triton.cdiv(R, 32),)
    for flag in (0, 1):
        if kind == "fwd":
            out = torch.full((R, 1, rule.output_size), float("nan"), device=DEVICE)
            kernel.fn[grid](X1, X2, C, out, *ints, BLOCK_R=32, STORE_TILE=flag, num_warps=1)
            assert_close(out, reference([X1, X2], indices, C, rule.output_size), torch.float32)
        else:
            d1 = torch.full(X1.shape, float("nan"), device=DEVICE)
            d2 = torch.full(X2.shape, float("nan"), device=DEVICE)
            kernel.fn[grid](G, X1, X2, C, d1, d2, *ints, BLOCK_R=32, STORE_TILE=flag, num_warps=1)
            assert_close(d1, reference_gradient(G, [X1, X2], indices, C, 0), torch.float32)
            assert_close(d2, reference_gradient(G, [X1, X2], indices, C, 1), torch.float32)


def test_empty_rule_and_strategy_check():
    rule = sa.Rule([], [], [], 4, input_sizes=(3, 3))
    (X1, X2), C = operands_for(rule, [(5, 1), (5, 1)], torch.float32)
    assert torch.equal(_call(rule, [X1, X2], C).cpu(), torch.zeros(5, 1, 4))
    assert _dC(randn(5, 1, 4), rule, [X1, X2]).shape == (0,)
    with pytest.raises(ValueError, match="strategy must be one of"):
        _call(rule, [X1, X2], C, strategy="nope")


def test_generated_source_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_ACCUMULATION_TRITON_CACHE", str(tmp_path))
    source = "import triton\n\ndef f():\n    return 42\n"
    fn = build.load_function(source, "f")
    assert fn() == 42
    files = [p for p in os.listdir(tmp_path) if p.endswith(".py")]
    assert len(files) == 1 and open(tmp_path / files[0]).read() == source


@pytest.mark.slow
def test_public_api_gradients_on_triton():
    """sa.accumulate(implementation="triton") and a weighted rule with broadcasting: first and second
    derivatives match the float64 references."""
    rule, indices = make_rule("random")
    index = [torch.as_tensor(a, device=DEVICE) for a in indices]
    X1 = randn(6, rule.input_sizes[0]).requires_grad_()
    X2 = randn(6, rule.input_sizes[1]).requires_grad_()
    C = randn(rule.nnz).requires_grad_()

    def f(a, b, c):
        return sa.accumulate(a, b, index[2], rule.output_size, index[0], index[1], c, implementation="triton")

    assert torch.autograd.gradcheck(f, (X1, X2, C))
    weighted, windices = make_rule("cg_like", weight_size=3)
    w = torch.as_tensor(windices[2], device=DEVICE)
    Y1 = randn(2, 3, weighted.input_sizes[0]).requires_grad_()
    Y2 = randn(2, 1, weighted.input_sizes[1]).requires_grad_()
    W = randn(3, 3).requires_grad_()
    C2 = randn(weighted.nnz).requires_grad_()

    def second(function):
        y = function(Y1, Y2, W, C2).pow(2).sum()
        grads = torch.autograd.grad(y, (Y1, Y2, W), create_graph=True)
        return torch.autograd.grad(grads[0].pow(2).sum() + (grads[1] * Y2).sum() + grads[2].sum(), (Y1, Y2, W, C2))

    ours = second(lambda a, b, v, c: sa.accumulate_rule(a, b, weighted, c, v, implementation="triton"))
    expected = second(lambda a, b, v, c: sa.reference.index_add(
        a, b, torch.as_tensor(windices[3], device=DEVICE), weighted.output_size,
        torch.as_tensor(windices[0], device=DEVICE), torch.as_tensor(windices[1], device=DEVICE), c, W=v, w=w))
    for got, want in zip(ours, expected):
        assert_close(got, want.detach().cpu().numpy(), torch.float64)


# ---------------------------------------------------------------------------------------------------------
# GPU (compiled kernels), skipped without CUDA


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["auto", "tile", "columns"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_gpu_forward_and_gradients(strategy, dtype, transposed):
    rule, indices = make_rule("big")
    operands, C = operands_for(rule, [(5003, 1), (5003, 1)], dtype, transposed=transposed)
    out = _call(rule, operands, C, strategy=strategy)
    assert out.is_cuda and out.dtype == dtype
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    expected = reference(operands, indices, C, rule.output_size)
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=tol, atol=tol * np.abs(expected).max())
    assert torch.count_nonzero(out[:, :, -1]) == 0
    assert torch.equal(out, _call(rule, operands, C, strategy=strategy))
    G = randn(*out.shape, dtype=dtype)
    grads = _backward(G, rule, operands, C, True, True, False, False)
    for j in range(2):
        want = reference_gradient(G, operands, indices, C, j)
        np.testing.assert_allclose(grads[j].double().cpu().numpy(), want, rtol=tol, atol=tol * np.abs(want).max())


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gpu_dC(dtype):
    rule, indices = make_rule("big")
    operands, _ = operands_for(rule, [(20011, 1), (20011, 1)], dtype)
    G = randn(20011, 1, rule.output_size, dtype=dtype)
    dC = _dC(G, rule, operands)
    scale = reference_dC(G.abs(), [t.abs() for t in operands], indices).max()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(dC.double().cpu().numpy(), reference_dC(G, operands, indices), rtol=0,
                               atol=tol * scale)
    assert torch.equal(dC, _dC(G, rule, operands))


@cuda
@pytest.mark.cuda
def test_gpu_fast_launch_equals_public_launch(monkeypatch):
    """The direct launch of the compiled kernel gives bitwise the results of Triton's own launcher, for new
    row counts in the same tuning bucket and for misaligned views, and takes the fast path from the second
    call on."""
    rule, indices = make_rule("big", weight_size=5)
    results = {}
    for fast in (False, True):
        monkeypatch.setattr(launch, "FAST_LAUNCH", fast)
        g = torch.Generator().manual_seed(0)
        runs = []
        for rows in (3001, 3001, 3500, 3999):
            X1 = randn(rows, 2, rule.input_sizes[0], generator=g, dtype=torch.float32)
            X2 = randn(rows, 1, rule.input_sizes[1] + 1, generator=g, dtype=torch.float32)[:, :, 1:]  # misaligned
            W = randn(rows, 2, 5, generator=g, dtype=torch.float32)
            C = randn(rule.nnz, generator=g, dtype=torch.float32)
            G = randn(rows, 2, rule.output_size, generator=g, dtype=torch.float32)
            runs.append((_call(rule, [X1, X2, W], C),) + _backward(G, rule, [X1, X2, W], C, True, True, True, True))
        results[fast] = runs
        if fast:
            assert launch._plans, "no fast launch plan was made"
    for slow_run, fast_run in zip(results[False], results[True]):
        for a, b in zip(slow_run, fast_run):
            assert torch.equal(a, b)


@pytest.mark.parametrize("compiled_after", [None, 1])
def test_while_the_kernels_compile_calls_run_on_the_portable_kernels(generator, monkeypatch, compiled_after):
    """Kernels not compiled yet (``launch.ready`` False): ``accumulate``'s output, its gradients (C's included)
    and their gradients come from the portable torch kernels, launching nothing; with the kernels ready after
    the first call the rest launches them; every result equals the numba kernels'."""
    asked, launched = [], []
    monkeypatch.setattr(launch, "ready", lambda kernel, grid, pointers, ints: asked.append(kernel) or (
        compiled_after is not None and len(asked) > compiled_after))
    original = launch._public_or_first
    monkeypatch.setattr(launch, "_public_or_first", lambda kernel, *args: launched.append(kernel) or original(
        kernel, *args))
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 2, dtype=torch.float64)
    X1, X2 = (torch.randn(9, 3, 2 * l + 1, generator=generator, dtype=torch.float64) for l in (2, 1))
    found = {}
    for name, device in (("numba", "cpu"), ("triton", DEVICE)):
        inputs = [t.to(device).requires_grad_() for t in (X1, X2, C)]
        out = sa.accumulate(inputs[0], inputs[1], mu.to(device), 5, m1.to(device), m2.to(device), inputs[2],
                            implementation=name)
        first = torch.autograd.grad(out.square().sum(), inputs, create_graph=True)
        second = torch.autograd.grad(sum(g.square().sum() for g in first), inputs)
        found[name] = [t.detach().cpu() for t in (out, *first, *second)]
    for a, b in zip(found["triton"], found["numba"]):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert len(asked) >= 3
    assert len(launched) == (0 if compiled_after is None else len(asked) - compiled_after)


def _silu_second_order_reference(x, g, gg):
    """``(d/dx, d/dg)`` of ``sum(g * silu'(x) * gg)`` by autograd of ``x * sigmoid(x)``, in float64."""
    x, g = (t.detach().double().requires_grad_() for t in (x, g))
    (first,) = torch.autograd.grad((x * torch.sigmoid(x)).sum(), x, create_graph=True)
    return torch.autograd.grad((first * g * gg.double()).sum(), (x, g))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_silu_second_order_kernel(generator, dtype):
    """SiLU's second derivatives in one kernel against autograd in float64 (of the inputs as rounded to
    ``dtype``), over several blocks and a partial last one, with arguments where the sigmoid saturates."""
    from sparse_accumulation.kernels.triton import activations

    n = 2 * activations.BLOCK + 37
    x, g, gg = (torch.randn(n, generator=generator, dtype=torch.float64) * 4 for _ in range(3))
    x[:4] = torch.tensor([-90.0, 90.0, 0.0, -1e-3])
    x, g, gg = (t.to(dtype) for t in (x, g, gg))
    found = activations.silu_second_order(*(t.to(DEVICE) for t in (x, g, gg)))
    expected = _silu_second_order_reference(x, g, gg)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    for value, reference in zip(found, expected):
        assert value.dtype == dtype and value.shape == x.shape
        assert torch.allclose(value.double().cpu(), reference, atol=tolerance * float(reference.abs().max()),
                              rtol=tolerance)
