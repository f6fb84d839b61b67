"""Bad input to envsum, sensesum and featsum: a clear exception naming the argument, no output, inputs unchanged."""
import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation import indices
from pair_sums_helpers import arguments, random_inputs

SUMS = ["envsum", "sensesum", "featsum"]
DATA_NAMES = {"envsum": ("sensitivities", "features"), "sensesum": ("env", "features"), "featsum": ("env", "sense")}


@pytest.fixture
def inputs(generator):
    return random_inputs(generator, n_atoms=6, n_pairs=20, n_nu=3, n_feat=4)


def _call(name, args, **kwargs):
    return getattr(sa, name)(*args, **kwargs)


@pytest.mark.parametrize("implementation", ["numba", "torch", "index_add"])
@pytest.mark.parametrize("name", SUMS)
@pytest.mark.parametrize("which", ["pair_first", "pair_second"])
@pytest.mark.parametrize("value", [-1, 6, 99])
def test_index_out_of_range(inputs, implementation, name, which, value):
    s, z, env, first, second = inputs
    bad = (first if which == "pair_first" else second).clone()
    bad[7] = value
    pairs = (bad, second) if which == "pair_first" else (first, bad)
    args = arguments(name, s, z, env, *pairs)
    before = [t.clone() for t in args]
    with pytest.raises(IndexError, match=rf"{which}.*\[0, 6\).*{which}\[7\] = {value}"):
        _call(name, args, implementation=implementation)
    for t, original in zip(args, before):
        assert torch.equal(t, original)


def test_an_index_fixed_in_place_is_checked_again(inputs):
    s, z, env, first, second = inputs
    second = second.clone()
    sa.envsum(s, z, first, second)
    second[0] = 17
    with pytest.raises(IndexError, match="pair_second"):
        sa.envsum(s, z, first, second)
    second[0] = 5
    assert sa.envsum(s, z, first, second).shape == env.shape


@pytest.mark.parametrize("name", SUMS)
def test_mismatched_pair_counts(inputs, name):
    s, z, env, first, second = inputs
    with pytest.raises(ValueError, match="pair_second has 19 pairs"):
        _call(name, arguments(name, s, z, env, first, second[:-1]))
    if name != "sensesum":
        data_name = DATA_NAMES[name][1 if name == "featsum" else 0]
        with pytest.raises(ValueError, match=f"pair_first has 19 pairs but {data_name} has 20"):
            _call(name, arguments(name, s, z, env, first[:-1], second[:-1]))


def test_mismatched_sizes(inputs):
    s, z, env, first, second = inputs
    with pytest.raises(ValueError, match=r"n_atoms: env.shape\[0\] is 6 but features.shape\[0\] is 5"):
        sa.sensesum(env, z[:5], first, second)
    with pytest.raises(ValueError, match=r"n_feat: env.shape\[2\] is 4 but features.shape\[1\] is 3"):
        sa.sensesum(env, z[:, :3], first, second)
    with pytest.raises(ValueError, match=r"n_nu: env.shape\[1\] is 3 but sense.shape\[1\] is 2"):
        sa.featsum(env, s[:, :2], first, second)


@pytest.mark.parametrize("name", SUMS)
def test_wrong_dimensions(inputs, name):
    s, z, env, first, second = inputs
    args = list(arguments(name, s, z, env, first, second))
    data = DATA_NAMES[name]
    with pytest.raises(ValueError, match=f"{data[0]} must have {args[0].dim()} dimensions"):
        _call(name, [args[0].unsqueeze(0)] + args[1:])
    with pytest.raises(ValueError, match="pair_first must be 1-D"):
        _call(name, args[:2] + [first.unsqueeze(1), second])


@pytest.mark.parametrize("name", SUMS)
def test_wrong_dtypes(inputs, name):
    s, z, env, first, second = inputs
    args = list(arguments(name, s, z, env, first, second))
    data = DATA_NAMES[name]
    with pytest.raises(TypeError, match=f"{data[1]} has dtype torch.float32 but {data[0]} has torch.float64"):
        _call(name, [args[0], args[1].float()] + args[2:])
    with pytest.raises(TypeError, match=f"{data[0]} must be float16, bfloat16, float32 or float64, got torch.int64"):
        _call(name, [args[0].long()] + args[1:])
    for dtype in (torch.float64, torch.int16, torch.uint8, torch.bool):
        with pytest.raises(TypeError, match=f"pair_second must be int64 or int32, got {dtype}"):
            _call(name, args[:3] + [second.to(dtype)])
    with pytest.raises(TypeError, match="pair_first must be a torch.Tensor, got list"):
        _call(name, args[:2] + [first.tolist(), second])


@pytest.mark.parametrize("name", SUMS)
def test_wrong_device(inputs, name):
    s, z, env, first, second = inputs
    args = list(arguments(name, s, z, env, first, second))
    data = DATA_NAMES[name]
    with pytest.raises(ValueError, match=f"{data[1]} is on meta but {data[0]} is on cpu"):
        _call(name, [args[0], args[1].to("meta")] + args[2:])
    with pytest.raises(ValueError, match="pair_first is on meta but the data is on cpu"):
        _call(name, args[:2] + [first.to("meta"), second])


def test_unknown_implementation(inputs):
    s, z, env, first, second = inputs
    for implementation in ("dense", "cuda", 3):
        with pytest.raises(ValueError, match="implementation must be one of auto, numba, triton, torch, index_add"):
            sa.envsum(s, z, first, second, implementation=implementation)
    with pytest.raises(RuntimeError, match="implementation 'numba' is not available for meta tensors"):
        sa.envsum(*(t.to("meta") for t in (s, z, first, second)), implementation="numba")


def test_segments_cache(inputs):
    """The cache finds a tensor again while it is unchanged; inference tensors are never cached."""
    s, z, env, first, second = inputs
    entry = indices.pair_index(first, 6)
    assert indices.pair_index(first, 6) is entry
    assert indices.pair_index(first, 7) is not entry
    first.add_(0)  # a new version
    assert indices.pair_index(first, 6) is not entry
    with torch.inference_mode():
        frozen = first.clone()
    assert indices.pair_index(frozen, 6) is not indices.pair_index(frozen, 6)
    assert sa.envsum(s, z, frozen, second).shape == env.shape


def test_segments_are_a_stable_sort(generator):
    key = torch.randint(0, 9, (200,), generator=generator)
    order, offsets = indices.pair_index(key, 10).segments("key")
    expected_order = torch.sort(key, stable=True).indices
    assert torch.equal(order, expected_order)
    assert torch.equal(offsets, torch.searchsorted(key[expected_order], torch.arange(11)))
    assert torch.equal(indices.segments(key, 10)[1], expected_order)
