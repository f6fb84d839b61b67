"""A converted MACE model's radial networks hand their last layer to the convolution
(``sparse_accumulation.e3nn.DeferredWeights``): computed whole below ``Convolution.chunk_bytes``, else chunk by chunk
of edges, recomputed in the backward. With chunks of a few edges: energies, forces and stress, and the parameter
gradients of a force-training loss (second derivatives) equal MACE's model before conversion (float64); no tensor
the size of every edge's weights is saved for the backward; the scripted copy and compiled calls compute the
weights as before."""
import copy

import pytest
import torch

from mace_models import RTOL, assert_close, batch, mace_model, structures  # skips without MACE

from sparse_accumulation.e3nn import DeferredWeights, FullyConnectedNet  # noqa: E402
from sparse_accumulation.mace import Convolution, accelerate  # noqa: E402


def _chunked(monkeypatch, model, edges_per_chunk: int):
    """The converted model's convolutions cut ``edges_per_chunk`` edges at a time."""
    width = model.interactions[0].conv_tp.weight_numel
    monkeypatch.setattr(Convolution, "chunk_bytes", edges_per_chunk * width * 8)


def test_radial_networks_of_converted_convolutions_defer_their_last_layer(generator):
    model = accelerate(copy.deepcopy(mace_model(generator)))
    for block in model.interactions:
        net = block.conv_tp_weights
        assert isinstance(net, FullyConnectedNet) and net.defer_last_layer
        x = torch.randn(7, net.hs[0], generator=generator, dtype=torch.float64)
        deferred = net(x)
        assert isinstance(deferred, DeferredWeights) and deferred.shape == (7, net.hs[-1])
        net.defer_last_layer = False
        whole = net(x)
        scale = torch.rand(7, 1, generator=generator, dtype=torch.float64)
        for got, expected in ((deferred.materialize(), whole), ((deferred * scale * 2.0).materialize(),
                                                               whole * scale * 2.0),
                              ((scale * deferred).rows(2, 5).materialize(), (whole * scale)[2:5])):
            # (a product over fewer rows may round otherwise: float64 to the largest value's precision)
            assert got.shape == expected.shape
            assert (got - expected).abs().max() <= 1e-13 * expected.abs().max()
        with pytest.raises(RuntimeError):  # a product that is not a row scale computes the rows first
            deferred * torch.ones(3)


@pytest.mark.parametrize("edges_per_chunk", [5, 1000])
def test_chunked_convolutions_equal_maces_model(monkeypatch, generator, edges_per_chunk):
    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    _chunked(monkeypatch, ours, edges_per_chunk)
    data = batch(structures(generator), model)
    expected, got = model(dict(data), compute_stress=True), ours(dict(data), compute_stress=True)
    for key in ("energy", "node_energy", "forces", "stress"):
        assert_close(got[key], expected[key], key)
    for module in (model, ours):
        out = module(dict(data), training=True)
        (out["energy"].square().sum() + out["forces"].square().sum()).backward()
    for name, theirs in model.named_parameters():
        mine = ours.get_parameter(name)
        if theirs.grad is None:
            assert mine.grad is None or not mine.grad.any(), name
        else:
            assert_close(mine.grad, theirs.grad, name)


def test_chunks_keep_no_tensor_of_every_edges_weights_for_the_backward(monkeypatch, generator):
    """The tensors a call saves for its backward: computed whole (the default at this size), the per-edge weights
    ``[edges, weight_numel]`` are among them; with chunks of 8 edges no tensor of that shape, nor one with as many
    rows and more columns, is."""
    model = mace_model(generator)
    ours = accelerate(copy.deepcopy(model))
    data = batch(structures(generator), model)
    edges, width = data["edge_index"].shape[1], ours.interactions[0].conv_tp.weight_numel
    found = []
    for chunk in (None, 8):
        if chunk is not None:
            _chunked(monkeypatch, ours, chunk)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
            ours(dict(data), compute_force=False)
        found.append(any(len(shape) == 2 and shape[0] == edges and shape[1] >= width for shape in saved
                         if shape[1:] != (ours.interactions[0].conv_tp_weights.hs[-2],)))
    assert found == [True, False]


def test_scripted_and_compiled_radial_networks_return_tensors(generator):
    net = accelerate(copy.deepcopy(mace_model(generator))).interactions[0].conv_tp_weights
    x = torch.randn(6, net.hs[0], generator=generator, dtype=torch.float64)
    expected = net(x).materialize()
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)(x)
    scripted = torch.jit.script(net)(x)
    for got in (compiled, scripted):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape
        assert (got - expected).abs().max() <= RTOL * expected.abs().max()



@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-edge"])
def test_backward_of_chunks_recomputes_their_weights_not_their_messages(monkeypatch, generator, fused):
    """Each chunk's checkpoint recomputes, in the backward, the tensors its graph saved; there no kernel computes
    the chunk's messages again (they would be discarded), on the fused path (graph kernels) or per edge (row
    kernels); the forces still equal those of the weights computed whole."""
    from sparse_accumulation import backends
    from sparse_accumulation.e3nn import tensor_product

    monkeypatch.setattr(tensor_product, "FUSED_MIN_CHANNELS", 0 if fused else 10**6)
    model = accelerate(copy.deepcopy(mace_model(generator)))
    data = batch(structures(generator), model)
    whole = model(dict(data), compute_force=True)["forces"]
    _chunked(monkeypatch, model, 16)
    messages = []  # the kernel calls that compute messages (a product's forward)
    graph, rows = backends.kernel_module("graph", "numba"), backends.kernel_module("accumulate", "numba")
    run, accumulate = graph.run, rows.accumulate
    monkeypatch.setattr(graph, "run", lambda crule, tensors, indices, outputs, *args, **kwargs: (
        messages.extend(slot for slot, *_ in outputs if slot == 3) or run(crule, tensors, indices, outputs, *args,
                                                                          **kwargs)))
    monkeypatch.setattr(rows, "accumulate", lambda *args: messages.append("rows") or accumulate(*args))
    data["positions"].requires_grad_(True)
    energy = model(dict(data), compute_force=False)["energy"]
    chunks = -(-data["edge_index"].shape[1] // 16)
    forward = len(messages)
    assert forward >= chunks * len(model.interactions)
    forces = -torch.autograd.grad(energy.sum(), data["positions"])[0]
    assert len(messages) == forward
    assert_close(forces, whole, "forces")
