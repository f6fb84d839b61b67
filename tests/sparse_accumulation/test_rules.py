"""The Rule handle: validation, interning, its key, pickling, swapped rules, and calls that never read indices."""
import copy
import pickle

import numpy as np
import pytest
import torch

import sparse_accumulation as sa
import sparse_accumulation.indices
import sparse_accumulation.ops.accumulate.api
import sparse_accumulation.ops.accumulate.registered
from accumulation_helpers import assert_close_to, oracle, random_rule


def test_rule_from_tensors_arrays_and_lists_is_interned():
    m1, m2, mu = [0, 2, 1, 0], [1, 0, 1, 1], [3, 0, 2, 3]
    a = sa.Rule(torch.tensor(m1), torch.tensor(m2, dtype=torch.int32), torch.tensor(mu), 4, input_sizes=(3, 2))
    b = sa.Rule(np.array(m1), np.array(m2), np.array(mu), 4, input_sizes=(3, 2))
    c = sa.Rule(m1, m2, mu, 4, input_sizes=(3, 2))
    assert a is b is c
    assert (a.m1, a.m2, a.mu, a.nnz, a.input_sizes, a.output_size) == (tuple(m1), tuple(m2), tuple(mu), 4, (3, 2), 4)
    assert sa.Rule(m1, m2, mu, 5, input_sizes=(3, 2)) is not a  # another output size is another rule
    assert sa.Rule(m1, m2, mu, 4).input_sizes == (3, 2)  # default: largest index plus one
    with pytest.raises(AttributeError):
        a.output_size = 7


def test_rule_key_round_trips_through_pickle_copy_and_from_key():
    rule = sa.Rule([0, 1, 1], [2, 0, 1], [1, 1, 0], 2, input_sizes=(2, 3), w=[0, 1, 0], weight_size=2)
    assert rule.weighted and rule.weight_size == 2
    for clone in (pickle.loads(pickle.dumps(rule)), copy.deepcopy(rule), copy.copy(rule), sa.Rule.from_key(rule.key)):
        assert clone is rule
    with pytest.raises(ValueError, match="not a sparse accumulation rule key"):
        sa.Rule.from_key("v9:nonsense")


def test_a_rule_rebuilds_from_its_key_alone():
    """A key names the whole rule: after every object is gone, the key still gives the same indices."""
    rule = sa.Rule([3, 1], [0, 0], [2, 2], 3, input_sizes=(4, 1))
    key, indices = rule.key, (rule.m1, rule.m2, rule.mu)
    del rule
    rebuilt = sa.Rule.from_key(key)
    assert (rebuilt.m1, rebuilt.m2, rebuilt.mu, rebuilt.input_sizes, rebuilt.output_size) == indices + ((4, 1), 3)


def test_a_descriptor_found_by_key_stays_alive_for_later_lookups(monkeypatch):
    """A key that only a compiled graph holds is decoded once: what it rebuilt is held among the most recently
    found, so that later calls find it alive (without that, a warm compile cache's graphs rebuilt a gradient's
    program on every call); the oldest is let go past the limit."""
    import gc

    from sparse_accumulation.descriptors import interning

    monkeypatch.setattr(interning, "RECENT", 2)
    monkeypatch.setattr(sa.Rule, "_recent", type(sa.Rule._recent)())
    keys = [sa.Rule([i, 1], [0, 0], [1, 0], 2, input_sizes=(5, 1)).key for i in range(3)]
    gc.collect()
    decoded = []
    decode = sa.Rule._decode.__func__
    monkeypatch.setattr(sa.Rule, "_decode", classmethod(lambda cls, key: decoded.append(key) or decode(cls, key)))
    for key in keys:
        sa.Rule.from_key(key)
    gc.collect()  # what nothing holds is gone now
    for key in keys[1:]:
        sa.Rule.from_key(key)
    assert decoded == keys  # the last two found again alive
    sa.Rule.from_key(keys[0])
    assert decoded == keys + keys[:1]  # the first was let go, the limit being 2


@pytest.mark.parametrize("changes, error, match", [
    (dict(m1=[0, 5]), IndexError, "m1 contains index 5, out of range for M1=3"),
    (dict(mu=[0, -1]), IndexError, "mu contains a negative index"),
    (dict(m2=[0]), ValueError, "same length"),
    (dict(m1=[0.5, 1.0]), TypeError, "m1 must hold integers"),
    (dict(m1=torch.tensor([0.0, 1.0])), TypeError, "m1 must have an integer dtype"),
    (dict(output_size=-1), ValueError, "output_size must be a non-negative int"),
    (dict(w=[0, 3], weight_size=2), IndexError, "w contains index 3"),
    (dict(weight_size=2), ValueError, "weight_size is given but w is not"),
    (dict(m1=[[0, 1]]), ValueError, "m1 must be 1-D"),
])
def test_rule_errors_name_the_argument(changes, error, match):
    arguments = dict(m1=[0, 1], m2=[1, 0], mu=[0, 1], output_size=2, input_sizes=(3, 2))
    arguments.update(changes)
    with pytest.raises(error, match=match):
        sa.Rule(arguments.pop("m1"), arguments.pop("m2"), arguments.pop("mu"), arguments.pop("output_size"),
                **arguments)


def test_swapped_rules_trade_an_operand_with_the_output():
    rule = sa.Rule([0, 1], [2, 0], [1, 0], 2, input_sizes=(2, 3), w=[1, 0], weight_size=2)
    x1 = rule.swapped("X1")
    assert (x1.m1, x1.m2, x1.mu, x1.w, x1.input_sizes, x1.output_size, x1.weight_size) == (
        rule.mu, rule.m2, rule.m1, rule.w, (2, 3), 2, 2)
    w = rule.swapped("W")
    assert (w.m1, w.m2, w.w, w.mu, w.weight_size, w.output_size) == (rule.m1, rule.m2, rule.mu, rule.w, 2, 2)
    assert rule.swapped("X2").swapped("X2") is rule
    with pytest.raises(ValueError, match="role"):
        sa.Rule([0], [0], [0], 1).swapped("W")


def test_accumulate_rule_matches_the_tensor_api_and_checks_its_arguments(generator):
    m1, m2, mu, C = random_rule(generator, 4, 3, 5, nnz=12)
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(4, 3))
    X1 = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    X2 = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    assert_close_to(sa.accumulate_rule(X1, X2, rule, C), oracle(X1, X2, mu, 5, m1, m2, C), torch.float64)
    with pytest.raises(TypeError, match="rule must be a sparse_accumulation.Rule"):
        sa.accumulate_rule(X1, X2, (m1, m2, mu), C)
    with pytest.raises(ValueError, match=r"X2 must end with a dimension of size 3 for this rule"):
        sa.accumulate_rule(X1, X1, rule, C)
    with pytest.raises(ValueError, match="W was given but the rule has no weight indices"):
        sa.accumulate_rule(X1, X2, rule, C, X1)
    with pytest.raises(ValueError, match="C must be 1-D"):
        sa.accumulate_rule(X1, X2, rule, C[:3])
    weighted = sa.Rule(m1, m2, mu, 5, input_sizes=(4, 3), w=torch.zeros(12, dtype=torch.long), weight_size=1)
    with pytest.raises(ValueError, match="W is required for a weighted rule"):
        sa.accumulate_rule(X1, X2, weighted, C)


def test_calls_with_a_rule_never_read_indices(generator, monkeypatch):
    """Modules hold rules: forward, backward and double backward run without preparing any index tensor."""
    module = sa.CGCalculatorSingle(2, 1, 2, dtype=torch.float64)
    product = sa.ClebschGordanProduct(1, 1, weights=True, dtype=torch.float64)

    def fail(*args, **kwargs):
        raise AssertionError("index tensors were read during a call")

    monkeypatch.setattr(sparse_accumulation.indices, "prepare_rule", fail)
    monkeypatch.setattr(sparse_accumulation.ops.accumulate.api, "prepare_rule", fail)
    monkeypatch.setattr(sparse_accumulation.ops.accumulate.registered, "prepare_rule", fail)
    X1 = torch.randn(7, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    X2 = torch.randn(7, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    out = module(X1, X2)
    (g1,) = torch.autograd.grad(out.pow(2).sum(), X1, create_graph=True)
    g1.sum().backward()
    F = torch.randn(7, 2, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    product(F, F).sum().backward()
    assert F.grad is not None and product.weight.grad is not None
