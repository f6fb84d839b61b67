"""A compiled model run again in a new process with the same (warm) inductor cache: the graphs loaded from the
cache name rules, channel rules and polynomial programs by key, including the derivative programs and swapped
rules that a backward makes, which the new process never made; each is found or rebuilt from its key, once."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sparse_accumulation as sa

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    import sparse_accumulation as sa
    from sparse_accumulation.mace import SymmetricContraction

    torch.manual_seed(0)
    device = sys.argv[1]
    m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1, dtype=torch.float64)
    rule, C = sa.Rule(m1, m2, mu, 3), C.to(device)
    contraction = SymmetricContraction("4x0e + 4x1o", "4x0e + 4x1o", correlation=3, num_elements=2,
                                       dtype=torch.float64).to(device)
    nodes, edges = 6, 20
    src, dst = torch.randint(0, nodes, (edges,), device=device), torch.randint(0, nodes, (edges,), device=device)
    pairs = torch.randint(0, nodes, (edges,), device=device), torch.randint(0, nodes, (edges,), device=device)
    elements = torch.randint(0, 2, (nodes,), device=device)

    def energy(x, vectors):
        a = sa.accumulate_rule(vectors, vectors, rule, C)                                     # a rule
        h = sa.accumulate_rule(x, a, rule, C, indices_1=src, indices_out=dst, size_out=nodes)  # a channel rule
        features = torch.cat([h[:, :, :1], h], dim=2)                                         # [nodes, 4, 4]
        b = contraction(features, elements)                                                   # a program
        env = sa.envsum(vectors[:, 0, :2].contiguous(), b, *pairs)                            # pair sums
        return (b ** 2).sum() + env.sum()

    x = torch.randn(nodes, 4, 3, dtype=torch.float64, device=device, requires_grad=True)
    vectors = torch.randn(edges, 1, 3, dtype=torch.float64, device=device, requires_grad=True)
    compiled = torch.compile(energy, fullgraph=True)
    value = compiled(x, vectors)
    grads = torch.autograd.grad(value, (x, vectors))
    expected = energy(x, vectors)
    expected_grads = torch.autograd.grad(expected, (x, vectors))

    # later calls: every descriptor a graph names by key is found alive, none decoded again
    import gc
    from sparse_accumulation.descriptors.channel_rules import ChannelRule
    from sparse_accumulation.descriptors.programs import Program

    decoded = []
    for kind in (sa.Rule, ChannelRule, Program):
        kind._decode = classmethod(lambda cls, key, decode=kind._decode.__func__: decoded.append(cls.__name__)
                                   or decode(cls, key))
    for _ in range(3):
        gc.collect()
        torch.autograd.grad(compiled(x, vectors), (x, vectors))
    print(json.dumps({"value": value.item(), "expected": expected.item(),
                      "grads": [g.sum().item() for g in grads],
                      "expected_grads": [g.sum().item() for g in expected_grads], "decoded_later": decoded}))
''')


REBUILD = textwrap.dedent('''
    import json, sys
    from sparse_accumulation.descriptors.channel_rules import ChannelRule
    from sparse_accumulation.descriptors.programs import Program
    from sparse_accumulation import Rule

    keys = json.loads(sys.stdin.read())
    made = {"rule": Rule.from_key(keys["rule"]), "channel_rule": ChannelRule.from_key(keys["channel_rule"]),
            "program": Program.from_key(keys["program"])}
    print(json.dumps({name: [d.key == keys[name], repr(d)] for name, d in made.items()}))
''')


def test_descriptors_are_rebuilt_from_their_keys_in_a_new_process():
    """Keys of descriptors made only here (a swapped rule, a channel rule, a second derivative program) name the
    same descriptors in a process that never made them."""
    from sparse_accumulation.descriptors.channel_rules import ChannelRule
    from sparse_accumulation.mace import SymmetricContraction

    m1, m2, mu, _ = sa.get_cg_transformation_rule(2, 1, 2)
    rule = sa.Rule(m1, m2, mu, 5).swapped("X2")
    channel_rule = ChannelRule.regular(rule, 3, (3, 1, 1, 3))
    program = SymmetricContraction("3x0e + 3x1o", "3x1o", correlation=3, num_elements=2).program
    program = program.derivative((0, 1), (True,)).derivative((0,), (True, False))
    made = {"rule": rule, "channel_rule": channel_rule, "program": program}
    done = subprocess.run([sys.executable, "-c", REBUILD], input=json.dumps({k: d.key for k, d in made.items()}),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rebuilt = json.loads(done.stdout.strip().splitlines()[-1])
    for name, d in made.items():
        assert rebuilt[name] == [True, repr(d)], name


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_compiled_graphs_run_in_a_new_process_from_a_warm_cache(tmp_path, device):
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    runs = []
    for _ in range(2):  # a cold cache, then a new process on the warm one
        done = subprocess.run([sys.executable, str(script), device], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for run in runs:
        assert run["decoded_later"] == []
        assert run["value"] == pytest.approx(run["expected"], rel=1e-10)
        assert run["grads"] == pytest.approx(run["expected_grads"], rel=1e-10)
    assert runs[1]["value"] == pytest.approx(runs[0]["value"], rel=1e-12)
