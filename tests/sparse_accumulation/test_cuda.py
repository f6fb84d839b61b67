"""The public API on CUDA tensors (Triton kernels): values, gradients, layouts, opcheck, torch.compile (default
and reduce-overhead), CUDA graphs, export and AOTInductor, and calls that never synchronise.

Skipped without a CUDA device; on a GPU machine run ``pytest -m cuda`` (see benchmarks/RESULTS.md).
"""
import subprocess
import sys

import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import assert_close_to, oracle, random_rule
from known_crashes import aoti_load_crash

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _problem(generator, dtype, lead=(40, 3), M1=5, M2=4, O=6, nnz=30):
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=nnz, dtype=dtype)
    X1 = torch.randn(*lead, M1, generator=generator, dtype=torch.float64).to(dtype)
    X2 = torch.randn(*lead, M2, generator=generator, dtype=torch.float64).to(dtype)
    return [t.cuda() for t in (X1, X2, mu, m1, m2, C)], O


def _reference(X1, X2, rule, C, W=None):
    """float64 index_add reference of a rule call, with autograd."""
    index = [rule.tensor(n, X1.device) for n in ("m1", "m2", "mu")]
    weights = {} if W is None else {"W": W, "w": rule.tensor("w", X1.device)}
    return sa.reference.index_add(X1, X2, index[2], rule.output_size, index[0], index[1], C, **weights)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_values_and_layouts(generator, dtype):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, dtype)
    assert sa.is_available("triton", "cuda")
    expected = oracle(X1, X2, mu, O, m1, m2, C)
    out = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    assert out.is_cuda and out.dtype == dtype
    assert_close_to(out, expected, dtype)
    first = sa.accumulate_active_dim_first(X1.movedim(-1, 0).contiguous(), X2.movedim(-1, 0).contiguous(),
                                           mu, O, m1, m2, C)
    assert_close_to(first, expected.movedim(-1, 0), dtype)
    middle = sa.accumulate_active_dim_middle(X1.movedim(-1, 1).contiguous(), X2.movedim(-1, 1).contiguous(),
                                             mu, O, m1, m2, C)
    assert_close_to(middle, expected.movedim(-1, 1), dtype)


def test_gradients_to_second_order(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float64, lead=(6,))
    inputs = [t.requires_grad_() for t in (X1, X2, C)]

    def f(a, b, c):
        return sa.accumulate(a, b, mu, O, m1, m2, c)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_broadcast_weighted_rule_to_second_order(generator):
    """Message-passing shapes: X1 [E, F, M1], X2 [E, 1, M2] shared by the channels, W [E, F, paths]."""
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 2, dtype=torch.float64, device="cuda")
    paths = torch.randint(0, 3, (len(C),), generator=generator).cuda()
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(5, 3), w=paths, weight_size=3)
    X1 = torch.randn(4, 3, 5, generator=generator, dtype=torch.float64).cuda().requires_grad_()
    X2 = torch.randn(4, 1, 3, generator=generator, dtype=torch.float64).cuda().requires_grad_()
    W = torch.randn(4, 3, 3, generator=generator, dtype=torch.float64).cuda().requires_grad_()
    C = C.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: sa.accumulate_rule(a[0], a[1], rule, a[3], a[2]), (X1, X2, W, C))
    assert torch.autograd.gradgradcheck(lambda *a: sa.accumulate_rule(a[0], a[1], rule, a[3], a[2]), (X1, X2, W, C))


@pytest.mark.parametrize("channels", [8, 32])
def test_gradients_of_operands_shared_by_channels(generator, channels):
    """X2 [E, 1, M2] against X1 [E, F, M1] with F a power of two: the fused gradient kernel sums dX2 over the
    channels in registers; values and gradients against float64 index_add on expanded copies."""
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 2, dtype=torch.float64, device="cuda")
    paths = torch.randint(0, 3, (len(C),), generator=generator).cuda()
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(5, 3), w=paths, weight_size=3)
    shapes = [(1001, channels, 5), (1001, 1, 3), (1001, channels, 3)]
    inputs = [torch.randn(*shape, generator=generator, dtype=torch.float64).cuda() for shape in shapes]
    ours = [t.float().requires_grad_() for t in inputs]
    out = sa.accumulate_rule(ours[0], ours[1], rule, C.float(), ours[2])
    exact = [t.clone().requires_grad_() for t in inputs]
    expected = _reference(exact[0], exact[1].expand(1001, channels, 3), rule, C, exact[2])
    assert_close_to(out, expected, torch.float32)
    G = torch.randn(expected.shape, generator=generator, dtype=torch.float64).cuda()
    for a, b in zip(torch.autograd.grad(out, ours, G.float()), torch.autograd.grad(expected, exact, G)):
        assert a.shape == b.shape
        assert_close_to(a, b, torch.float32)


def test_large_rows_fp32_gradients_match_reference(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float32, lead=(300, 170))
    X1.requires_grad_()
    X2.requires_grad_()
    G = torch.randn(300, 170, O, device="cuda")
    got = torch.autograd.grad(sa.accumulate(X1, X2, mu, O, m1, m2, C), (X1, X2), G)
    exact = [t.detach().double().requires_grad_() for t in (X1, X2)]
    expected = torch.autograd.grad(sa.reference.index_add(exact[0], exact[1], mu, O, m1, m2, C.double()), exact,
                                   G.double())
    for a, b in zip(got, expected):
        assert_close_to(a, b, torch.float32)
    again = torch.autograd.grad(sa.accumulate(X1, X2, mu, O, m1, m2, C), (X1, X2), G)
    assert all(torch.equal(a, b) for a, b in zip(got, again)), "results must be deterministic"


def test_opcheck_on_cuda(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float64, lead=(9,))
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(X1.shape[-1], X2.shape[-1]))
    for permuted in (False, True):
        a = X1.T.contiguous().T if permuted else X1
        for requires_grad in (False, True):
            args = [t.detach().requires_grad_(requires_grad) for t in (a, X2, C)]
            G = torch.randn(9, O, device="cuda", dtype=torch.float64)
            torch.library.opcheck(torch.ops.sparse_accumulation.accumulate.default,
                                  (args[0], args[1], None, args[2], rule.key, "triton"))
            torch.library.opcheck(torch.ops.sparse_accumulation.accumulate_backward.default,
                                  (G, args[0], args[1], None, args[2], rule.key, "triton", True, True, False, True))
            torch.library.opcheck(torch.ops.sparse_accumulation.accumulate_indexed.default,
                                  (args[0], args[1], args[2], m1, m2, mu, O, "triton"))


def test_compile_sees_the_triton_kernels_and_matches_eager(generator):
    """Under torch.compile the rule ops' Triton launches are traced: inductor's own code launches our kernels."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    module = sa.CGCalculatorSingle(3, 2, 4).cuda()
    X1 = torch.randn(64, 7, device="cuda", requires_grad=True)
    X2 = torch.randn(64, 5, device="cuda", requires_grad=True)

    def step(a, b):
        return module(a.sin(), b).square().sum()

    compiled = torch.compile(step, fullgraph=True)
    got, code = run_and_get_code(compiled, X1, X2)
    assert any("sparse_accumulation_fwd" in c for c in code), "the generated kernel is not in inductor's code"
    expected = step(X1, X2)
    assert_close_to(got, expected, torch.float32)
    for a, b in zip(torch.autograd.grad(got, (X1, X2)), torch.autograd.grad(expected, (X1, X2))):
        assert_close_to(a, b, torch.float32)


def test_compile_reduce_overhead_forward_and_backward(generator):
    """mode="reduce-overhead" (CUDA graphs) works for forward and forward+backward, on new values each step."""
    torch._dynamo.reset()
    product = sa.ClebschGordanProduct(2, 1, weights=True).cuda()

    def forward(F, Y):
        return product(F, Y)

    def train_step(F, Y):
        out = product(F, Y)
        return torch.autograd.grad(out.square().sum(), (F, Y, product.weight))

    compiled_forward = torch.compile(forward, mode="reduce-overhead", fullgraph=True)
    compiled_step = torch.compile(train_step, mode="reduce-overhead")
    for _ in range(4):
        F = torch.randn(50, 4, product.dim1, generator=generator).cuda().requires_grad_()
        Y = torch.randn(50, 1, product.dim2, generator=generator).cuda().requires_grad_()
        assert_close_to(compiled_forward(F, Y), forward(F, Y), torch.float32)
        for a, b in zip(compiled_step(F, Y), train_step(F, Y)):
            assert_close_to(a, b, torch.float32)


@pytest.mark.parametrize("l", [1, 2, 8])
def test_tensor_api_with_captured_index_tensors_under_cuda_graphs(generator, l):
    """``accumulate(X1, X2, mu, M, m1, m2, C)`` with CUDA index tensors captured by a closure runs as CUDA graphs
    (reduce-overhead), forward and forward+backward, equal to eager on new values each step; index values
    changed after tracing raise instead of using the traced rule."""
    torch._dynamo.reset()
    m1, m2, mu, C = (t.cuda() for t in sa.get_cg_transformation_rule(l, l, l))
    M = 2 * l + 1

    def step(X1, X2):
        out = sa.accumulate(X1, X2, mu, M, m1, m2, C)
        return (out,) + torch.autograd.grad(out.square().sum(), (X1, X2))

    compiled = torch.compile(step, mode="reduce-overhead")
    for _ in range(4):
        X1, X2 = (torch.randn(300, 7, M, generator=generator).cuda().requires_grad_() for _ in range(2))
        for a, b in zip(compiled(X1, X2), step(X1, X2)):
            assert_close_to(a, b, torch.float32)
    mu[0] = (mu[0] + 1) % M
    torch.cuda.synchronize()
    forward = torch.compile(lambda X1, X2: sa.accumulate(X1, X2, mu, M, m1, m2, C), mode="reduce-overhead",
                            fullgraph=True)
    X1, X2 = (torch.randn(300, 7, M, generator=generator).cuda() for _ in range(2))
    for _ in range(3):  # traced with the edited values: their rule
        assert_close_to(forward(X1, X2), sa.accumulate(X1, X2, mu, M, m1, m2, C), torch.float32)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_message_passing_at_new_edge_counts_matches_eager(generator, mode):
    """A compiled message-passing step (an e3nn convolution's product, energies and forces-like gradients) called
    with other numbers of edges and nodes, as a molecular-dynamics loop's neighbour lists change: torch.compile
    recompiles with symbolic sizes (automatic dynamic shapes), which the Triton launches must accept; every call
    equals eager."""
    import sparse_accumulation.e3nn as ours

    torch._dynamo.reset()
    product = ours.TensorProduct("4x0e + 4x1o", "0e + 1o", "4x0e + 4x1o",
                                 [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (0, 1, 1, "uvu", True),
                                  (1, 0, 1, "uvu", True)], shared_weights=False, internal_weights=False).cuda()

    def step(x, y, w, src, dst, nodes: int):
        out = product(x, y, w, indices_1=src, indices_out=dst, size_out=nodes)
        return (out,) + torch.autograd.grad(out.square().sum(), (x, y, w))

    compiled = torch.compile(step, mode=mode)
    for nodes, edges in ((30, 200), (41, 333), (25, 150), (52, 401)):
        src = torch.randint(0, nodes, (edges,), generator=generator).cuda()
        dst = torch.randint(0, nodes, (edges,), generator=generator).cuda()
        x = torch.randn(nodes, product.irreps_in1.dim, generator=generator).cuda().requires_grad_()
        y = torch.randn(edges, product.irreps_in2.dim, generator=generator).cuda().requires_grad_()
        w = torch.randn(edges, product.weight_numel, generator=generator).cuda().requires_grad_()
        for a, b in zip(compiled(x, y, w, src, dst, nodes), step(x, y, w, src, dst, nodes)):
            assert_close_to(a, b, torch.float32)


def test_calls_never_synchronise(generator):
    """Eager forward, forward+backward and double backward through rules, and the compiled step, run with
    torch.cuda.set_sync_debug_mode("error"): no host-device copy, no synchronisation."""
    module = sa.CGCalculatorSingle(2, 2, 2).cuda()
    product = sa.ClebschGordanProduct(1, 1, weights=True).cuda()
    X1 = torch.randn(100, 5, device="cuda", requires_grad=True)
    X2 = torch.randn(100, 5, device="cuda", requires_grad=True)
    F = torch.randn(100, 3, product.dim1, device="cuda", requires_grad=True)
    compiled = torch.compile(lambda a, b: module(a, b).square().sum(), fullgraph=True)

    def everything():
        module(X1, X2)
        module(X1, X2).square().sum().backward()
        (g,) = torch.autograd.grad(module(X1, X2).square().sum(), X1, create_graph=True)
        g.square().sum().backward()
        product(F, F).sum().backward()
        compiled(X1, X2).backward()

    everything()  # warm-up: kernels compiled and tuned, rules and launch plans made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        everything()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_export_and_aot_inductor(generator, tmp_path):
    """torch.export keeps the rule op and runs; AOTInductor compiles the exported program with our kernels. Its
    compile-and-load runs in a child process, since loading the package crashes the process with torch 2.11
    (segmentation fault inside torch's loader, for any package, also a plain ``(x * 2).sin()`` one on the
    CPU): that crash is reported as the known failure; any other crash, an error and wrong values fail."""
    module = sa.CGCalculatorSingle(2, 1, 2).cuda()
    X1 = torch.randn(32, 5, device="cuda")
    X2 = torch.randn(32, 3, device="cuda")
    expected = module(X1, X2)
    program = torch.export.export(module, (X1, X2))
    assert_close_to(program.module()(X1, X2), expected, torch.float32)
    torch.export.save(program, str(tmp_path / "program.pt2"))
    torch.save((X1.cpu(), X2.cpu(), expected.cpu()), tmp_path / "data.pt")
    code = (f"import faulthandler, torch, sparse_accumulation\n"
            f"faulthandler.enable()\n"
            f"program = torch.export.load({str(tmp_path / 'program.pt2')!r})\n"
            f"X1, X2, expected = (t.cuda() for t in torch.load({str(tmp_path / 'data.pt')!r}))\n"
            f"package = torch._inductor.aoti_compile_and_package(program, "
            f"package_path={str(tmp_path / 'model.pt2')!r})\n"
            f"print('compiled', flush=True)\n"
            f"loaded = torch._inductor.aoti_load_package(package)\n"
            f"print('loaded', flush=True)\n"
            f"print(float((loaded(X1, X2) - expected).abs().max() / expected.abs().max()))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=500)
    if aoti_load_crash(result):
        pytest.xfail(f"torch {torch.__version__}: aoti_load_package crashed (segmentation fault) after compiling")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[:2] == ["compiled", "loaded"]
    assert float(result.stdout.split()[-1]) <= 1e-6


def test_runs_on_the_current_stream(generator):
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float32)
    expected = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = sa.accumulate(X1, X2, mu, O, m1, m2, C)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("warm_up_on, compiling", [("side stream", False), ("side stream", True),
                                                    ("default stream", True)])
def test_cuda_graph_replay_of_forward_and_backward(generator, monkeypatch, warm_up_on, compiling):
    """A forward+backward step captured in a CUDA graph replays the kernels on new input values and matches
    the float64 reference. Warmed up on a side stream, as torch asks (autotuning and launch plans off the
    capture), also with the kernels still compiling then: the warm-up waits for them. Warmed up on the default
    stream while they compile, it runs on the portable kernels, and the capture launches them untuned."""
    from sparse_accumulation.kernels.triton import build, launch

    if compiling:
        monkeypatch.setattr(launch, "WAIT_FOR_COMPILES", False)
        monkeypatch.setattr(build, "compiled", lambda kernel, args, grid: False)  # every kernel "still compiling"
    before = launch.not_ready_calls
    (X1, X2, mu, m1, m2, C), O = _problem(generator, torch.float32, lead=(500, 2))
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(X1.shape[-1], X2.shape[-1]))
    X1.requires_grad_()
    X2.requires_grad_()
    G = torch.randn(500, 2, O, device="cuda")

    def step():
        out = sa.accumulate_rule(X1, X2, rule, C)
        return (out,) + torch.autograd.grad(out, (X1, X2), G)

    stream = torch.cuda.Stream() if warm_up_on == "side stream" else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    assert (launch.not_ready_calls > before) == (warm_up_on == "default stream")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        X1.copy_(torch.randn(X1.shape, generator=generator).cuda())
        X2.copy_(torch.randn(X2.shape, generator=generator).cuda())
    graph.replay()
    torch.cuda.synchronize()
    exact = [t.detach().double().requires_grad_() for t in (X1, X2)]
    out = _reference(exact[0], exact[1], rule, C.double())
    expected = (out,) + torch.autograd.grad(out, exact, G.double())
    for got, want in zip(captured, expected):
        assert_close_to(got, want.detach(), torch.float32)
