"""Symbolic tracing keeps node and edge counts symbolic: ``make_fx(tracing_mode="symbolic")`` of a layer of fused
message passing at two sizes gives one graph (what NequIP's ``nequip-compile`` and train-time compile check before
``torch.export``), forward and forces."""
import pytest
import torch

pytest.importorskip("e3nn")
from e3nn import o3  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from sparse_accumulation.e3nn import TensorProduct  # noqa: E402


def _layer(irreps, dtype):
    irreps_x, irreps_sh = o3.Irreps(irreps), o3.Irreps.spherical_harmonics(2)
    instructions, mid = [], []
    for i, (mul, a) in enumerate(irreps_x):
        for j, (_, b) in enumerate(irreps_sh):
            for c in a * b:
                if c in irreps_x:
                    instructions.append((i, j, len(mid), "uvu", True))
                    mid.append((mul, c))
    return TensorProduct(irreps_x, irreps_sh, o3.Irreps(mid), instructions, shared_weights=False,
                         internal_weights=False).to(dtype)


@pytest.mark.parametrize("forces", [False, True], ids=["energy", "forces"])
@pytest.mark.parametrize("irreps,fused", [("32x0e+32x1o", True), ("4x0e+4x1o", False)],
                         ids=["fused", "per edge on the CPU"])
def test_one_graph_for_every_size(generator, forces, irreps, fused):
    tp = _layer(irreps, torch.float64)

    def energy(x, sh, weight, edge_index):
        n = x.shape[0]
        h = tp(x, sh, weight, indices_1=edge_index[1], indices_out=edge_index[0], size_out=n)
        if not forces:
            return h.pow(2).sum()
        return torch.autograd.grad(h.pow(2).sum(), x, create_graph=True)[0]

    def inputs(nodes, edges):
        x = torch.randn(nodes, tp.irreps_in1.dim, generator=generator, dtype=torch.float64, requires_grad=forces)
        return (x, torch.randn(edges, tp.irreps_in2.dim, generator=generator, dtype=torch.float64),
                torch.randn(edges, tp.weight_numel, generator=generator, dtype=torch.float64),
                torch.randint(0, nodes, (2, edges), generator=generator))

    codes = []
    for nodes, edges in ((7, 40), (11, 61)):
        traced = make_fx(energy, tracing_mode="symbolic", _allow_non_fake_inputs=True,
                         _error_on_data_dependent_ops=True)(*inputs(nodes, edges))
        codes.append(traced.code)
        assert ("graph_accumulate" in traced.code) == fused
        values = inputs(nodes + 3, edges + 5)
        assert torch.allclose(traced(*values), energy(*values), rtol=1e-12, atol=1e-12)
    assert codes[0] == codes[1]
