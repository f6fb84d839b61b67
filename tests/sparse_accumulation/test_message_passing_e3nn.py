"""``sparse_accumulation.e3nn.TensorProduct`` with cuEquivariance's keywords (``indices_1``, ``indices_2``,
``indices_out``, ``size_out``) against e3nn's ``scatter(tp(x[indices_1], y[indices_2], w))`` in float64:
values, gradients and the force-training double backward, on the CPU kernels and the Triton kernels
(interpreted without a GPU, see ``interpreted.py``)."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("e3nn")
pytest.importorskip("triton")

from e3nn import o3  # noqa: E402

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.e3nn import TensorProduct  # noqa: E402

interpreted.restore()
_interpreter = interpreted.module_fixture()

CHANNELS = 2


@pytest.fixture(params=["fused", "per edge"])
def schedule(request, monkeypatch):
    """On the CPU's numba kernels, message passing runs fused or per edge (the gathered rows' product, summed by
    destination) by the channel count; each test runs both."""
    from sparse_accumulation.e3nn import tensor_product

    monkeypatch.setattr(tensor_product, "FUSED_MIN_CHANNELS", 0 if request.param == "fused" else 1 << 30)
    return request.param


def _modules(dtype, implementation, shared_weights=False):
    """e3nn's product and ours: a NequIP interaction, every "uvu" path into its own output irrep."""
    in1 = o3.Irreps(f"{CHANNELS}x0e + {CHANNELS}x1o + {CHANNELS}x2e")
    in2 = o3.Irreps("0e + 1o + 2e + 3o")
    out, instructions = [], []
    for i1, (mul, ir1) in enumerate(in1):
        for i2, (_, ir2) in enumerate(in2):
            for ir in ir1 * ir2:
                if ir in o3.Irreps("0e + 1o + 2e"):
                    instructions.append((i1, i2, len(out), "uvu", True))
                    out.append((mul, ir))
    kwargs = {"shared_weights": shared_weights, "internal_weights": False}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        theirs = o3.TensorProduct(in1, in2, o3.Irreps(out), instructions, **kwargs)
        ours = TensorProduct(in1, in2, o3.Irreps(out), instructions, implementation=implementation, **kwargs)
    finally:
        torch.set_default_dtype(previous)
    return theirs, ours.to(dtype)


def _graph(generator, nodes, edges, device):
    src = torch.randint(0, nodes, (edges,), generator=generator)
    dst = torch.randint(0, nodes, (edges,), generator=generator)
    return src.to(device), dst.to(device)


def _relative(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("implementation,dtype", [
    ("numba", torch.float64), ("triton", torch.float32),
    pytest.param("triton", torch.float64, marks=pytest.mark.slow)])
def test_message_passing_matches_e3nn_to_second_order(generator, implementation, dtype, schedule):
    if implementation == "triton" and schedule == "per edge":
        pytest.skip("the per-edge schedule is the CPU's numba kernels'")
    device = interpreted.DEVICE if implementation == "triton" else "cpu"
    theirs, ours = _modules(dtype, implementation)
    theirs, ours = theirs.to(device), ours.to(device)
    nodes, edges = 4, 13
    src, dst = _graph(generator, nodes, edges, device)
    x, Y, W = (torch.randn(*shape, generator=generator, dtype=torch.float64).to(device)
               for shape in ((nodes, theirs.irreps_in1.dim), (edges, 16), (edges, theirs.weight_numel)))
    ours_in = [t.to(dtype).requires_grad_() for t in (x, Y, W)]
    theirs_in = [t.clone().requires_grad_() for t in (x, Y, W)]
    a = ours(*ours_in, indices_1=src, indices_out=dst, size_out=nodes)
    b = torch.zeros(nodes, theirs.irreps_out.dim, dtype=torch.float64, device=device).index_add(
        0, dst, theirs(theirs_in[0][src], *theirs_in[1:]))
    tolerance = 1e-10 if dtype == torch.float64 else 1e-5
    assert a.dtype == dtype and _relative(a, b) < tolerance
    G = torch.randn(b.shape, generator=generator, dtype=torch.float64).to(device)
    # the force-training pattern: gradients with create_graph, then the backward of a function of them
    ga = torch.autograd.grad((a * G.to(dtype)).sum(), ours_in, create_graph=True)
    gb = torch.autograd.grad((b * G).sum(), theirs_in, create_graph=True)
    for p, q in zip(ga, gb):
        assert _relative(p, q) < tolerance
    H = [torch.randn(g.shape, generator=generator, dtype=torch.float64).to(device) for g in gb]
    gga = torch.autograd.grad(sum((g * h.to(dtype)).sum() for g, h in zip(ga, H)), ours_in)
    ggb = torch.autograd.grad(sum((g * h).sum() for g, h in zip(gb, H)), theirs_in)
    for p, q in zip(gga, ggb):
        assert _relative(p, q) < tolerance


@pytest.mark.parametrize("form", ["gather y", "no scatter", "prepared", "shared weights"])
def test_keyword_forms(generator, form, schedule):
    theirs, ours = _modules(torch.float64, "numba", shared_weights=form == "shared weights")
    nodes, edges = 5, 17
    src, dst = _graph(generator, nodes, edges, "cpu")
    x = torch.randn(nodes, theirs.irreps_in1.dim, generator=generator, dtype=torch.float64)
    Y = torch.randn(edges, 16, generator=generator, dtype=torch.float64)
    W = torch.randn(*(() if form == "shared weights" else (edges,)), theirs.weight_numel, generator=generator,
                    dtype=torch.float64)
    per_edge = theirs(x[src], Y, W)
    expected = torch.zeros(nodes, theirs.irreps_out.dim, dtype=torch.float64).index_add(0, dst, per_edge)
    if form == "gather y":
        Ynodes = torch.randn(3, 16, generator=generator, dtype=torch.float64)
        pick = torch.randint(0, 3, (edges,), generator=generator)
        got = ours(x, Ynodes, W, indices_1=src, indices_2=pick, indices_out=dst, size_out=nodes)
        per_edge = theirs(x[src], Ynodes[pick], W)
        expected = torch.zeros_like(expected).index_add(0, dst, per_edge)
    elif form == "no scatter":
        got, expected = ours(x, Y, W, indices_1=src), per_edge
    elif form == "prepared":
        got = ours(x, Y, W, indices_1=sa.Index(src, nodes), indices_out=sa.Index(dst, nodes), size_out=nodes)
    else:
        got = ours(x, Y, W, indices_1=src, indices_out=dst, size_out=nodes)
    assert _relative(got, expected) < 1e-12


def test_bad_keywords_raise_clear_errors(generator, schedule):
    theirs, ours = _modules(torch.float64, "numba")
    x = torch.randn(5, theirs.irreps_in1.dim, dtype=torch.float64)
    Y, W = torch.randn(7, 16, dtype=torch.float64), torch.randn(7, theirs.weight_numel, dtype=torch.float64)
    src, dst = torch.randint(0, 5, (7,)), torch.randint(0, 5, (7,))
    with pytest.raises(ValueError, match="size_out is required"):
        ours(x, Y, W, indices_1=src, indices_out=dst)
    with pytest.raises(IndexError, match="indices_1 contains row 5, out of range for size 5"):
        ours(x, Y, W, indices_1=src.clamp(max=0) + 5, indices_out=dst, size_out=5)
    with pytest.raises(IndexError, match="indices_out contains a negative row"):
        ours(x, Y, W, indices_1=src, indices_out=dst - 5, size_out=5)
    with pytest.raises(ValueError, match="with indices, x must be 2-D"):
        ours(x[None], Y, W, indices_1=src, indices_out=dst, size_out=5)
    with pytest.raises(TypeError, match="indices_out must have an integer dtype"):
        ours(x, Y, W, indices_1=src, indices_out=dst.float(), size_out=5)
    with pytest.raises(ValueError, match="without indices_out the output has one row per edge"):
        ours(x, Y, W, indices_1=src, size_out=5)
    with pytest.raises(ValueError, match="indices_out has 6 entries but indices_1 has 7"):
        ours(x, Y, W, indices_1=src, indices_out=dst[:6], size_out=5)
    with pytest.raises(ValueError, match="y has 6 rows but there are 7 edges"):  # the layer's names
        ours(x, Y[:6], W, indices_1=src, indices_out=dst, size_out=5)
    with pytest.raises(ValueError, match=r"reduction must be one of \('segment', 'atomic'\), got 'bogus'"):
        ours(x, Y, W, indices_1=src, indices_out=dst, size_out=5, reduction="bogus")


def test_the_schedule_follows_the_channel_count_and_the_gradients(monkeypatch):
    """On the numba kernels, plans of fewer channels than FUSED_MIN_CHANNELS run per edge, of twice as many or
    more fused; in between, per edge in a call that records no gradient, fused in one that does. The per-edge path
    is never taken on other implementations."""
    from sparse_accumulation.e3nn import tensor_product

    calls = []
    monkeypatch.setattr(TensorProduct, "_message_passing", lambda self, *a, **k: calls.append("fused") or
                        torch.zeros(0))
    monkeypatch.setattr(TensorProduct, "_per_edge", lambda self, *a, **k: calls.append("per edge") or torch.zeros(0))

    def module(channels, implementation="numba"):
        return TensorProduct(f"{channels}x0e", "0e", f"{channels}x0e", [(0, 0, 0, "uvu", True)],
                             shared_weights=False, internal_weights=False, implementation=implementation)

    limit = tensor_product.FUSED_MIN_CHANNELS
    small, middle, large, portable = module(limit // 2), module(limit), module(2 * limit), module(limit // 2, "torch")
    index = torch.zeros(3, dtype=torch.int64)
    for m in (small, middle, large, portable):
        for recording in (False, True):
            x, y = torch.randn(2, m.irreps_in1.dim, requires_grad=recording), torch.randn(3, 1)
            m(x, y, torch.randn(3, m.weight_numel), indices_1=index, indices_out=index, size_out=2)
    with torch.no_grad():
        x = torch.randn(2, middle.irreps_in1.dim, requires_grad=True)
        middle(x, y, torch.randn(3, middle.weight_numel), indices_1=index, indices_out=index, size_out=2)
    assert calls == ["per edge", "per edge", "per edge", "fused", "fused", "fused", "fused", "fused", "per edge"]


@pytest.mark.parametrize("weights", ["unweighted", "unweighted, per-row", "internal"])
def test_modules_without_weights_from_the_caller(generator, weights, schedule):
    """Unweighted and internal-weight products with indices equal e3nn's scattered product on either schedule
    (the per-edge one gets the weights as the caller gave them: none)."""
    weighted = weights == "internal"
    kwargs = {"shared_weights": None if weights == "unweighted" else weights == "internal",
              "internal_weights": True} if weighted else {
        "shared_weights": None if weights == "unweighted" else False}
    instructions = [(0, 0, 0, "uvu", weighted), (1, 1, 0, "uvu", weighted), (1, 0, 1, "uvu", weighted)]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        theirs = o3.TensorProduct("4x0e + 4x1o", "0e + 1o", "4x0e + 4x1o", instructions, **kwargs)
        ours = TensorProduct("4x0e + 4x1o", "0e + 1o", "4x0e + 4x1o", instructions, implementation="numba", **kwargs)
    finally:
        torch.set_default_dtype(previous)
    if weighted:
        ours.load_state_dict(theirs.state_dict(), strict=False)
    nodes, edges = 5, 11
    src, dst = _graph(generator, nodes, edges, "cpu")
    x = torch.randn(nodes, 16, generator=generator, dtype=torch.float64)
    Y = torch.randn(edges, 4, generator=generator, dtype=torch.float64)
    expected = torch.zeros(nodes, 16, dtype=torch.float64).index_add(0, dst, theirs(x[src], Y))
    got = ours(x, Y, indices_1=src, indices_out=dst, size_out=nodes)
    assert _relative(got, expected) < 1e-12
