"""Triton graph kernels (``sparse_accumulation.kernels.triton.graph``) against the plain torch graph kernels
and an independent float64 reference; interpreted on the CPU without a GPU (``interpreted.py``), the larger
tests marked ``cuda`` only on a GPU (``pytest -m cuda``)."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.descriptors.channel_rules import ONE, ChannelRule, ColumnMap, contiguous_map  # noqa: E402
from sparse_accumulation.indices import segments  # noqa: E402
from sparse_accumulation.kernels.torch import graph as torch_graph  # noqa: E402
from sparse_accumulation.kernels.triton import graph as triton_graph  # noqa: E402
from graph_helpers import random_graph, reference, weighted_rule  # noqa: E402

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE


def _rand(generator, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype).to(DEVICE)


def _crule(channels):
    """A weighted CG rule on ``channels`` channels: X1 and W per channel, X2 shared, W with a constant column."""
    rule, C = weighted_rule(weight_size=4)
    step = 3 if channels > 1 else 0
    w_map = ColumnMap((0, 1, 2, ONE), (step, step, step, 0), 3 * channels)
    maps = (contiguous_map(5, channels), contiguous_map(3, 1), w_map, contiguous_map(5, channels))
    return ChannelRule(rule, channels, maps), C


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("mode", ["segment", "segment-sorted", "atomic", "edge"])
def test_forward_matches_the_torch_kernels(generator, channels, mode):
    crule, C = _crule(channels)
    nodes, edges = 6, 37
    src, dst = random_graph(generator, nodes, edges, sorted_dst=mode == "segment-sorted")
    src[0] = nodes + 3  # a gathered row out of range reads as zeros
    X1 = _rand(generator, nodes, crule.maps[0].width)
    X2 = _rand(generator, edges, 3)
    W = _rand(generator, edges, crule.maps[2].width)
    C = C.to(DEVICE)
    src, dst = src.to(DEVICE), dst.to(DEVICE)
    out_index = None if mode == "edge" else dst
    rows = edges if mode == "edge" else nodes
    kind = "edge" if mode == "edge" else "atomic" if mode == "atomic" else "segment"
    seg = None
    if kind == "segment":
        seg = segments(dst, nodes) if mode == "segment" else (segments(dst, nodes)[0], None)
    args = ((X1, X2, W, None), (src, None, None, out_index), ((3, kind, rows),), C)
    ours = triton_graph.run(crule, *args, edges=edges, segments=seg)[0]
    theirs = torch_graph.run(crule, *args, edges=edges)[0]
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels", [1, 4])
def test_fused_gradients_match_the_torch_kernels(generator, channels):
    """The backward of message passing in one kernel: dX1 summed by source, dX2 (shared: summed over the
    channels) and dW per edge."""
    crule, C = _crule(channels)
    nodes, edges = 5, 29
    src, dst = (t.to(DEVICE) for t in random_graph(generator, nodes, edges))
    X1, X2 = _rand(generator, nodes, crule.maps[0].width), _rand(generator, edges, 3)
    W, G = _rand(generator, edges, crule.maps[2].width), _rand(generator, nodes, crule.maps[3].width)
    args = ((X1, X2, W, G), (src, None, None, dst), ((0, "segment", nodes), (1, "edge", edges), (2, "edge", edges)),
            C.to(DEVICE))
    ours = triton_graph.run(crule, *args, edges=edges, segments=segments(src, nodes))
    theirs = torch_graph.run(crule, *args, edges=edges)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def _split_counted(monkeypatch) -> list:
    """Share each row's edges among 3 programs wherever rows have 4 edges on average; record the splits."""
    monkeypatch.setattr(triton_graph, "SPLIT", 3)
    monkeypatch.setattr(triton_graph, "SPLIT_MIN_EDGES", 4)
    made, real = [], triton_graph._split
    monkeypatch.setattr(triton_graph, "_split", lambda *a: made.append(real(*a)) or made[-1])
    return made


@pytest.mark.parametrize("channels", [1, 4])
@pytest.mark.parametrize("sorted_dst", [False, True])
def test_rows_shared_by_several_programs_equal_the_torch_kernels(generator, monkeypatch, channels, sorted_dst):
    """Each row's edges walked by 3 programs (partial sums, then added per row in order): the forward with an
    operand gathered by the grid index, a row without edges, rows of fewer edges than programs, a gathered row
    out of range; the fused backward (segments by source, edge outputs riding along)."""
    made = _split_counted(monkeypatch)
    crule, C = _crule(channels)
    nodes, edges = 7, 31
    src, dst = random_graph(generator, nodes - 1, edges, sorted_dst=sorted_dst)  # node 6 receives nothing
    dst[-2:] = nodes - 2  # ...
    dst[:-2] = dst[:-2] % (nodes - 2)  # and node 5 two edges, fewer than the programs sharing them
    if sorted_dst:
        dst = dst.sort().values
    src[0] = nodes + 3
    src, dst, C = src.to(DEVICE), dst.to(DEVICE), C.to(DEVICE)
    X1, X2 = _rand(generator, nodes, crule.maps[0].width), _rand(generator, nodes, 3)
    W, G = _rand(generator, edges, crule.maps[2].width), _rand(generator, nodes, crule.maps[3].width)
    seg = segments(dst, nodes) if not sorted_dst else (segments(dst, nodes)[0], None)
    args = ((X1, X2, W, None), (src, dst, None, dst), ((3, "segment", nodes),), C)
    ours = triton_graph.run(crule, *args, edges=edges, segments=seg, hoisted=(1,))[0]
    theirs = torch_graph.run(crule, *args, edges=edges, segments=seg, hoisted=(1,))[0]
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12) and not ours[nodes - 1].any()
    X2 = _rand(generator, edges, 3)
    src[0] = 0  # (an edge out of the grid index's range is in no segment: its edge outputs are not written)
    args = ((X1, X2, W, G), (src, None, None, dst), ((0, "segment", nodes), (1, "edge", edges), (2, "edge", edges)),
            C)
    ours = triton_graph.run(crule, *args, edges=edges, segments=segments(src, nodes))
    theirs = torch_graph.run(crule, *args, edges=edges)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert made == [3, 3]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_public_api_on_triton(generator, dtype):
    rule, C = weighted_rule()
    nodes, edges = 6, 23
    src, dst = (t.to(DEVICE) for t in random_graph(generator, nodes, edges))
    X1, X2, W = (_rand(generator, *shape, dtype=dtype).requires_grad_()
                 for shape in ((nodes, 4, 5), (edges, 1, 3), (edges, 4, 3)))
    C = C.to(dtype).to(DEVICE)
    ours = sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes,
                              implementation="triton")
    theirs = reference(X1, X2, W, C, rule, (src, None, None, dst), nodes)
    assert ours.dtype == dtype
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-2}[dtype]
    G = torch.randn(ours.shape, dtype=torch.float64, generator=generator).to(DEVICE)
    pairs = [(ours, theirs)] + list(zip(torch.autograd.grad(ours, (X1, X2, W), G.to(dtype)),
                                        torch.autograd.grad(theirs, (X1, X2, W), G)))
    for a, b in pairs:
        assert ((a.double() - b.double()).abs().max() / b.double().abs().max()).item() < tolerance


@pytest.mark.parametrize("compiled_after", [None, 2])
def test_while_the_kernels_compile_calls_run_on_the_portable_kernels(generator, monkeypatch, compiled_after):
    """Kernels not compiled yet (``launch.ready`` False): the forward, the gradients and the second
    derivatives are computed by the portable torch kernels and launch nothing; with the kernels ready after a
    few calls, the rest of the same graph launches them: every result agrees with the reference."""
    from sparse_accumulation.kernels.triton import launch

    asked, launched = [], []
    monkeypatch.setattr(launch, "ready", lambda kernel, grid, pointers, ints: asked.append(kernel) or (
        compiled_after is not None and len(asked) > compiled_after))
    original = launch.launch
    monkeypatch.setattr(launch, "launch", lambda *args, **kwargs: launched.append(args[0]) or original(*args,
                                                                                                        **kwargs))
    rule, C = weighted_rule()
    nodes, edges = 6, 23
    src, dst = (t.to(DEVICE) for t in random_graph(generator, nodes, edges))
    X1, X2, W = (_rand(generator, *shape).requires_grad_() for shape in ((nodes, 4, 5), (edges, 1, 3), (edges, 4, 3)))
    C = C.to(DEVICE)
    ours = sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes,
                              implementation="triton")
    theirs = reference(X1, X2, W, C, rule, (src, None, None, dst), nodes)
    G = _rand(generator, *ours.shape)
    first = [torch.autograd.grad(out, (X1, X2, W), G, create_graph=True) for out in (ours, theirs)]
    second = [torch.autograd.grad(sum(g.square().sum() for g in grads), (X1, X2, W)) for grads in first]
    for a, b in [(ours, theirs), *zip(*first), *zip(*second)]:
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert len(asked) >= 4  # forward, backward, and the second derivatives' calls each asked
    assert len(launched) == (0 if compiled_after is None else len(asked) - compiled_after)
    with torch.inference_mode():  # as an MD loop calls it
        inferred = sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes,
                                      implementation="triton")
    assert torch.allclose(inferred, theirs, rtol=1e-12, atol=1e-12)


@interpreted.cuda
@pytest.mark.cuda
def test_large_graph_on_cuda_matches_the_reference(generator):
    rule, C = weighted_rule()
    nodes, edges = 3000, 100_000
    src, dst = (t.to(DEVICE) for t in random_graph(generator, nodes, edges))
    X1 = _rand(generator, nodes, 32, 5).requires_grad_()
    X2 = _rand(generator, edges, 1, 3).requires_grad_()
    W = _rand(generator, edges, 32, 3).requires_grad_()
    C = C.to(DEVICE)
    for reduction in ("segment", "atomic"):
        ours = sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes,
                                  reduction=reduction)
        theirs = sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes,
                                    implementation="torch")
        assert torch.allclose(ours, theirs, rtol=1e-10, atol=1e-10)
        G = torch.randn_like(ours)
        for a, b in zip(torch.autograd.grad(ours, (X1, X2, W), G), torch.autograd.grad(theirs, (X1, X2, W), G)):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)
    first = sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes)
    assert torch.equal(first, sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst,
                                                 size_out=nodes))


@interpreted.cuda
@pytest.mark.cuda
def test_a_first_call_on_cuda_runs_while_its_kernels_compile_then_launches_them(tmp_path):
    """In a new process with empty kernel caches, a message-passing call, an ``accumulate`` call and their
    gradients return at once (computed by the portable kernels while the workers compile); calls after the
    compiles launch the kernels and agree with the first."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import sparse_accumulation as sa
        from sparse_accumulation.kernels.triton import launch
        from graph_helpers import random_graph, weighted_rule
        g = torch.Generator().manual_seed(0)
        rule, C = weighted_rule()
        nodes, edges = 50, 2000
        src, dst = (t.cuda() for t in random_graph(g, nodes, edges))
        X1, X2, W = (torch.randn(*shape, generator=g, dtype=torch.float64).cuda().requires_grad_()
                     for shape in ((nodes, 16, 5), (edges, 1, 3), (edges, 16, 3)))
        C = C.to(torch.float64).cuda()
        m1, m2, mu, C_op = sa.get_cg_transformation_rule(3, 3, 3, dtype=torch.float64, device="cuda")
        A, B = (torch.randn(500, 8, 7, generator=g, dtype=torch.float64).cuda().requires_grad_() for _ in range(2))

        def call():
            out = sa.accumulate_rule(X1, X2, rule, C, W, indices_1=src, indices_out=dst, size_out=nodes)
            op = sa.accumulate(A, B, mu, 7, m1, m2, C_op)
            return [out, op, *torch.autograd.grad(out.square().sum() + op.square().sum(), (X1, X2, W, A, B))]

        start = time.perf_counter()
        first = call()
        portable = launch.not_ready_calls
        assert portable >= 2, portable
        while True:
            before = launch.not_ready_calls
            later = call()
            if launch.not_ready_calls == before:
                break
            assert time.perf_counter() - start < 300
        for a, b in zip(first, later):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)
        print(portable, len(launch._ready))
    """)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"),
               SPARSE_ACCUMULATION_TRITON_CACHE=str(tmp_path / "sources"))
    for name in ("SPARSE_ACCUMULATION_TRITON_WAIT", "SPARSE_ACCUMULATION_TRITON_COMPILE_WORKERS", "TRITON_INTERPRET"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    portable, ready = map(int, result.stdout.split())
    assert portable >= 2 and ready >= 2
    assert "compiling in the background" in result.stderr
