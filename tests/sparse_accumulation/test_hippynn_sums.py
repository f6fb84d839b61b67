"""envsum, sensesum and featsum on the CPU against an independent float64 loop oracle: every implementation,
dtype and pair pattern, gradients to second order, empty inputs, non-finite values and reproducibility."""
import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation.kernels.numba import pair_sums as numba_pair_sums
from pair_sums_helpers import DTYPES, LOOPS, arguments, assert_close_to_oracle, random_inputs

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

IMPLEMENTATIONS = ["numba", "torch", "index_add"]
SUMS = ["envsum", "sensesum", "featsum"]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", SUMS)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_against_loops_unsorted_repeated_and_self_pairs(generator, implementation, name, index_dtype):
    s, z, env, first, second = random_inputs(generator, index_dtype=index_dtype)
    args = arguments(name, s, z, env, first, second)
    got = getattr(sa, name)(*args, implementation=implementation)
    assert got.dtype == torch.float64
    assert_close_to_oracle(got, LOOPS[name](*args), torch.float64)


@pytest.mark.parametrize("implementation", ["numba", "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(generator, implementation, dtype):
    s, z, env, first, second = random_inputs(generator, n_pairs=50, n_nu=6, n_feat=9, dtype=dtype)
    for name in SUMS:
        args = arguments(name, s, z, env, first, second)
        got = getattr(sa, name)(*args, implementation=implementation)
        assert got.dtype == dtype
        assert_close_to_oracle(got, LOOPS[name](*args), dtype)


def test_sparse_sensitivities_and_an_atom_without_pairs(generator):
    """Zero sensitivities (left out by the numba kernels) and atoms that are in no pair (zero rows)."""
    s, z, env, first, second = random_inputs(generator, n_atoms=9, n_pairs=60, n_nu=7, n_feat=5, sparse=True)
    for name in SUMS:
        args = arguments(name, s, z, env, first, second)
        got = getattr(sa, name)(*args, implementation="numba")
        assert_close_to_oracle(got, LOOPS[name](*args), torch.float64)
    assert torch.count_nonzero(sa.envsum(s, z, first, second)[-1]) == 0
    assert torch.count_nonzero(sa.featsum(env, s, first, second)[-1]) == 0


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_non_finite_values_propagate_as_in_the_formulas(generator, implementation):
    """A zero sensitivity times an infinite feature is NaN, as in the gather formulas: terms are only left out
    where that changes nothing."""
    s, z, env, first, second = random_inputs(generator, n_pairs=30, sparse=True)
    z[second[3], 2] = float("inf")
    s[3] = 0.0
    env[first[5], 1, 4] = float("nan")
    s[5, 1] = 0.0
    for name in SUMS:
        args = arguments(name, s, z, env, first, second)
        got = getattr(sa, name)(*args, implementation=implementation)
        expected = LOOPS[name](*args)
        assert torch.equal(torch.isnan(got), torch.isnan(expected)), name
        assert torch.equal(torch.isinf(got), torch.isinf(expected)), name
        finite = torch.isfinite(expected)
        assert_close_to_oracle(got[finite], expected[finite], torch.float64)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_no_pairs(generator, implementation):
    s, z, env, first, second = random_inputs(generator, n_pairs=0)
    assert torch.equal(sa.envsum(s, z, first, second, implementation=implementation), torch.zeros_like(env))
    assert sa.sensesum(env, z, first, second, implementation=implementation).shape == (0, env.shape[1])
    assert torch.equal(sa.featsum(env, s, first, second, implementation=implementation), torch.zeros_like(z))
    s.requires_grad_()
    z.requires_grad_()
    sa.envsum(s, z, first, second, implementation=implementation).sum().backward()
    assert s.grad.shape == s.shape and torch.equal(z.grad, torch.zeros_like(z))


def _grad_inputs(generator):
    s, z, env, first, second = random_inputs(generator, n_atoms=5, n_pairs=12, n_nu=3, n_feat=4)
    return [t.requires_grad_() for t in (s, z, env)], first, second


@pytest.mark.parametrize("name", SUMS)
def test_gradcheck_and_gradgradcheck(generator, name):
    (s, z, env), first, second = _grad_inputs(generator)
    data = arguments(name, s, z, env, first, second)[:2]

    def function(a, b):
        return getattr(sa, name)(a, b, first, second, implementation="numba")

    assert torch.autograd.gradcheck(function, data)
    assert torch.autograd.gradgradcheck(function, data)


def test_gradients_match_the_reference_formulas(generator):
    """Forward, backward and double backward of a force-like loss against torch's autograd of the formulas."""
    (s, z, env), first, second = _grad_inputs(generator)

    def loss(implementation):
        env_out = sa.envsum(s, z, first, second, implementation=implementation)
        energy = (env_out ** 2).sum() + sa.featsum(env_out, s, first, second, implementation=implementation).sum()
        (dz,) = torch.autograd.grad(energy, z, create_graph=True)
        return torch.autograd.grad((dz ** 2).sum(), (s, z))

    for got, expected in zip(loss("numba"), loss("index_add")):
        assert_close_to_oracle(got, expected.detach(), torch.float64)


def test_non_contiguous_inputs(generator):
    s, z, env, first, second = random_inputs(generator, n_pairs=30)
    s_t = s.T.contiguous().T
    z_t = z.T.contiguous().T
    env_t = env.transpose(1, 2).contiguous().transpose(1, 2)
    pairs = torch.stack([first, second], 1)  # pair_first and pair_second as strided views
    for name in SUMS:
        got = getattr(sa, name)(*arguments(name, s_t, z_t, env_t, pairs[:, 0], pairs[:, 1]))
        assert_close_to_oracle(got, LOOPS[name](*arguments(name, s, z, env, first, second)), torch.float64)


def test_threaded_tasks_give_the_serial_results_bitwise(generator, monkeypatch):
    """Tasks are cut from the shapes; each output element is summed by one task in one order."""
    s, z, env, first, second = random_inputs(generator, n_atoms=60, n_pairs=900, n_nu=6, n_feat=8,
                                             dtype=torch.float32, sparse=True)
    serial = [getattr(sa, name)(*arguments(name, s, z, env, first, second)) for name in SUMS]
    monkeypatch.setattr(numba_pair_sums, "SERIAL_WORK", 0)
    monkeypatch.setattr(numba_pair_sums, "TASK_WORK", 256)
    assert len(numba_pair_sums._tasks(torch.arange(61).numpy() * 15, 48, 48)) > 4
    for name, expected in zip(SUMS, serial):
        assert torch.equal(getattr(sa, name)(*arguments(name, s, z, env, first, second)), expected)


def test_default_implementation_is_followed(generator):
    s, z, env, first, second = random_inputs(generator)
    previous = sa.get_default_implementation()
    try:
        sa.set_default_implementation("index_add")
        s.requires_grad_()
        out = sa.envsum(s, z, first, second)
        assert out.grad_fn is not None and "IndexAdd" in type(out.grad_fn).__name__
    finally:
        sa.set_default_implementation(previous)
