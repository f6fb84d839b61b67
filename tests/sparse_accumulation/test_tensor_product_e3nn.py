"""sparse_accumulation.e3nn.TensorProduct against e3nn's o3.TensorProduct: outputs and gradients (x, y,
weights) for uvu and uuu instructions, shared, per-row and internal weights, every normalization, parities,
multiplicities, both layouts (e3nn's rows, used on CPU, and channels, used on CUDA); attributes, views, one
fused call and errors."""
import sys

import pytest
import torch

import sparse_accumulation  # noqa: F401  (registers the ops)

from accumulation_helpers import CountOps
from products_helpers import relative_error

o3 = pytest.importorskip("e3nn.o3")
from sparse_accumulation.e3nn import TensorProduct  # noqa: E402
from sparse_accumulation.e3nn.layout import gather, gather_weights, scatter  # noqa: E402

IMPLEMENTATIONS = ["numba", "torch"]
# None: the default, e3nn's rows on CPU tensors; "divisor": the channel layout CUDA tensors get, forced here
LAYOUTS = [None, "divisor"]


def uvu_instructions(irreps_in1, irreps_in2, irreps_out, has_weight=True):
    """Every allowed (i1, i2, i_out) path in mode uvu, as NequIP's convolution builds them."""
    irreps_in1, irreps_in2, irreps_out = o3.Irreps(irreps_in1), o3.Irreps(irreps_in2), o3.Irreps(irreps_out)
    return [(i1, i2, io, "uvu", has_weight)
            for i1, (_, ir1) in enumerate(irreps_in1) for i2, (_, ir2) in enumerate(irreps_in2)
            for io, (_, ir_out) in enumerate(irreps_out) if ir_out in ir1 * ir2]


def pair(*args, implementation="torch", layout=None, **kwargs):
    """e3nn's TensorProduct and ours from the same arguments (float64 coefficients; ours gets e3nn's internal
    weights); ``layout="divisor"`` makes ours use the channel layout on CPU too."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn computes its 3j symbols in the default dtype
    try:
        theirs = o3.TensorProduct(*args, **kwargs)
        ours = TensorProduct(*args, implementation=implementation, **kwargs)
        if layout == "divisor":
            ours = TensorProduct(*args, implementation=implementation, channels=ours.channels, **kwargs)
    finally:
        torch.set_default_dtype(previous)
    if theirs.internal_weights and theirs.weight_numel:
        with torch.no_grad():
            ours.weight.copy_(theirs.weight)
    return theirs, ours


def inputs(generator, theirs, lead_x=(6,), lead_y=(6,), lead_w=(6,)):
    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    x, y = randn(*lead_x, theirs.irreps_in1.dim), randn(*lead_y, theirs.irreps_in2.dim)
    if theirs.internal_weights or not theirs.weight_numel:
        return x, y, None
    return x, y, randn(*(() if theirs.shared_weights else lead_w), theirs.weight_numel)


def assert_same_values_and_gradients(generator, theirs, ours, x, y, weight, tolerance=1e-12):
    expected = theirs(x, y, weight)
    out = ours(x, y, weight)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert relative_error(out, expected) < tolerance
    G = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    leaves = [t for t in (x, y, weight) if t is not None]
    expected_grads = torch.autograd.grad((expected * G).sum(), leaves + [theirs.weight] * theirs.internal_weights)
    grads = torch.autograd.grad((out * G).sum(), leaves + [ours.weight] * ours.internal_weights)
    for name, a, b in zip(("x", "y", "weight"), grads, expected_grads):
        assert relative_error(a, b) < tolerance, name


NEQUIP = ("4x0e + 4x1o + 4x2e", "0e + 1o + 2e + 3o", "4x0e + 4x1o + 4x2e")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_nequip_convolution_per_edge_weights(generator, implementation, layout):
    """NequIP's convolution at small size: all uvu paths, per-edge weights from a radial network."""
    instructions = uvu_instructions(*NEQUIP)
    assert len(instructions) == 13
    theirs, ours = pair(*NEQUIP, instructions, shared_weights=False, internal_weights=False,
                        implementation=implementation, layout=layout)
    assert ours.weight_numel == theirs.weight_numel == 13 * 4
    rule = ours.rule_for("cpu")
    assert ours.channels == 4 and rule.weighted
    # rows: e3nn's tensors as they are; channels: per channel 0e + 1o + 2e in, the 16 harmonics, 13 weights
    sizes = (36, 16, 36, 52) if layout is None else (9, 16, 9, 13)
    assert (*rule.input_sizes, rule.output_size, rule.weight_size) == sizes
    assert_same_values_and_gradients(generator, theirs, ours, *inputs(generator, theirs))


@pytest.mark.parametrize("shared_weights,internal_weights", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("mode", ["uvu", "uuu"])
def test_weights_shared_internal_and_per_row(generator, mode, shared_weights, internal_weights):
    irreps = "3x0e + 3x1o + 2x1e + 3x2e"
    irreps2 = irreps if mode == "uuu" else "0e + 1o + 2e"
    muls, muls2 = [mul for mul, _ in o3.Irreps(irreps)], [mul for mul, _ in o3.Irreps(irreps2)]
    instructions = [(i1, i2, io, mode, True) for i1, i2, io, *_ in uvu_instructions(irreps, irreps2, irreps)
                    if muls[i1] == muls[io] and (mode == "uvu" or muls2[i2] == muls[io])]
    assert len(instructions) >= 6
    theirs, ours = pair(irreps, irreps2, irreps, instructions, shared_weights=shared_weights,
                        internal_weights=internal_weights)
    assert (ours.shared_weights, ours.internal_weights) == (theirs.shared_weights, theirs.internal_weights)
    assert ours.channels == 1  # gcd(3, 2): one plan
    assert ours.rule_for("cpu") is ours.rule_for("cuda")
    assert_same_values_and_gradients(generator, theirs, ours, *inputs(generator, theirs))


@pytest.mark.parametrize("path_normalization", ["element", "path", "none"])
@pytest.mark.parametrize("irrep_normalization", ["component", "norm", "none"])
def test_normalizations(generator, irrep_normalization, path_normalization):
    irreps_in1, irreps_in2, irreps_out = "2x0e + 2x1o + 2x2e", "2x0e + 1x1o + 1x2e", "2x0e + 2x1o + 2x1e + 2x2e"
    instructions = uvu_instructions(irreps_in1, irreps_in2, irreps_out)
    theirs, ours = pair(irreps_in1, irreps_in2, irreps_out, instructions, irrep_normalization=irrep_normalization,
                        path_normalization=path_normalization, shared_weights=False)
    for a, b in zip(ours.instructions, theirs.instructions):
        assert a.path_weight == pytest.approx(b.path_weight, rel=1e-14)
        assert tuple(a) == (*b[:5], a.path_weight, b.path_shape)
    assert_same_values_and_gradients(generator, theirs, ours, *inputs(generator, theirs))


def test_variances_path_weights_and_unweighted_instructions(generator):
    """in1_var / in2_var / out_var, a sixth path_weight entry, instructions without weights among weighted ones
    (they read a column of ones), uvu with mul2 > 1 and pseudo-tensor outputs."""
    irreps_in1, irreps_in2, irreps_out = "4x0e + 8x1o", "3x0e + 2x1o", "4x0e + 8x1o + 8x1e + 2x0o"
    instructions = [(0, 0, 0, "uvu", True), (1, 1, 2, "uvu", True, 3.0), (1, 0, 1, "uvu", False),
                    (1, 1, 2, "uvu", False, 0.5)]
    theirs, ours = pair(irreps_in1, irreps_in2, irreps_out, instructions, in1_var=[2.0, 3.0], in2_var=[0.5, 4.0],
                        out_var=[1.0, 2.0, 3.0, 4.0], shared_weights=False)
    # per channel: q * mul2 weights of each weighted instruction (q = mul1 / 4), then the column of ones
    assert ours.channels == 4 and ours.rule_for("cuda").weight_size == 1 * 3 + 2 * 2 + 1
    assert_same_values_and_gradients(generator, theirs, ours, *inputs(generator, theirs))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_uuu_and_uvu_together_with_sub_blocks_and_unused_irreps(generator, layout):
    """Mixed modes (the second input split into channels and shared), multiplicities 4 and 8 (two sub-blocks per
    channel), a zero-multiplicity irrep, an input irrep no instruction reads and an output irrep none writes."""
    irreps_in1, irreps_in2 = "4x0e + 8x1o + 0x2e + 4x1e", "4x0e + 8x1o"
    irreps_out = "4x0e + 8x1o + 8x1e + 2x0o"
    instructions = [(0, 0, 0, "uuu", True), (1, 1, 2, "uvu", True), (1, 1, 2, "uuu", False),
                    (1, 0, 1, "uvu", True), (2, 1, 1, "uvu", True)]
    theirs, ours = pair(irreps_in1, irreps_in2, irreps_out, instructions, shared_weights=False, layout=layout)
    assert ours.channels == 4 and ours.weight_numel == theirs.weight_numel == 4 + 8 * 8 + 8 * 4 + 0
    assert_same_values_and_gradients(generator, theirs, ours, *inputs(generator, theirs))


def test_without_any_weights(generator):
    irreps = "2x0e + 2x1o"
    instructions = [(i1, i2, io, "uuu", False) for i1, i2, io, *_ in uvu_instructions(irreps, irreps, irreps)]
    theirs, ours = pair(irreps, irreps, irreps, instructions)
    assert ours.weight_numel == 0 and not ours.internal_weights and not ours.rule_for("cpu").weighted
    assert_same_values_and_gradients(generator, theirs, ours, *inputs(generator, theirs))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_leading_dimensions_broadcast(generator, layout):
    instructions = uvu_instructions(*NEQUIP)
    theirs, ours = pair(*NEQUIP, instructions, shared_weights=False, layout=layout)
    x, y, weight = inputs(generator, theirs, lead_x=(2, 5), lead_y=(5,), lead_w=(2, 1))
    assert_same_values_and_gradients(generator, theirs, ours, x, y, weight)
    x, y, weight = inputs(generator, theirs, lead_x=(), lead_y=(3,), lead_w=(3,))
    assert_same_values_and_gradients(generator, theirs, ours, x, y, weight)


def test_weight_views_and_repr(generator):
    instructions = uvu_instructions(*NEQUIP)
    theirs, ours = pair(*NEQUIP, instructions, shared_weights=False)
    weight = torch.randn(3, theirs.weight_numel, generator=generator, dtype=torch.float64)
    for (i, ins, view), (j, their_ins, their_view) in zip(ours.weight_views(weight, yield_instruction=True),
                                                         theirs.weight_views(weight, yield_instruction=True)):
        assert i == j and ins.path_shape == their_ins.path_shape and torch.equal(view, their_view)
    assert repr(ours).replace("TensorProduct", "") == repr(theirs).replace("TensorProduct", "")
    assert ours.irreps_in1 == theirs.irreps_in1 and ours.irreps_out == theirs.irreps_out


def test_what_is_read_in_place():
    """Rows: x, the weights and the output are e3nn's tensors themselves. Channels (uvu with one v and equal
    multiplicities): the weights are a transposed view, x and the output one copy each."""
    ours = TensorProduct(*NEQUIP, uvu_instructions(*NEQUIP), shared_weights=False)
    x, weight = torch.randn(5, 36), torch.randn(5, ours.weight_numel)
    rows, channels = ours._row_plan, ours._channel_plan
    assert rows.y is None and channels.y is None  # uvu: y[..., None, :] in both
    assert gather(x, rows.x).data_ptr() == x.data_ptr() and gather(x, rows.x).shape == (5, 1, 36)
    assert gather_weights(weight, rows.weights).data_ptr() == weight.data_ptr()
    out = torch.randn(5, 1, 36)
    assert scatter(out, rows.out).data_ptr() == out.data_ptr()
    W = gather_weights(weight, channels.weights)
    assert W.shape == (5, 4, 13) and W.data_ptr() == weight.data_ptr()
    assert torch.equal(W[:, 2, 7], weight[:, 7 * 4 + 2])  # instruction 7, multiplicity u = 2
    X = gather(x, channels.x)
    assert X.shape == (5, 4, 9) and torch.equal(X[:, 2, 1:4], x[:, 4 + 2 * 3:4 + 3 * 3])  # 1o of u = 2
    assert torch.equal(scatter(X, channels.x), x)


def test_relayout_gradients_to_second_order(generator):
    """The copies into and out of the channel layout (a shared segment included) have exact gradients."""
    ours = TensorProduct("4x0e + 8x1o", "4x0e + 8x1o", "4x0e + 8x1o + 8x1e",
                         [(0, 0, 0, "uuu", True), (1, 1, 2, "uvu", True), (1, 1, 2, "uuu", False)], channels=4)
    plan = ours._channel_plan
    assert any(s.shared for s in plan.y.segments)
    y = torch.randn(3, 28, generator=generator, dtype=torch.float64, requires_grad=True)
    G = torch.randn(3, 4, plan.y.width, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gather(t, plan.y), (y,))
    assert torch.autograd.gradgradcheck(lambda t: gather(t, plan.y), (y,))
    assert torch.autograd.gradcheck(lambda t: scatter(t, plan.y), (G,))


def test_indexed_relayout_equals_the_block_copies(generator, monkeypatch):
    """A layout holding every column once is copied with one indexed copy; it equals the per-block copies
    (the path of layouts with shared segments), both ways, with exact gradients."""
    from sparse_accumulation.e3nn import layout as e3nn_layout

    ours = TensorProduct(*NEQUIP, uvu_instructions(*NEQUIP), shared_weights=False)
    layout = ours._channel_plan.x
    assert e3nn_layout._permutation(layout, torch.device("cpu"), False) is not None
    x = torch.randn(7, 36, generator=generator, dtype=torch.float64, requires_grad=True)
    X = torch.randn(7, 4, layout.width, generator=generator, dtype=torch.float64, requires_grad=True)
    indexed = gather(x, layout), scatter(X, layout)
    monkeypatch.setattr(e3nn_layout, "_indexed_copy", lambda t, layout, to_e3nn: None)
    blocks = gather(x, layout), scatter(X, layout)
    for a, b in zip(indexed, blocks):
        assert torch.equal(a, b)
    monkeypatch.undo()
    assert torch.autograd.gradgradcheck(lambda t: gather(t, layout), (x,))
    assert torch.autograd.gradgradcheck(lambda t: scatter(t, layout), (X,))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_fused_call_forward_and_backward(generator, layout):
    theirs, ours = pair(*NEQUIP, uvu_instructions(*NEQUIP), shared_weights=False, layout=layout)
    x, y, weight = inputs(generator, theirs)
    with CountOps() as forward:
        out = ours(x, y, weight)
    assert forward.calls == ["accumulate"]
    with CountOps() as backward:
        out.sum().backward()
    assert backward.calls == ["accumulate_backward"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradgradcheck(generator, layout):
    theirs, ours = pair("2x0e + 2x1o", "0e + 1o", "2x0e + 2x1o + 2x1e",
                        uvu_instructions("2x0e + 2x1o", "0e + 1o", "2x0e + 2x1o + 2x1e"), shared_weights=False,
                        layout=layout)
    x, y, weight = inputs(generator, theirs, lead_x=(3,), lead_y=(3,), lead_w=(3,))
    assert torch.autograd.gradcheck(ours, (x, y, weight))
    assert torch.autograd.gradgradcheck(ours, (x, y, weight))


def test_float32(generator):
    theirs, ours = pair(*NEQUIP, uvu_instructions(*NEQUIP), shared_weights=False)
    x, y, weight = (t.detach().float() for t in inputs(generator, theirs))
    out = ours.float()(x, y, weight)
    assert out.dtype == torch.float32
    assert relative_error(out, theirs(x.double(), y.double(), weight.double())) < 1e-5


def test_errors(generator, monkeypatch):
    irreps = "2x0e + 2x1o"
    for mode in ("uvw", "u<vw"):
        with pytest.raises(AssertionError, match="needs weights"):
            TensorProduct(irreps, irreps, irreps, [(0, 0, 0, mode, False)])
    for mode, muls in (("uvv", (2, 3, 2)), ("uuw", (2, 3, 2)), ("uvuv", (2, 2, 2)), ("uvu<v", (3, 3, 2))):
        with pytest.raises(AssertionError, match="multiplicit"):
            TensorProduct(*(f"{m}x0e" for m in muls), [(0, 0, 0, mode, True)])
    with pytest.raises(AssertionError, match="multiplicity 1 in out"):
        TensorProduct("2x0e", "2x0e", "2x0e", [(0, 0, 0, "uuw", False)])
    with pytest.raises(ValueError, match="unknown mode"):
        TensorProduct(irreps, irreps, irreps, [(0, 0, 0, "vvv", True)])
    with pytest.raises(ValueError, match="cannot give"):
        TensorProduct(irreps, irreps, irreps, [(0, 1, 0, "uvu", True)])  # 0e x 1o -> 0e: wrong degree
    with pytest.raises(ValueError, match="i_out"):
        TensorProduct(irreps, irreps, irreps, [(0, 0, 2, "uvu", True)])
    with pytest.raises(ValueError, match="multiplicity"):
        TensorProduct("2x0e", "3x0e", "2x0e", [(0, 0, 0, "uuu", True)])
    with pytest.raises(ValueError, match="irrep_normalization"):
        TensorProduct(irreps, irreps, irreps, [], irrep_normalization="unit")
    with pytest.raises(ValueError, match="path_normalization"):
        TensorProduct(irreps, irreps, irreps, [], path_normalization="paths")
    with pytest.raises(ValueError, match="internal_weights=True needs shared_weights"):
        TensorProduct(irreps, irreps, irreps, [(0, 0, 0, "uvu", True)], internal_weights=True, shared_weights=False)
    with pytest.raises(ValueError, match="in1_var"):
        TensorProduct(irreps, irreps, irreps, [], in1_var=[1.0])
    with pytest.raises(ValueError, match="channels=3 must divide 2"):
        TensorProduct(irreps, irreps, irreps, [(0, 0, 0, "uvu", True)], channels=3)
    with pytest.raises(ValueError, match="positive int"):
        TensorProduct(irreps, irreps, irreps, [(0, 0, 0, "uvu", True)], channels=True)
    tp = TensorProduct(irreps, "0e", irreps, [(0, 0, 0, "uvu", True)], shared_weights=False)
    x, y = torch.randn(3, 8), torch.randn(3, 1)
    with pytest.raises(ValueError, match="weight is required"):
        tp(x, y)
    with pytest.raises(ValueError, match=r"weight must be \[\.\.\., 2\]"):
        tp(x, y, torch.randn(2))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 8\]"):
        tp(torch.randn(3, 7), y, torch.randn(3, 2))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        tp(x, y, torch.randn(3, 2).numpy())
    monkeypatch.setitem(sys.modules, "e3nn", None)
    with pytest.raises(ImportError, match="needs the e3nn package"):
        TensorProduct(irreps, irreps, irreps, [])


def test_nothing_to_compute_gives_zeros(generator):
    theirs, ours = pair("2x0e + 0x1o", "0e", "2x0e + 3x1o", [(1, 0, 1, "uvu", True)])
    x, y = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    out = ours(x, y)
    assert ours.rule_for("cpu") is None and ours.weight_numel == 0 and out.shape == (4, 11)
    assert torch.equal(out, theirs(x, y)) and not out.any()


TRITON_CHECK = """
import torch
from e3nn import o3
from sparse_accumulation.e3nn import TensorProduct
torch.set_default_dtype(torch.float64)
irreps, sh = "4x0e + 4x1o + 4x2e", "0e + 1o + 2e + 3o"
i1, i2 = o3.Irreps(irreps), o3.Irreps(sh)
instructions = [(a, b, c, "uvu", True) for a, (_, r1) in enumerate(i1) for b, (_, r2) in enumerate(i2)
                for c, (_, r) in enumerate(i1) if r in r1 * r2]
theirs = o3.TensorProduct(irreps, sh, irreps, instructions, shared_weights=False)
ours = TensorProduct(irreps, sh, irreps, instructions, shared_weights=False, implementation="triton")
assert ours.rule_for("cpu").input_sizes == (9, 16)  # the channel layout, as on CUDA
x, y = i1.randn(40, -1, requires_grad=True), i2.randn(40, -1, requires_grad=True)
w = torch.randn(40, theirs.weight_numel, requires_grad=True)
a, b = theirs(x, y, w), ours(x, y, w)
assert (a - b).abs().max() < 1e-12 * a.abs().max()
for g, h in zip(torch.autograd.grad(a.pow(2).sum(), (x, y, w)), torch.autograd.grad(b.pow(2).sum(), (x, y, w))):
    assert (g - h).abs().max() < 1e-12 * g.abs().max()
print("ok")
"""


@pytest.mark.slow
def test_triton_kernels_interpreted_match_e3nn():
    """The channel layout through the Triton kernels (interpreted on CPU, in a process of its own)."""
    pytest.importorskip("triton")
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    environment = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    result = subprocess.run([sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True, env=environment,
                            cwd=root, timeout=600)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cuda_matches_e3nn(generator, dtype):
    """On CUDA tensors (the channel layout, the default kernels): values and gradients of the NequIP case."""
    theirs, ours = pair(*NEQUIP, uvu_instructions(*NEQUIP), shared_weights=False, implementation=None)
    theirs, ours = theirs.to("cuda", dtype), ours.to("cuda", dtype)  # both compute in dtype, as e3nn asks
    assert ours.rule_for("cuda").input_sizes == (9, 16)
    x, y, weight = (t.detach().to("cuda", dtype).requires_grad_() for t in inputs(generator, theirs, lead_x=(300,),
                                                                                   lead_y=(300,), lead_w=(300,)))
    expected = theirs(x, y, weight)
    out = ours(x, y, weight)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert relative_error(out, expected) < tolerance
    G = torch.randn_like(expected)
    for a, b in zip(torch.autograd.grad((out * G).sum(), (x, y, weight)),
                    torch.autograd.grad((expected * G).sum(), (x, y, weight))):
        assert relative_error(a, b) < tolerance


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_compile_fullgraph(generator, layout):
    """The module compiles without graph breaks (the relayout of the channel layout included)."""
    theirs, ours = pair("2x0e + 2x1o", "0e + 1o", "2x0e + 2x1o + 2x1e",
                        uvu_instructions("2x0e + 2x1o", "0e + 1o", "2x0e + 2x1o + 2x1e"), shared_weights=False,
                        layout=layout)
    x, y, weight = inputs(generator, theirs)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    out = compiled(x, y, weight)
    expected = theirs(x, y, weight)
    assert relative_error(out, expected) < 1e-12
    grads = torch.autograd.grad(out.pow(2).sum(), (x, y, weight))
    for a, b in zip(grads, torch.autograd.grad(expected.pow(2).sum(), (x, y, weight))):
        assert relative_error(a, b) < 1e-12


@pytest.mark.parametrize("indices", [False, True], ids=["rows", "message passing"])
def test_errors_name_the_callers_arguments(generator, indices):
    """A dtype or device that does not fit is reported with the names the caller used (x, y, weight, the
    module), whichever path the call takes."""
    tp = TensorProduct("4x0e + 4x1o", "0e + 1o", "4x0e + 4x1o",
                       [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (1, 0, 1, "uvu", True)],
                       shared_weights=False, internal_weights=False)
    nodes, edges = 5, 9
    x = torch.randn(nodes if indices else edges, 16, generator=generator, dtype=torch.float64)
    y = torch.randn(edges, 4, generator=generator, dtype=torch.float64)
    w = torch.randn(edges, tp.weight_numel, generator=generator, dtype=torch.float64)
    keywords = {"indices_1": torch.randint(0, nodes, (edges,), generator=generator),
                "indices_out": torch.randint(0, nodes, (edges,), generator=generator), "size_out": nodes} \
        if indices else {}
    with pytest.raises(TypeError, match=r"x has dtype torch.float64 but this TensorProduct computes in "
                                        r"torch.float32 .*convert the module \(.to\(torch.float64\)\) or the data"):
        tp(x, y, w, **keywords)  # as e3nn's, which cannot mix dtypes either
    tp = tp.double()
    assert tp(x, y, w, **keywords).dtype == torch.float64
    with pytest.raises(TypeError, match=r"weight has dtype torch.float32 but x has dtype torch.float64"):
        tp(x, y, w.float(), **keywords)
    with pytest.raises(TypeError, match=r"y has dtype torch.float32 but x has dtype torch.float64"):
        tp(x, y.float(), w, **keywords)
    with pytest.raises(ValueError, match=r"weight is on meta but x is on cpu"):
        tp(x, y, w.to("meta"), **keywords)
    with pytest.raises(ValueError, match=r"this TensorProduct's tensors are on cpu but x is on meta: move the "
                                         r"module to the data's device \(tp.to\('meta'\)\)"):
        tp(x.to("meta"), y.to("meta"), w.to("meta"), **keywords)
