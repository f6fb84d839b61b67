"""The registered ops of the interaction sums: torch.library.opcheck, torch.compile(fullgraph=True) and
torch.export."""
import pytest
import torch

import sparse_accumulation as sa
from pair_sums_helpers import LOOPS, arguments, assert_close_to_oracle, random_inputs

OPS = {"envsum": torch.ops.sparse_accumulation.envsum.default,
       "sensesum": torch.ops.sparse_accumulation.sensesum.default,
       "featsum": torch.ops.sparse_accumulation.featsum.default}


@pytest.mark.parametrize("implementation,name,requires_grad",
                         [("auto", name, True) for name in OPS] + [("torch", "envsum", False)])
def test_opcheck(generator, implementation, name, requires_grad):
    s, z, env, first, second = random_inputs(generator, n_atoms=5, n_pairs=11, n_nu=3, n_feat=4)
    a, b, first, second = arguments(name, s, z, env, first, second)
    torch.library.opcheck(OPS[name], (a.requires_grad_(requires_grad), b.requires_grad_(requires_grad), first,
                                      second, implementation))


class Interaction(torch.nn.Module):
    """A HIP-NN-like interaction: environment sums, a linear map, and the sums' other two directions."""

    def __init__(self, n_nu, n_feat):
        super().__init__()
        self.weights = torch.nn.Parameter(torch.randn(n_nu * n_feat, n_feat, dtype=torch.float64) / 4)

    def forward(self, s, z, env, first, second):
        out = sa.envsum(s, z, first, second).flatten(1) @ self.weights
        return out.sum() + sa.sensesum(env, out, first, second).sum() + sa.featsum(env, s, first, second).sum()


def _expected(module, s, z, env, first, second):
    out = LOOPS["envsum"](s, z, first, second).flatten(1) @ module.weights.detach()
    return (out.sum() + LOOPS["sensesum"](env, out, first, second).sum()
            + LOOPS["featsum"](env, s, first, second).sum())


def test_compile_fullgraph_forward_and_backward(generator):
    torch._dynamo.reset()
    module = Interaction(3, 4)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    for n_pairs in (9, 14):
        s, z, env, first, second = random_inputs(generator, n_atoms=5, n_pairs=n_pairs, n_nu=3, n_feat=4)
        z.requires_grad_()
        got = compiled(s, z, env, first, second)
        assert_close_to_oracle(got.detach(), _expected(module, s, z, env, first, second), torch.float64)
        (grad,) = torch.autograd.grad(got, z)
        (expected,) = torch.autograd.grad(module(s, z, env, first, second), z)
        assert_close_to_oracle(grad, expected, torch.float64)


def test_export_keeps_the_ops(generator):
    module = Interaction(3, 4)
    inputs = random_inputs(generator, n_atoms=5, n_pairs=10, n_nu=3, n_feat=4)
    program = torch.export.export(module, inputs)
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert {f"sparse_accumulation.{name}.default" for name in OPS} <= targets
    assert_close_to_oracle(program.module()(*inputs), _expected(module, *inputs), torch.float64)


@pytest.mark.parametrize("name", ["envsum", "sensesum", "featsum"])
def test_registered_ops_remember_no_index_tensors(generator, name):
    """The registered ops (what compiled graphs call) prepare the pair indices afresh on every call and keep
    nothing (a tensor kept from a CUDA graph's warm-up run would outlive the graph's outputs in its memory
    pool), with the same values as the oracle; the public eager path still remembers them."""
    from sparse_accumulation.ops.pair_sums import registered as ops
    from sparse_accumulation import indices

    s, z, env, first, second = random_inputs(generator)
    args = arguments(name, s, z, env, first, second)
    indices.clear()
    got = getattr(ops, name)(*args, "numba")
    assert not len(indices._pair_entries) and not len(indices._pairs_in_order)
    assert_close_to_oracle(got, LOOPS[name](*args), torch.float64)
    getattr(sa, name)(*args, implementation="numba")
    assert len(indices._pair_entries)
