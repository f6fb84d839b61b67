"""Every public entry point inside one model step with forces, compiled: ``torch.compile(fullgraph=True)``
equals eager on the CPU; on CUDA the compiled step also runs as CUDA graphs (``mode="reduce-overhead"``) and
never synchronises or copies between host and device (``torch.cuda.set_sync_debug_mode("error")``)."""
import pytest
import torch

import sparse_accumulation as sa

o3 = pytest.importorskip("e3nn.o3")


class EveryEntryPoint(torch.nn.Module):
    """An energy of positions that calls the tensor API (index tensors as buffers), a Rule, a CG path module, a
    fused product, the e3nn product with message-passing indices and an interaction sum."""

    def __init__(self):
        super().__init__()
        from sparse_accumulation.e3nn import TensorProduct

        m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1, dtype=torch.float64)
        for name, t in (("m1", m1), ("m2", m2), ("mu", mu), ("C", C)):
            self.register_buffer(name, t)
        self.rule = sa.Rule(m1, m2, mu, 3)
        self.path = sa.CGCalculatorSingle(1, 1, 2, dtype=torch.float64)
        self.product = sa.ClebschGordanProduct([(1, 1)], [(1, 1)], lmax_out=1, weights=True, dtype=torch.float64)
        irreps = o3.Irreps("2x0e + 2x1o")
        self.tp = TensorProduct(irreps, "0e + 1o", irreps, [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True),
                                                            (1, 0, 1, "uvu", True), (1, 1, 0, "uvu", True)],
                                shared_weights=False, internal_weights=False, dtype=torch.float64)
        self.embed = torch.nn.Linear(1, 2, dtype=torch.float64)
        self.radial = torch.nn.Linear(1, self.tp.weight_numel, dtype=torch.float64)

    def forward(self, positions, src, dst):
        vectors = (positions[src] - positions[dst])[:, None, :]                  # [E, 1, 3]: l = 1 features
        r = vectors.norm(dim=-1)                                                  # [E, 1]
        a = sa.accumulate(vectors, vectors, self.mu, 3, self.m1, self.m2, self.C)
        b = sa.accumulate_rule(vectors, a, self.rule, self.C)
        c = self.path(vectors, b)
        d = self.product({1: vectors}, {1: b})
        sh = torch.cat([torch.ones_like(r), vectors[:, 0]], dim=1)               # 0e + 1o of each edge
        nodes = positions.shape[0]
        x = torch.cat([self.embed(torch.ones(nodes, 1, dtype=positions.dtype, device=positions.device)),
                       positions.repeat(1, 2)], dim=1)                            # 2x0e + 2x1o per node
        h = self.tp(x, sh, self.radial(r), indices_1=src, indices_out=dst, size_out=nodes)
        env = sa.envsum(r.expand(-1, 2).contiguous(), h[:, :2].contiguous(), dst, src)
        return (c ** 2).sum() + (d ** 2).sum() + (h ** 2).sum() + env.sum()


def loss_step(model, positions, src, dst):
    """The loss of a force-training step (energy plus squared forces; the forces with create_graph);
    ``positions`` requires gradients."""
    energy = model(positions, src, dst)
    forces = -torch.autograd.grad(energy, positions, create_graph=True)[0]
    return energy + (forces ** 2).sum()


def _graph(generator, nodes, device):
    src = torch.randint(0, nodes, (3 * nodes,), generator=generator).to(device)
    dst = torch.randint(0, nodes, (3 * nodes,), generator=generator).sort().values.to(device)
    keep = src != dst
    return src[keep], dst[keep]


def _compiled(monkeypatch, mode=None, backend="inductor"):
    """The compiled step, ``torch.autograd.grad`` traced into its graph while the test runs (dynamo's
    ``trace_autograd_ops``, restored after it: left on, it changes what later tests in the process compile)."""
    torch._dynamo.reset()
    if hasattr(torch._dynamo.config, "trace_autograd_ops"):
        monkeypatch.setattr(torch._dynamo.config, "trace_autograd_ops", True)
    options = {"mode": mode} if mode else {"backend": backend}
    return torch.compile(loss_step, fullgraph=True, **options)


def _check_step(model, step, positions, src, dst):
    """The compiled step's loss and parameter gradients equal the eager step's."""
    params = list(model.parameters())
    expected = loss_step(model, positions, src, dst)
    expected_grads = torch.autograd.grad(expected, params)
    got = step(model, positions, src, dst)
    got_grads = torch.autograd.grad(got, params)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.slow
def test_compiled_model_step_matches_eager_on_the_cpu(generator, monkeypatch):
    model = EveryEntryPoint()
    positions = torch.randn(7, 3, generator=generator, dtype=torch.float64).requires_grad_()
    src, dst = _graph(generator, 7, "cpu")
    _check_step(model, _compiled(monkeypatch, backend="aot_eager"), positions, src, dst)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_model_step_on_cuda_never_synchronises(generator, mode, monkeypatch):
    model = EveryEntryPoint().cuda()
    positions = torch.randn(40, 3, generator=generator, dtype=torch.float64).cuda().requires_grad_()
    src, dst = _graph(generator, 40, "cuda")
    step = _compiled(monkeypatch, mode=None if mode == "default" else mode)
    for _ in range(3):  # compile, record the graphs, replay
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        loss = step(model, positions, src, dst)
        torch.autograd.grad(loss, list(model.parameters()))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        loss = step(model, positions, src, dst)
        grads = torch.autograd.grad(loss, list(model.parameters()))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = loss_step(model, positions, src, dst)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    for a, b in zip(grads, torch.autograd.grad(expected, list(model.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
