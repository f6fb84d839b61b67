"""``sparse_accumulation.mace.CapturedModel``: a converted MACE model's calls replayed from CUDA graphs per size
bucket, atoms and edges padded by a padding system. On the CPU the padded buckets run eagerly (``cpu="padded"``),
computing what a replay computes: energies, forces and stress equal MACE's model before conversion (float64
1e-10 relative, float32 1e-5), buckets reused and made anew as neighbour lists shrink and grow, MACE's ASE
calculator runs it unchanged and its molecular dynamics follows MACE's; on CUDA the same through replays."""
import contextlib
import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mace_models import RTOL, batch, mace_model, structures  # skips without MACE

from sparse_accumulation import indices  # noqa: E402
from sparse_accumulation.mace import CapturedModel, accelerate  # noqa: E402

KEYS = ("energy", "node_energy", "forces", "stress")
_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _squeezed(atoms, factor):
    """``atoms`` with its cell and positions scaled by ``factor`` (more neighbours within the cutoff below 1)."""
    atoms = atoms.copy()
    atoms.set_cell(atoms.cell * factor, scale_atoms=True)
    return atoms


def _on(data: dict, device, dtype=torch.float64) -> dict:
    return {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) if isinstance(v, torch.Tensor) else v
            for k, v in data.items()}


def _assert_equal_outputs(got, expected, rtol=RTOL):
    for key in KEYS:
        assert got[key].shape == expected[key].shape, key
        scale = expected[key].abs().max().item()
        assert (got[key] - expected[key]).abs().max().item() <= rtol * scale, key


def _models(generator, device="cpu", dtype=torch.float64, **options):
    model = mace_model(generator).to(device, dtype)
    return model, CapturedModel(accelerate(copy.deepcopy(model)), **options)


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, RTOL), (torch.float32, 1e-5)])
def test_padded_buckets_equal_maces_model(generator, dtype, rtol):
    """A periodic crystal and a molecule in one batch, as two systems: their outputs with the padding dropped."""
    model, ours = _models(generator, dtype=dtype, cpu="padded")
    data = _on(batch(structures(generator), model), "cpu", dtype)
    got = ours(dict(data), compute_stress=True)
    _assert_equal_outputs(got, model(dict(data), compute_stress=True), rtol)
    ((atoms, edges, systems),) = ours.buckets
    assert atoms > data["positions"].shape[0] and edges > data["edge_index"].shape[1] and systems == 2
    assert got["energy"].shape == (2,) and got["forces"].shape == data["positions"].shape


def test_a_captured_call_sorts_each_index_once_and_computes_maces_outputs(monkeypatch, generator):
    """Capture simulated on the CPU (``indices.capturing`` says yes for every tensor, so nothing is read or
    remembered as in eager calls): the converted model's call sorts each ``edge_index`` row and the elements once
    for all its layers, within the capture scope its hooks open, where without the scope each layer sorts
    again; outputs equal MACE's either way, and no scope is left open (16 channels: the fused convolution, which
    sorts its edges, also on the CPU)."""
    model = mace_model(generator, hidden="16x0e + 16x1o")
    ours = accelerate(copy.deepcopy(model))
    data = batch(structures(generator), model)
    expected = model(dict(data), compute_stress=True)
    edge_sorts, element_sorts = [], []
    real_segments, real_elements = indices.segments, indices.element_segments
    monkeypatch.setattr(indices, "capturing", lambda t: True)
    monkeypatch.setattr(indices, "segments", lambda t, n: edge_sorts.append(n) or real_segments(t, n))
    monkeypatch.setattr(indices, "element_segments", lambda t, n: element_sorts.append(n) or real_elements(t, n))
    counts = []
    for scope in (contextlib.nullcontext, indices.capture_scope):
        monkeypatch.setattr(indices, "capture_scope", scope)
        edge_sorts.clear(), element_sorts.clear()
        _assert_equal_outputs(ours(dict(data), compute_stress=True), expected)
        counts.append((len(edge_sorts), len(element_sorts)))
        assert getattr(indices._local, "scope", None) is None
    (edges_unscoped, elements_unscoped), (edges_scoped, elements_scoped) = counts
    assert 1 <= edges_scoped <= 2 and elements_scoped == 1
    assert edges_unscoped > edges_scoped and elements_unscoped > elements_scoped


def test_neighbour_lists_that_shrink_reuse_a_bucket_and_those_that_outgrow_it_make_another(generator):
    model, ours = _models(generator, cpu="padded", edge_headroom=0.05, edge_multiple=8)
    crystal, molecule = structures(generator)
    sizes = []
    for factor in (1.0, 1.01, 0.8, 1.0):  # a little fewer edges, many more, back
        data = batch([_squeezed(crystal, factor), molecule], model)
        _assert_equal_outputs(ours(dict(data), compute_stress=True), model(dict(data), compute_stress=True))
        sizes.append((data["edge_index"].shape[1], ours.captures))
    (e0, c0), (e1, c1), (e2, c2), (e3, c3) = sizes
    assert e1 <= e0 < e2 and (c0, c1, c2, c3) == (1, 1, 2, 2)
    assert len(ours.buckets) == 2


def test_maces_calculator_runs_it_and_its_dynamics_follow_maces(generator):
    """MACE's ASE calculator given the wrapper (``models=``), unchanged: energy, forces and stress, then velocity
    Verlet steps whose positions and energies follow MACE's own model's; the total energy is conserved as well as
    MACE's own trajectory conserves it."""
    from ase import units
    from ase.md.verlet import VelocityVerlet
    from mace.calculators import MACECalculator

    model, ours = _models(generator, cpu="padded")
    crystal = structures(generator)[0]
    rng = np.random.default_rng(int(torch.randint(2 ** 31, (1,), generator=generator)))
    momenta = rng.normal(0.0, 0.3, (len(crystal), 3))
    runs = {}
    for name, calculator_model in (("mace", model), ("ours", ours)):
        atoms = crystal.copy()
        atoms.calc = MACECalculator(models=calculator_model, device="cpu", default_dtype="float64")
        first = atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()
        atoms.set_momenta(momenta)
        energies = []
        dynamics = VelocityVerlet(atoms, timestep=0.25 * units.fs)
        dynamics.attach(lambda: energies.append(atoms.get_total_energy()))
        dynamics.run(8)
        runs[name] = (*first, atoms.get_positions(), np.array(energies))
    for what, got, expected in zip(["energy", "forces", "stress", "positions", "total energies"], runs["ours"],
                                   runs["mace"]):
        assert np.abs(np.asarray(got) - expected).max() <= RTOL * np.abs(expected).max(), what
    assert ours.captures == 1  # one bucket served every step
    drift = np.abs(runs["ours"][-1] - runs["ours"][-1][0]).max()
    assert drift <= 1e-3 * len(crystal), drift


def test_a_batch_as_torch_sims_mace_model_builds_it(generator):
    """MACE's torch-sim model passes cells as ``[systems, 3, 3]``, a ``pbc`` of the whole state and positions that
    already require grad."""
    model, ours = _models(generator, cpu="padded")
    data = batch(structures(generator), model)
    data = dict(data, cell=data["cell"].view(-1, 3, 3), pbc=torch.tensor([True, True, True]),
                positions=data["positions"].clone().requires_grad_(True))
    _assert_equal_outputs(ours(dict(data), compute_stress=True), model(dict(data), compute_stress=True))


def test_cpu_calls_run_the_model_itself_by_default_and_unsupported_calls_run_eagerly(generator):
    model, ours = _models(generator)
    data = batch(structures(generator), model)
    expected = ours.model(dict(data), compute_stress=True)
    got = ours(dict(data), compute_stress=True)
    assert all(torch.equal(got[k], expected[k]) for k in KEYS) and ours.captures == 0
    padded = CapturedModel(ours.model, cpu="padded")
    out = padded(dict(data), training=True)  # a training step keeps its graph: never padded nor captured
    assert out["forces"].requires_grad and padded.captures == 0
    assert ours.r_max == model.r_max and torch.equal(ours.atomic_numbers, model.atomic_numbers)


def test_moving_the_model_forgets_its_buckets(generator):
    model, ours = _models(generator, cpu="padded")
    data = batch(structures(generator), model)
    ours(dict(data))
    assert len(ours.buckets) == 1
    ours.float()
    assert ours.buckets == []
    _assert_equal_outputs(ours(_on(data, "cpu", torch.float32), compute_stress=True),
                          model.float()(_on(data, "cpu", torch.float32), compute_stress=True), 1e-5)


def test_saved_and_copied_without_its_buckets(generator, tmp_path):
    model, ours = _models(generator, cpu="padded")
    data = batch(structures(generator), model)
    ours(dict(data))
    torch.save(ours, tmp_path / "captured.pt")
    for other in (torch.load(tmp_path / "captured.pt", weights_only=False), copy.deepcopy(ours)):
        assert other.buckets == [] and len(ours.buckets) == 1
        _assert_equal_outputs(other(dict(data), compute_stress=True), model(dict(data), compute_stress=True))


@pytest.mark.parametrize("options, message", [
    (dict(atom_multiple=0), "atom_multiple must be a positive int"),
    (dict(edge_multiple=2.5), "edge_multiple must be a positive int"),
    (dict(max_buckets=True), "max_buckets must be a positive int"),
    (dict(edge_headroom=-1), r"edge_headroom must be a number in \[0, 10\]"),
    (dict(cpu="graphs"), "cpu must be 'eager' or 'padded'"),
    (dict(compile="default"), "compile must be True or False"),
    (dict(hoist_elements=1), "hoist_elements must be True or False"),
])
def test_bad_options_are_refused(generator, options, message):
    with pytest.raises(ValueError, match=message):
        CapturedModel(mace_model(generator), **options)


def test_what_is_not_a_mace_model_or_batch_is_refused(generator):
    with pytest.raises(ValueError, match="model must be a MACE model"):
        CapturedModel(torch.nn.Linear(2, 2))
    model, ours = _models(generator, cpu="padded")
    data = batch(structures(generator), model)
    del data["cell"]
    with pytest.raises(ValueError, match="data must hold the tensor 'cell'"):
        ours(data)


@pytest.mark.parametrize("dtype, rtol, hoist, fused_linear", [
    pytest.param(torch.float64, RTOL, True, False, marks=_CUDA),
    pytest.param(torch.float32, 1e-5, True, False, marks=_CUDA),
    pytest.param(torch.float32, 1e-5, False, False, marks=_CUDA),
    pytest.param(torch.float32, 1e-5, True, True, marks=_CUDA)])
def test_replays_equal_maces_model_for_new_positions_and_neighbour_lists(generator, monkeypatch, dtype, rtol, hoist,
                                                                          fused_linear):
    """On CUDA: captured once per bucket, replayed for new positions, for a neighbour list a little smaller (the
    same graph) and one that outgrows its bucket (a new capture), and for the first again; with the element
    tables hoisted out of the graph (the default) and rebuilt in it, and with the e3nn-layout ``Linear`` layers
    on their fused kernel (``FUSED_MAX_ROWS``)."""
    from sparse_accumulation.e3nn import linear

    monkeypatch.setattr(linear, "FUSED_MAX_ROWS", 65536 if fused_linear else 0)
    model, ours = _models(generator, "cuda", dtype, hoist_elements=hoist)
    crystal, molecule = structures(generator)
    rng = np.random.default_rng(int(torch.randint(2 ** 31, (1,), generator=generator)))
    for factor, captures in ((1.0, 1), (1.0, 1), (1.01, 1), (0.8, 2), (1.0, 2)):
        moved = _squeezed(crystal, factor)
        moved.positions += rng.normal(0.0, 0.02, moved.positions.shape)
        data = _on(batch([moved, molecule], model), "cuda", dtype)
        _assert_equal_outputs(ours(dict(data), compute_stress=True), model(dict(data), compute_stress=True), rtol)
        assert ours.captures == captures


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_maces_calculator_on_cuda_replays(generator):
    from mace.calculators import MACECalculator

    model, ours = _models(generator, "cuda")
    crystal = structures(generator)[0]
    results = []
    for calculator_model in (model, ours):
        atoms = crystal.copy()
        atoms.calc = MACECalculator(models=calculator_model, device="cuda", default_dtype="float64")
        results.append((atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()))
        atoms.positions += 0.01
        results[-1] += (atoms.get_forces(),)
    for got, expected in zip(results[1], results[0]):
        assert np.abs(np.asarray(got) - expected).max() <= RTOL * np.abs(expected).max()
    assert ours.captures == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_training_step_captured_by_hand_in_a_fresh_process(tmp_path):
    """``mace_captured_training.py`` in a process of its own with empty Triton, inductor and library caches: the
    first capture of a training step, after an eager forces call on the default stream while the kernels compiled
    and a forces capture, replays the eager step's parameter gradients."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               TRITON_CACHE_DIR=str(tmp_path / "triton"), SPARSE_ACCUMULATION_TRITON_CACHE=str(tmp_path / "sa"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    seed = int(torch.randint(2 ** 31, (1,)))
    done = subprocess.run([sys.executable, os.path.join(here, "mace_captured_training.py"), str(seed)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]


def _trace_autograd_ops(monkeypatch):
    if not hasattr(torch._dynamo.config, "trace_autograd_ops"):
        pytest.skip("this torch has no trace_autograd_ops")
    monkeypatch.setattr(torch._dynamo.config, "trace_autograd_ops", True)


@pytest.mark.slow
def test_a_compiled_call_compiles_where_dynamo_traces_autograd_grad(generator, monkeypatch):
    """MACE's compile helpers switch dynamo's ``trace_autograd_ops`` on for the whole process; a compiled padded
    call (``compile=True``) then still compiles (MACE's forces gradient, taken without retaining its graph, is
    left out of the compiled graph) and equals MACE's model."""
    _trace_autograd_ops(monkeypatch)
    torch._dynamo.reset()
    model, ours = _models(generator, cpu="padded", compile=True)
    data = _on(batch(structures(generator), model), "cpu")
    _assert_equal_outputs(ours(dict(data), compute_stress=True), model(dict(data), compute_stress=True))


@pytest.mark.slow
@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.long), pytest.param("cuda", marks=_CUDA)])
def test_compiled_buckets_equal_maces_model(generator, device, monkeypatch):
    """``compile=True``: each bucket runs (on the CPU, ``cpu="padded"``) or is captured (CUDA) as the model
    compiled by torch.compile; energies, forces and stress equal MACE's (float64), for new positions and for a
    neighbour list that outgrows its bucket (a second compiled graph). With dynamo's ``trace_autograd_ops`` on,
    as MACE's compile helpers leave it. (On the CPU two minutes of compiling: ``long``.)"""
    _trace_autograd_ops(monkeypatch)
    torch._dynamo.reset()
    model, ours = _models(generator, device, cpu="padded", compile=True)
    crystal, molecule = structures(generator)
    for factor, captures in ((1.0, 1), (1.0, 1), (0.8, 2)):
        moved = _squeezed(crystal, factor)
        moved.positions += 0.01 * factor
        data = _on(batch([moved, molecule], model), device)
        _assert_equal_outputs(ours(dict(data), compute_stress=True), model(dict(data), compute_stress=True))
        assert ours.captures == captures
    assert ours._compiled is not None


def _simulated_cuda_graphs(monkeypatch, capturing: bool = False) -> None:
    """CUDA's streams and graphs replaced by stand-ins that run the calls (a replay does nothing); with
    ``capturing``, every tensor counts as captured inside the stand-in graph (``indices.capturing``)."""
    import types

    inside = []
    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: types.SimpleNamespace(replay=lambda: None))

    @contextlib.contextmanager
    def graph(graph, pool=None):
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    monkeypatch.setattr(torch.cuda, "graph", graph)
    if capturing:
        monkeypatch.setattr(indices, "capturing", lambda t: bool(inside))


#: the options of a forces and stress call (MACE's call keywords; a bucket's key holds their values)
STRESS_CALL = dict(compute_force=True, compute_virials=False, compute_stress=True, compute_displacement=False,
                   compute_edge_forces=False, compute_atomic_stresses=False)


def _captured_bucket(ours, data) -> tuple:
    """``(bucket, atoms, edges)``: the bucket of ``data``'s forces and stress call, filled and captured (under
    :func:`_simulated_cuda_graphs` on the CPU)."""
    atoms, edges, systems = data["positions"].shape[0], data["edge_index"].shape[1], data["ptr"].shape[0] - 1
    bucket = ours._bucket(data, atoms, edges, systems, tuple(STRESS_CALL.values()))
    bucket.fill(data, atoms, edges)
    ours._capture(bucket, STRESS_CALL)
    return bucket, atoms, edges


def test_a_capture_keeps_no_autograd_graph(monkeypatch, generator):
    """A bucket's captured outputs (a capture simulated on the CPU: CUDA's streams and graphs replaced by stand-ins
    that run the calls) hold no autograd graph: the captured energy's graph would keep the parameters' gradient
    accumulators, tied to the capture's stream, alive for a later capture of a training step to meet. The
    outputs still equal MACE's."""
    model, ours = _models(generator)
    data = batch(structures(generator), model)
    _simulated_cuda_graphs(monkeypatch)
    bucket, atoms, edges = _captured_bucket(ours, data)
    tensors = [v for v in bucket.outputs.values() if isinstance(v, torch.Tensor)]
    assert tensors and all(v.grad_fn is None and not v.requires_grad for v in tensors)
    _assert_equal_outputs(bucket.real_outputs(bucket.outputs, atoms, edges, copy=True),
                          model(dict(data), compute_stress=True))


def _tables(elements, rows):
    return [elements.tensor, elements.order, elements.starts, *elements.tiles(rows), *elements.tile_slots(rows)]


def test_a_hoisted_capture_reads_the_eager_elements_and_refresh_rewrites_them_in_place(monkeypatch, generator):
    """Inside ``attributes.hoisted`` a (simulated) capture of ``prepare(y)`` takes the eager call's reading of the
    same unchanged ``y`` (the same elements and tile tables: the graph reads them) and records it; outside it, a
    reading of its own. ``refresh`` after ``y`` changed writes the new elements, order and tile tables into those
    tensors (equal to a fresh reading's); a change of kind (a row that loses its element) returns False and
    writes nothing."""
    from sparse_accumulation.indices import Elements
    from sparse_accumulation.mace import attributes

    nodes, num, rows = 37, 4, 8
    kinds = torch.randint(num, (nodes,), generator=generator)
    y = torch.nn.functional.one_hot(kinds, num).double() * (0.5 + torch.rand(nodes, 1, generator=generator,
                                                                             dtype=torch.float64))
    y[-3:] = 0  # and padding rows: a scaled reading
    eager = attributes.prepare(y, num)
    _tables(eager.elements, rows)  # the warm-up's tile tables
    monkeypatch.setattr(indices, "capturing", lambda t: True)
    record = []
    with attributes.hoisted(record):
        taken = attributes.prepare(y, num)
        again = attributes.prepare(y, num)  # another layer's reading: the same one, recorded once
    assert taken.elements is eager.elements and taken.scale is eager.scale and again.elements is eager.elements
    assert len(record) == 1 and record[0][0] is y and record[0][2] is taken
    assert attributes.prepare(y, num).elements is not eager.elements
    monkeypatch.undo()

    y[:-3] = torch.nn.functional.one_hot(torch.randint(num, (nodes - 3,), generator=generator), num).double() * (
        0.5 + torch.rand(nodes - 3, 1, generator=generator, dtype=torch.float64))
    held = [t.data_ptr() for t in _tables(eager.elements, rows)]
    assert attributes.refresh(record)
    expected = Elements(y.abs().argmax(1), num, check=False)
    for got, want in zip(_tables(eager.elements, rows), _tables(expected, rows)):
        assert torch.equal(got, want)
    assert [t.data_ptr() for t in _tables(eager.elements, rows)] == held
    assert torch.equal(eager.scale, y.gather(1, expected.tensor[:, None]))

    before = [t.clone() for t in _tables(eager.elements, rows)]
    y[0, :2] = 1.0  # two nonzeros in a row: weights per node, another graph
    assert not attributes.refresh(record)
    assert all(torch.equal(a, b) for a, b in zip(_tables(eager.elements, rows), before))


def test_a_bucket_compares_node_attributes_only_when_they_may_have_changed(monkeypatch, generator):
    """``attributes_changed``: the same unchanged tensor again is not compared; another tensor of equal values is
    unchanged (also with another edge count: MD's neighbour lists change size every few steps), one of other
    values changed; another real atom count (padding rows written again) counts as a change."""
    model, ours = _models(generator, cpu="padded", hoist_elements=True)
    data = batch(structures(generator), model)
    atoms, edges, systems = data["positions"].shape[0], data["edge_index"].shape[1], data["ptr"].shape[0] - 1
    bucket = ours._bucket(data, atoms, edges, systems, tuple(STRESS_CALL.values()))
    assert bucket.attributes_changed(data, atoms)  # nothing filled yet
    bucket.fill(data, atoms, edges)
    compared = []
    real_equal = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(1) or real_equal(a, b))
    assert not bucket.attributes_changed(data, atoms) and not compared
    same = dict(data, node_attrs=data["node_attrs"].clone())
    assert not bucket.attributes_changed(same, atoms) and compared
    bucket.fill(dict(data, edge_index=data["edge_index"][:, :-1], shifts=data["shifts"][:-1],
                     unit_shifts=data["unit_shifts"][:-1]), atoms, edges - 1)
    assert not bucket.attributes_changed(same, atoms)
    other = dict(data, node_attrs=data["node_attrs"].flip(1))
    assert bucket.attributes_changed(other, atoms)
    data["node_attrs"].mul_(1.0)  # changed in place (its version): compared again
    compared.clear()
    assert not bucket.attributes_changed(data, atoms) and compared
    assert bucket.attributes_changed(data, atoms - 1)


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hoisted_element_tables_follow_new_node_attributes_in_replays(generator):
    """``hoist_elements=True`` on CUDA: replays equal MACE's model for new positions and, in the same bucket, for
    atoms given other elements (the tables rewritten in place before the replay, no new capture); the graph
    reads tables the warm-up made (they are recorded)."""
    model, ours = _models(generator, "cuda", hoist_elements=True)
    crystal, molecule = structures(generator)
    z0, z1 = [int(z) for z in model.atomic_numbers]
    for step in range(4):
        moved = crystal.copy()
        moved.positions += 0.02 * step
        if step >= 2:  # an atom of the other element each step (the same edges: the same bucket)
            numbers = moved.get_atomic_numbers()
            numbers[step] = z1 if numbers[step] == z0 else z0
            moved.set_atomic_numbers(numbers)
        data = _on(batch([moved, molecule], model), "cuda")
        _assert_equal_outputs(ours(dict(data), compute_stress=True), model(dict(data), compute_stress=True))
    assert ours.captures == 1
    (bucket,) = ours._buckets.values()
    assert bucket.hoisted and bucket.graph is not None


def test_a_hoisted_bucket_rewrites_its_tables_when_the_elements_change(monkeypatch, generator):
    """The capture flow simulated on the CPU (CUDA's streams and graphs replaced by stand-ins; inside the stand-in
    graph every tensor counts as captured): with ``hoist_elements=True`` the capture records the converted
    layers' readings of the node attributes, the same objects the warm-up made; a later call whose atoms have
    other elements rewrites their tables before the (stand-in) replay, equal to a fresh reading of the new
    attributes; a call that changes their kind (a row with two nonzeros) drops the graph to capture again."""
    from sparse_accumulation.indices import Elements

    model, ours = _models(generator, cpu="padded", hoist_elements=True)
    crystal, molecule = structures(generator)
    data = batch([crystal, molecule], model)
    _simulated_cuda_graphs(monkeypatch, capturing=True)
    bucket, _, _ = _captured_bucket(ours, data)
    assert bucket.hoisted and all(y is bucket.static["node_attrs"] for y, _, _ in bucket.hoisted)
    readings = {id(prepared.elements): prepared.elements for _, _, prepared in bucket.hoisted}

    numbers, (z0, z1) = crystal.get_atomic_numbers(), [int(z) for z in model.atomic_numbers]
    numbers[0] = z1 if numbers[0] == z0 else z0  # one atom of the other element: the same edges
    changed = crystal.copy()
    changed.set_atomic_numbers(numbers)
    other = batch([changed, molecule], model)
    assert other["edge_index"].shape == data["edge_index"].shape
    before = [elements.tensor.clone() for elements in readings.values()]
    ours(dict(other), compute_stress=True)
    assert not any(torch.equal(elements.tensor, old) for elements, old in zip(readings.values(), before))
    assert bucket.graph is not None
    y = bucket.static["node_attrs"]
    fresh = Elements(y.abs().argmax(1), y.shape[1], check=False)
    for elements in readings.values():
        assert torch.equal(elements.tensor, fresh.tensor) and torch.equal(elements.order, fresh.order)
        for key in [k for k in elements._tiles if not isinstance(k, tuple)]:
            assert all(torch.equal(a, b) for a, b in zip(elements.tiles(key), fresh.tiles(key)))

    mixed = dict(other, node_attrs=other["node_attrs"].clone())
    mixed["node_attrs"][0] = 0.5
    ours(dict(mixed), compute_stress=True)
    assert bucket.graph is None and not bucket.hoisted
