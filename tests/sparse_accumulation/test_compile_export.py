"""torch.compile and torch.export of code that calls the op through a Rule (the rule ops), on the CPU."""
import subprocess
import sys

import pytest
import torch

import sparse_accumulation as sa
from accumulation_helpers import assert_close_to
from products_helpers import PathAndProduct, path_and_product_inputs


def test_export_runs_and_keeps_the_rule_ops(generator, tmp_path):
    model = PathAndProduct()
    inputs = path_and_product_inputs(generator)
    program = torch.export.export(model, inputs)
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "sparse_accumulation.accumulate.default" in targets
    assert_close_to(program.module()(*inputs), model(*inputs), torch.float64)
    path = tmp_path / "model.pt2"
    torch.export.save(program, str(path))
    torch.save(inputs, tmp_path / "inputs.pt")
    torch.save(model(*inputs), tmp_path / "expected.pt")
    # a fresh process rebuilds the rules from the keys stored in the graph
    code = (f"import torch, sparse_accumulation\n"
            f"program = torch.export.load({str(path)!r})\n"
            f"inputs = torch.load({str(tmp_path / 'inputs.pt')!r})\n"
            f"expected = torch.load({str(tmp_path / 'expected.pt')!r})\n"
            f"print(float((program.module()(*inputs) - expected).abs().max()))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.strip()) <= 1e-12


def test_export_with_a_dynamic_batch_dimension(generator):
    model = PathAndProduct()
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(model, path_and_product_inputs(generator),
                                  dynamic_shapes=({0: batch}, {0: batch}, {0: batch}))
    for rows in (3, 17):
        inputs = path_and_product_inputs(generator, rows)
        assert_close_to(program.module()(*inputs), model(*inputs), torch.float64)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_rule_calls_match_eager(generator, backend):
    """Forward and first derivatives of compiled rule calls (broadcast operands, weighted rule) equal eager."""
    torch._dynamo.reset()
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 2, dtype=torch.float64)
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(5, 3))
    paths = torch.randint(0, 2, (len(C),), generator=generator)
    weighted = sa.Rule(m1, m2, mu, 5, input_sizes=(5, 3), w=paths, weight_size=2)

    def step(X1, X2, W, C):
        plain = sa.accumulate_rule(X1.sin(), X2, rule, C)
        scaled = sa.accumulate_rule(X1, X2, weighted, C, W, implementation="torch")
        return (plain * scaled).sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for edges in (4, 9):
        X1 = torch.randn(edges, 3, 5, generator=generator, dtype=torch.float64, requires_grad=True)
        X2 = torch.randn(edges, 1, 3, generator=generator, dtype=torch.float64, requires_grad=True)
        W = torch.randn(edges, 3, 2, generator=generator, dtype=torch.float64, requires_grad=True)
        C_ = C.clone().requires_grad_()
        got, expected = compiled(X1, X2, W, C_), step(X1, X2, W, C_)
        assert_close_to(got, expected, torch.float64)
        for a, b in zip(torch.autograd.grad(got, (X1, X2, W, C_)), torch.autograd.grad(expected, (X1, X2, W, C_))):
            assert_close_to(a, b, torch.float64)
