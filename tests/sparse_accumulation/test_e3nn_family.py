"""Every e3nn instruction mode and e3nn's products of fixed instructions (FullyConnectedTensorProduct,
ElementwiseTensorProduct, FullTensorProduct, TensorSquare) against e3nn's own modules in float64: outputs,
gradients and second derivatives, right(), message passing, state dicts both ways, weight views, list weights,
e3nn's constructor keywords and TorchScript."""
import io
from typing import NamedTuple

import pytest
import torch

import sparse_accumulation  # noqa: F401  (registers the ops)

o3 = pytest.importorskip("e3nn.o3")
import sparse_accumulation.e3nn as ours  # noqa: E402

MODES = ["uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw"]


def mode_case(mode, weighted):
    """Irreps and instructions of one mode: three instructions, two into one output irrep."""
    mul_out = {"uvuv": 9, "uvu<v": 3}.get(mode, 1 if mode == "uuw" and not weighted else 3)
    instructions = [(1, 0, 0, mode, weighted), (1, 1, 1, mode, weighted), (0, 1, 0, mode, weighted, 0.7)]
    return "3x0e + 3x1o + 2x2e", "3x0e + 3x1o", f"{mul_out}x1o + {mul_out}x0e", instructions


def cases():
    for mode in MODES:
        for weighted in (True, False):
            if mode in ("uvw", "u<vw") and not weighted:
                continue
            for shared in (True, False):
                yield mode, weighted, shared


def derivatives(out, inputs):
    """The output, the gradients of ``sum(out^2)`` and the gradients of ``sum(sin(those gradients))``."""
    grads = torch.autograd.grad(out.pow(2).sum(), inputs, create_graph=True)
    second = torch.autograd.grad(sum(g.sin().sum() for g in grads), inputs)
    return [out, *grads, *second]


@pytest.fixture(autouse=True)
def float64():
    """e3nn's modules made in float64 (its 3j symbols computed in the default dtype)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(default)


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())


@pytest.mark.parametrize("mode, weighted, shared", list(cases()))
def test_modes_to_second_order(mode, weighted, shared, generator):
    *irreps, instructions = mode_case(mode, weighted)
    theirs = o3.TensorProduct(*irreps, instructions, shared_weights=shared)
    tp = ours.TensorProduct(*irreps, instructions, shared_weights=shared, dtype=torch.float64)
    tp.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(4, tp.irreps_in1.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    y = torch.randn(4, tp.irreps_in2.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    inputs = [x, y]
    weight = None
    if not shared and weighted:
        weight = torch.randn(4, tp.weight_numel, dtype=torch.float64, generator=generator, requires_grad=True)
        inputs.append(weight)
    elif weighted:
        inputs.append(tp.weight)
    expected = derivatives(theirs(x, y, weight), inputs[:2] + ([weight] if weight is not None else []))
    got = derivatives(tp(x, y, weight), inputs[:2] + ([weight] if weight is not None else []))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    right = tp.right(y, weight)
    assert right.shape == (4, tp.irreps_in1.dim, tp.irreps_out.dim)
    torch.testing.assert_close(torch.einsum("zik,zi->zk", right, x), got[0], rtol=1e-10, atol=1e-10)


def check_message_passing(tp, generator, nodes, edges):
    """Message passing with per-edge weights against the product of gathered rows summed by destination, to
    second order; returns ``(out, x, y, weight, source, target)``."""
    x = torch.randn(nodes, tp.irreps_in1.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    y = torch.randn(edges, tp.irreps_in2.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(edges, tp.weight_numel, dtype=torch.float64, generator=generator, requires_grad=True)
    source, target = (torch.randint(0, nodes, (edges,), generator=generator) for _ in range(2))
    out = tp(x, y, weight, indices_1=source, indices_out=target, size_out=nodes)
    expected = torch.zeros(nodes, tp.irreps_out.dim, dtype=torch.float64).index_add(0, target, tp(x[source], y, weight))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(derivatives(out, [x, y, weight]), derivatives(expected, [x, y, weight]), rtol=1e-10,
                               atol=1e-10)
    return out, x, y, weight, source, target


@pytest.mark.parametrize("mode", MODES)
def test_message_passing_every_mode(mode, generator):
    *irreps, instructions = mode_case(mode, True)
    tp = ours.TensorProduct(*irreps, instructions, shared_weights=False, dtype=torch.float64)
    check_message_passing(tp, generator, nodes=5, edges=12)


SUBCLASSES = [
    ("FullyConnectedTensorProduct", ("2x0e + 1x1o + 2x2e", "1x0e + 2x1o", "3x0e + 2x1o + 1x2e"), {}),
    ("FullyConnectedTensorProduct", ("2x0e + 1x1o", "1x0e + 2x1o", "3x0e + 2x1o"),
     {"shared_weights": False, "path_normalization": "path"}),
    ("ElementwiseTensorProduct", ("3x0e + 2x1o", "1x0e + 4x1e"), {}),
    ("ElementwiseTensorProduct", ("3x0e + 2x1o", "1x0e + 4x1e"), {"filter_ir_out": ["1e", "0o"]}),
    ("FullTensorProduct", ("2x0e + 1x1o", "2x1o + 1x2e"), {}),
    ("FullTensorProduct", ("2x0e + 1x1o", "2x1o + 1x2e"), {"filter_ir_out": ["1o"], "irrep_normalization": "norm"}),
    ("TensorSquare", ("2x0e + 3x1o + 1x2e",), {}),
    ("TensorSquare", ("2x0e + 3x1o + 1x2e",), {"irrep_normalization": "norm", "filter_ir_out": ["0e", "2e"]}),
    ("TensorSquare", ("2x0e + 3x1o + 1x2e", "2x0e + 1x1e + 2x2e"), {}),
]


@pytest.mark.parametrize("name, args, kwargs", SUBCLASSES)
def test_subclasses(name, args, kwargs, generator):
    theirs = getattr(o3, name)(*args, **kwargs)
    tp = getattr(ours, name)(*args, **kwargs, dtype=torch.float64)
    assert (tp.irreps_in1, tp.irreps_in2, tp.irreps_out) == (theirs.irreps_in1, theirs.irreps_in2, theirs.irreps_out)
    assert len(tp.instructions) == len(theirs.instructions)
    for mine, other in zip(tp.instructions, theirs.instructions):
        assert (mine.i_in1, mine.i_in2, mine.i_out, mine.connection_mode, mine.has_weight, tuple(mine.path_shape)) == \
            (other.i_in1, other.i_in2, other.i_out, other.connection_mode, other.has_weight, tuple(other.path_shape))
        assert mine.path_weight == pytest.approx(other.path_weight)
    assert repr(tp) == repr(theirs) and tp.weight_numel == theirs.weight_numel
    tp.load_state_dict(theirs.state_dict(), strict=True)
    theirs.load_state_dict(tp.state_dict(), strict=False)  # e3nn's holds its generated code's constants too
    torch.testing.assert_close(theirs.weight, tp.weight)
    x = torch.randn(3, tp.irreps_in1.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    y = torch.randn(3, tp.irreps_in2.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = None
    if kwargs.get("shared_weights") is False:
        weight = torch.randn(3, tp.weight_numel, dtype=torch.float64, generator=generator)
    if name == "TensorSquare":
        got, expected = derivatives(tp(x), [x]), derivatives(theirs(x), [x])
    else:
        got, expected = derivatives(tp(x, y, weight), [x, y]), derivatives(theirs(x, y, weight), [x, y])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_weight_views_lists_and_keywords(generator):
    irreps = "1e + 2e + 3x3o"
    with pytest.warns(DeprecationWarning):
        tp = ours.FullyConnectedTensorProduct(irreps, irreps, irreps, compile_left_right=False, compile_right=True,
                                              normalization="norm", _specialized_code=False, _optimize_einsums=False,
                                              dtype=torch.float64)
    assert tp.irrep_normalization == "norm" and not tp._specialized_code and not tp._optimize_einsums
    theirs = o3.FullyConnectedTensorProduct(irreps, irreps, irreps, irrep_normalization="norm")
    theirs.load_state_dict(tp.state_dict(), strict=False)
    for index, ins in enumerate(tp.instructions):
        torch.testing.assert_close(tp.weight_view_for_instruction(index), theirs.weight_view_for_instruction(index))
    views = list(tp.weight_views())
    x = torch.randn(2, tp.irreps_in1.dim, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(tp(x, x, [v.clone() for v in views]), theirs(x, x))
    with torch.no_grad():
        for view in views:
            view.zero_()
    assert torch.all(tp(x, x) == 0)
    no_weights = ours.TensorProduct("2x0e", "2x0e", "2x0e", [(0, 0, 0, "uvu", False)])
    with pytest.raises(ValueError, match="has no weights"):
        no_weights.weight_view_for_instruction(0)


@pytest.mark.parametrize("mode", ["uvw", "uvuv", "u<vw"])
def test_torchscript(mode, generator):
    *irreps, instructions = mode_case(mode, True)
    tp = ours.TensorProduct(*irreps, instructions, dtype=torch.float64)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(tp), buffer)
    buffer.seek(0)
    scripted = torch.jit.load(buffer)
    x = torch.randn(3, tp.irreps_in1.dim, dtype=torch.float64, generator=generator)
    y = torch.randn(3, tp.irreps_in2.dim, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(scripted(x, y), tp(x, y))
    torch.testing.assert_close(scripted.right(y), tp.right(y))


def test_large_expanded_modes_are_refused_with_a_clear_error():
    from sparse_accumulation.e3nn.layout import MAX_EXPANDED_TERMS

    # "u<vw" is expanded path by path: 200 * 199 / 2 * 200 paths of 0e x 0e -> 0e, one term each
    assert 200 * 199 // 2 * 200 > MAX_EXPANDED_TERMS
    with pytest.raises(NotImplementedError, match="expand to more than"):
        ours.TensorProduct("200x0e", "200x0e", "200x0e", [(0, 0, 0, "u<vw", True)])
    ours.TensorProduct("30x0e", "30x0e", "30x0e", [(0, 0, 0, "u<vw", True)])  # 13050 terms: made


FACTORED = [
    # every instruction factored ("uvw" of 16 * 16 * 16 paths), shared weights
    ("FullyConnectedTensorProduct", ("16x0e + 16x1o + 16x2e",) * 3, {}),
    # per-row weights, factored instructions beside expanded ones (4 * 4 * 4 paths)
    ("FullyConnectedTensorProduct", ("12x0e + 4x1o", "10x0e + 4x1e", "8x0e + 4x1o"), {"shared_weights": False}),
    # an expanded instruction (2 * 2 * 2 paths) before factored ones: their weights lie after its weights
    ("FullyConnectedTensorProduct", ("2x0e + 16x1o",) * 3, {}),
]
# "uuw" of 16 * 16 paths (two of them from one pair of inputs) beside a "uvu" instruction writing the first output
# irrep, which the factored part leaves to the kernels; shared and per-row weights
UUW = ("16x0e + 16x1o + 8x2e", "16x0e + 16x1o", "8x2e + 16x0e + 16x1o + 16x2e",
       [(0, 0, 1, "uuw", True), (1, 1, 1, "uuw", True), (1, 1, 3, "uuw", True), (0, 1, 2, "uuw", True),
        (2, 0, 0, "uvu", True)])
FACTORED += [("TensorProduct", UUW, {}), ("TensorProduct", UUW, {"shared_weights": False})]


@pytest.mark.parametrize("name, args, kwargs", FACTORED)
def test_large_uvw_and_uuw_instructions_are_factored_and_equal_to_e3nn_to_second_order(name, args, kwargs,
                                                                                      generator):
    from sparse_accumulation.ops.factored import FACTORED_MIN_PATHS, FACTORED_MIN_UUW_PATHS, MODES

    theirs = getattr(o3, name)(*args, **kwargs)
    tp = getattr(ours, name)(*args, **kwargs, dtype=torch.float64)
    assert tp._factored_specs
    for spec in tp._factored_specs:
        mode = MODES[spec[11]]
        paths = spec[1] * spec[7] * (spec[4] if mode == "uvw" else 1)
        assert paths >= (FACTORED_MIN_PATHS if mode == "uvw" else FACTORED_MIN_UUW_PATHS)
    tp.load_state_dict(theirs.state_dict(), strict=True)
    rows = 5
    x = torch.randn(rows, tp.irreps_in1.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    y = torch.randn(rows, tp.irreps_in2.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    if kwargs.get("shared_weights") is False:
        weight = torch.randn(rows, tp.weight_numel, dtype=torch.float64, generator=generator, requires_grad=True)
        inputs, call = [x, y, weight], (x, y, weight)
    else:
        weight = tp.weight
        inputs, call = [x, y, tp.weight], (x, y)
    got = derivatives(tp(*call), inputs)
    expected = derivatives(theirs(*call[:2], *([] if weight is tp.weight else [weight])),
                           inputs[:2] + ([theirs.weight] if weight is tp.weight else [weight]))
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    # broadcasting leading dimensions, as e3nn's
    x3 = torch.randn(2, 1, tp.irreps_in1.dim, dtype=torch.float64, generator=generator)
    y3 = torch.randn(1, 3, tp.irreps_in2.dim, dtype=torch.float64, generator=generator)
    w3 = None if weight is tp.weight else torch.randn(2, 3, tp.weight_numel, dtype=torch.float64,
                                                      generator=generator)
    torch.testing.assert_close(tp(x3, y3, w3), theirs(x3, y3, w3), rtol=1e-10, atol=1e-10)


def _saved_bytes(function) -> int:
    """Bytes of the tensors autograd keeps for the backward while ``function()`` runs (each storage once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        function()
    return sum(storages.values())


class _Chunked(NamedTuple):
    theirs: torch.nn.Module
    tp: torch.nn.Module
    per_row: int
    rows: int
    x: torch.Tensor
    y: torch.Tensor
    weight: torch.Tensor
    shared: bool

    def call(self, module, a, b):
        return module(a, b) if self.shared else module(a, b, self.weight)


def _chunked_case(name, args, kwargs, generator, rows=23) -> _Chunked:
    """e3nn's module and ours with its weights (float64), the bytes of our intermediates per row, and random
    inputs of ``rows`` rows (per-row weights where the module has no shared ones)."""
    from sparse_accumulation.ops import factored

    theirs = getattr(o3, name)(*args, **kwargs)
    tp = getattr(ours, name)(*args, **kwargs, dtype=torch.float64)
    tp.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(rows, tp.irreps_in1.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    y = torch.randn(rows, tp.irreps_in2.dim, dtype=torch.float64, generator=generator, requires_grad=True)
    shared = kwargs.get("shared_weights") is not False
    weight = (tp.weight if shared else
              torch.randn(rows, tp.weight_numel, dtype=torch.float64, generator=generator, requires_grad=True))
    return _Chunked(theirs, tp, factored.row_bytes(tp._factored_specs, tp.shared_weights, 8), rows, x, y, weight,
                    shared)


@pytest.mark.parametrize("name, args, kwargs", FACTORED)
def test_factored_rows_in_chunks_recomputed_in_the_backward(name, args, kwargs, generator, monkeypatch):
    """Rows whose intermediates exceed the module's budget go in chunks, recomputed in the backward: values and
    derivatives to second order, and gradients alone, equal e3nn's (a last chunk shorter than the others, a
    single row of y shared by every row, message passing, TorchScript), and the forward keeps for the backward
    about its inputs instead of every row's intermediates."""
    from sparse_accumulation.ops import factored

    case = _chunked_case(name, args, kwargs, generator)
    theirs, tp, per_row, rows, x, y, weight, shared = case
    call = case.call

    inputs_ours, inputs_theirs = [x, y, weight], [x, y, theirs.weight if shared else weight]
    whole = _saved_bytes(lambda: call(tp, x, y))
    tp._factored_chunk_bytes = 4 * per_row  # chunks of 4 rows: the last one of 3
    chunked = _saved_bytes(lambda: call(tp, x, y))
    inputs_bytes = sum(t.numel() * 8 for t in inputs_ours) + tp._factored_coefficients.numel() * 8
    assert chunked < whole and chunked <= 2 * inputs_bytes, (chunked, inputs_bytes, whole)
    tp._factored_chunk_bytes = 0  # the device's default budget, here one that every row fits
    with monkeypatch.context() as patched:
        patched.setattr(factored, "default_budget", lambda device: rows * per_row)
        assert _saved_bytes(lambda: call(tp, x, y)) == whole
    tp._factored_chunk_bytes = 4 * per_row

    torch.testing.assert_close(derivatives(call(tp, x, y), inputs_ours),
                               derivatives(call(theirs, x, y), inputs_theirs), rtol=1e-10, atol=1e-10)
    G = torch.randn(rows, tp.irreps_out.dim, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(torch.autograd.grad(call(tp, x, y), inputs_ours, G),
                               torch.autograd.grad(call(theirs, x, y), inputs_theirs, G), rtol=1e-10, atol=1e-10)
    one = y[:1].detach().requires_grad_()
    torch.testing.assert_close(derivatives(call(tp, x, one), [x, one]),
                               derivatives(call(theirs, x, one.expand(rows, -1)), [x, one]), rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(call(torch.jit.script(tp), x, y), call(theirs, x, y), rtol=1e-10, atol=1e-10)
    if not shared:
        check_message_passing(tp, generator, nodes=5, edges=rows)


@pytest.mark.parametrize("name, args, kwargs", FACTORED)
def test_cpu_rows_in_cache_sized_chunks_kept_for_the_backward(name, args, kwargs, generator, monkeypatch):
    """On the CPU the rows go in chunks of at most ``cpu_chunk_bytes()`` of intermediates even where every row's fit
    the budget, kept for the backward (no recomputation): values and derivatives to second order equal e3nn's;
    beyond the budget the recomputed chunks are the smaller of the two sizes."""
    from sparse_accumulation.ops import factored

    case = _chunked_case(name, args, kwargs, generator)
    theirs, tp, per_row, rows, x, y, weight, shared = case
    call = case.call

    chunks = []
    factored_rows = factored._factored_rows

    def counted(*arguments):
        chunks.append(arguments[-1])
        return factored_rows(*arguments)

    monkeypatch.setattr(factored, "_factored_rows", counted)
    monkeypatch.setattr(factored, "cpu_chunk_bytes", lambda: 4 * per_row)
    monkeypatch.setattr(factored, "_recomputed", None)  # kept: calling it fails
    got = derivatives(call(tp, x, y), [x, y, weight])
    assert chunks and set(chunks) == {4, 3}, chunks
    torch.testing.assert_close(got, derivatives(call(theirs, x, y), [x, y, theirs.weight if shared else weight]),
                               rtol=1e-10, atol=1e-10)
    monkeypatch.undo()

    monkeypatch.setattr(factored, "cpu_chunk_bytes", lambda: 4 * per_row)
    tp._factored_chunk_bytes = 8 * per_row  # recomputed chunks of 4 rows, not 8
    recomputed = []
    monkeypatch.setattr(factored, "_recomputed", lambda *arguments: recomputed.append(arguments[-1]) or
                        factored._in_chunks(*arguments))
    call(tp, x, y)
    assert recomputed == [4]


def test_factored_instructions_in_message_passing_and_torchscript(generator):
    irreps = ("12x0e + 4x1o", "10x0e + 4x1e", "8x0e + 4x1o")
    tp = ours.FullyConnectedTensorProduct(*irreps, shared_weights=False, dtype=torch.float64)
    assert tp._factored_specs
    nodes = 4
    out, x, y, weight, source, target = check_message_passing(tp, generator, nodes, edges=11)
    from sparse_accumulation import Index

    prepared = tp(x, y, weight, indices_1=Index(source, nodes), indices_out=Index(target, nodes), size_out=nodes)
    torch.testing.assert_close(prepared, out, rtol=1e-12, atol=1e-12)  # prepared indices reach both parts
    scripted = torch.jit.script(tp)
    torch.testing.assert_close(scripted(x, y, weight, indices_1=source, indices_out=target, size_out=nodes), out)
    torch.testing.assert_close(scripted(x[source], y, weight), tp(x[source], y, weight))
    with pytest.raises(torch.jit.Error, match="at least one batch dimension"):  # per-row weights need rows
        scripted(x[source], y, weight[0])


def test_a_fully_connected_product_of_64_channels_is_made_and_equals_e3nn(generator):
    irreps = "64x0e + 64x1o + 64x2e"
    theirs = o3.FullyConnectedTensorProduct(irreps, irreps, irreps)
    tp = ours.FullyConnectedTensorProduct(irreps, irreps, irreps, dtype=torch.float64)
    assert tp.rule_for("cpu") is None  # every instruction factored: no rule of 22 million terms
    tp.load_state_dict(theirs.state_dict(), strict=True)
    x, y = (torch.randn(3, tp.irreps_in1.dim, dtype=torch.float64, generator=generator) for _ in range(2))
    torch.testing.assert_close(tp(x, y), theirs(x, y), rtol=1e-10, atol=1e-10)