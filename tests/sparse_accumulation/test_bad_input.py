"""Every bad input raises a clear Python exception naming the argument, before any kernel runs."""
import pytest
import torch

import sparse_accumulation as sa


@pytest.fixture
def good(generator):
    X1 = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    X2 = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    m1 = torch.tensor([0, 2, 1])
    m2 = torch.tensor([3, 0, 1])
    mu = torch.tensor([4, 0, 2])
    C = torch.randn(3, generator=generator, dtype=torch.float64)
    return dict(X1=X1, X2=X2, mu=mu, output_size=5, m1=m1, m2=m2, C=C)


def _call(args, function=sa.accumulate, **kwargs):
    return function(args["X1"], args["X2"], args["mu"], args["output_size"], args["m1"], args["m2"], args["C"],
                    **kwargs)


def _with(good, **changes):
    args = dict(good)
    args.update(changes)
    return args


@pytest.mark.parametrize("implementation", ["numba", "torch", "index_add", "loops"])
@pytest.mark.parametrize("name,position,size_name", [("m1", 1, "X1"), ("m2", 0, "X2"), ("mu", 2, "output_size")])
def test_index_out_of_range(good, implementation, name, position, size_name):
    for value in (-1, 99):
        index = good[name].clone()
        index[position] = value
        with pytest.raises(IndexError, match=rf"{name}.*{-1 if value < 0 else 99}|{name}.*negative"):
            _call(_with(good, **{name: index}), implementation=implementation)


def test_mu_equal_to_output_size_is_rejected(good):
    with pytest.raises(IndexError, match="mu.*output_size=4"):
        _call(_with(good, output_size=4))


def test_index_error_is_not_cached_away(good):
    """A rule fixed in place (new version counter) is re-validated; a broken one is caught again."""
    mu = good["mu"].clone()
    _call(_with(good, mu=mu))
    mu[0] = 7
    with pytest.raises(IndexError, match="mu"):
        _call(_with(good, mu=mu))
    mu[0] = 1
    _call(_with(good, mu=mu))


@pytest.mark.parametrize("name", ["m1", "m2", "mu"])
def test_index_arrays_must_be_1d_integer_and_equal_length(good, name):
    with pytest.raises(ValueError, match=f"{name} must be 1-D"):
        _call(_with(good, **{name: good[name].reshape(3, 1)}))
    with pytest.raises(TypeError, match=f"{name} must have an integer dtype"):
        _call(_with(good, **{name: good[name].double()}))
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor"):
        _call(_with(good, **{name: [0, 1, 2]}))
    with pytest.raises(ValueError, match="same length"):
        _call(_with(good, **{name: good[name][:2]}))


def test_coefficients_shape(good):
    with pytest.raises(ValueError, match="C must be 1-D"):
        _call(_with(good, C=good["C"][:2]))
    with pytest.raises(ValueError, match="C must be 1-D"):
        _call(_with(good, C=good["C"].reshape(3, 1)))


def test_leading_dimensions_must_broadcast(good):
    with pytest.raises(ValueError, match=r"X1 \(6, 3\), X2 \(5, 4\) do not broadcast"):
        _call(_with(good, X2=good["X2"][:5]))
    with pytest.raises(ValueError, match="do not broadcast"):
        _call(_with(good, X2=good["X2"].reshape(2, 3, 4)))


@pytest.mark.parametrize("name", ["X1", "X2", "C"])
def test_non_float_data(good, name):
    with pytest.raises(TypeError, match=f"{name} must have a floating dtype"):
        _call(_with(good, **{name: good[name].long()}))
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor"):
        _call(_with(good, **{name: good[name].numpy()}))


@pytest.mark.parametrize("name", ["X2", "C"])
def test_dtype_mismatch(good, name):
    with pytest.raises(TypeError, match=f"{name} has dtype torch.float32 but X1 has dtype torch.float64"):
        _call(_with(good, **{name: good[name].float()}))


@pytest.mark.parametrize("name", ["X2", "C", "m1", "mu"])
def test_different_devices(good, name):
    with pytest.raises(ValueError, match=f"{name} is on meta but X1 is on cpu"):
        _call(_with(good, **{name: good[name].to("meta")}))


def test_output_size_type_and_sign(good):
    with pytest.raises(TypeError, match="output_size must be an int"):
        _call(_with(good, output_size=5.0))
    with pytest.raises(TypeError, match="output_size must be an int"):
        _call(_with(good, output_size=True))
    with pytest.raises(ValueError, match="output_size must be non-negative"):
        _call(_with(good, output_size=-1))


def test_zero_dimensional_inputs(good):
    with pytest.raises(ValueError, match="at least one dimension"):
        _call(_with(good, X1=torch.tensor(1.0, dtype=torch.float64), X2=torch.tensor(1.0, dtype=torch.float64)))


def test_other_layouts_check_their_shapes(good):
    X1 = good["X1"].T.contiguous()
    with pytest.raises(ValueError, match="do not broadcast"):
        _call(_with(good, X1=X1, X2=good["X2"].T.contiguous()[:, :5]), sa.accumulate_active_dim_first)
    with pytest.raises(ValueError, match="at least two dimensions"):
        _call(_with(good, X1=X1[:, 0], X2=good["X2"][0]), sa.accumulate_active_dim_middle)
    with pytest.raises(IndexError, match="m2"):
        _call(_with(good, X1=X1, X2=good["X2"].T.contiguous()[:3]), sa.accumulate_active_dim_first)


def test_unknown_implementation(good):
    with pytest.raises(ValueError, match="implementation must be one of"):
        _call(good, implementation="cuda")


def test_unavailable_implementation_raises(good):
    with pytest.raises(RuntimeError, match="'triton' is not available for cpu"):
        _call(good, implementation="triton")


def test_a_rule_on_a_device_torch_does_not_have_is_refused_by_name():
    with pytest.raises(ValueError, match="device: .*device type at start of device string: gpu"):
        sa.get_cg_transformation_rule(1, 1, 1, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device='cuda', but torch .* sees no CUDA device"):
            sa.get_cg_transformation_rule(1, 1, 1, device="cuda")
    assert sa.get_cg_transformation_rule(1, 1, 1, device=torch.device("cpu"))[0].device.type == "cpu"
