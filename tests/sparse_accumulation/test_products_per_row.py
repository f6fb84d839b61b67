"""ClebschGordanProduct(weights="per_row"): a W[..., channels, n_paths] operand scales each path per row, in
the one fused call; values against a brute-force float64 loop, gradients (W included) to second order,
broadcasting, complex inputs and errors."""
import numpy as np
import pytest
import torch

import cg
import sparse_accumulation  # noqa: F401  (registers the ops)
from sparse_accumulation.products import ClebschGordanIteration, ClebschGordanProduct, irreps_dim

from accumulation_helpers import CountOps
from products_helpers import expand, relative_error

IRREPS1 = ((1, 0), (2, 1), (1, 2))
IRREPS2 = ((1, 0), (1, 1), (1, 2), (1, 3))

IMPLEMENTATIONS = ["numba", "torch", "index_add"]


def randn(generator, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def per_row_oracle(product, X1, X2, W):
    """Brute force in float64 / complex128 numpy: every path, every CG nonzero, times ``W[..., path]``."""
    complex_ = X1.is_complex()
    dtype = np.complex128 if complex_ else np.float64
    x1 = X1.detach().resolve_conj().numpy().astype(dtype)
    x2 = X2.detach().resolve_conj().numpy().astype(dtype)
    w = W.detach().double().numpy()
    lead = np.broadcast_shapes(x1.shape[:-1], x2.shape[:-1], w.shape[:-1])
    out = np.zeros(lead + (product.dim_out,), dtype=dtype)
    blocks1, blocks2 = expand(product.irreps1), expand(product.irreps2)
    for path in product.paths:
        dense = cg.clebsch_gordan(path.l1, path.l2, path.L, basis=product.basis)
        o1, o2 = blocks1[path.block1][1], blocks2[path.block2][1]
        for a, b, c in zip(*np.nonzero(dense)):
            out[..., path.offset_out + c] += (x1[..., o1 + a] * x2[..., o2 + b] * w[..., path.index]
                                              * dense[a, b, c])
    return torch.from_numpy(out)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("basis", ["real", "e3nn"])
def test_matches_brute_force_with_shared_second_operand(generator, implementation, basis):
    """X2 [E, 1, dim2] (spherical harmonics of an edge) meets every channel of X1 [E, F, dim1], W [E, F, n]."""
    product = ClebschGordanProduct(IRREPS1, IRREPS2, 3, basis=basis, weights="per_row", dtype=torch.float64,
                                   implementation=implementation)
    assert product.per_row and product.weight is None and product.rule.weighted
    assert product.rule.weight_size == product.n_paths
    E, F = 7, 3
    X1 = randn(generator, E, F, irreps_dim(IRREPS1))
    X2 = randn(generator, E, 1, irreps_dim(IRREPS2))
    W = randn(generator, E, F, product.n_paths)
    out = product(X1, X2, W)
    assert out.shape == (E, F, product.dim_out)
    assert relative_error(out, per_row_oracle(product, X1, X2, W)) < 1e-13


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_weights_broadcast_and_strided(generator, implementation):
    """W shared over the leading dimension ([F, n]) and W as a transposed view ([E, n, F] -> [E, F, n])."""
    product = ClebschGordanProduct(2, 2, 2, weights="per_row", dtype=torch.float64, implementation=implementation)
    X1, X2 = randn(generator, 5, 4, 9), randn(generator, 5, 1, 9)
    W_channels = randn(generator, 4, product.n_paths)
    assert relative_error(product(X1, X2, W_channels), per_row_oracle(product, X1, X2, W_channels)) < 1e-13
    W_transposed = randn(generator, 5, product.n_paths, 4).transpose(-1, -2)
    assert relative_error(product(X1, X2, W_transposed), per_row_oracle(product, X1, X2, W_transposed)) < 1e-13


def test_constant_rows_equal_shared_path_weights(generator):
    """W equal in every row gives the product with those weights folded into the coefficients."""
    shared = ClebschGordanProduct(IRREPS1, IRREPS2, 3, weights=True, normalization="norm", dtype=torch.float64)
    per_row = ClebschGordanProduct(IRREPS1, IRREPS2, 3, weights="per_row", normalization="norm",
                                   dtype=torch.float64, implementation="torch")
    with torch.no_grad():
        shared.weight.copy_(randn(generator, shared.n_paths))
    X1, X2 = randn(generator, 6, 2, irreps_dim(IRREPS1)), randn(generator, 6, 2, irreps_dim(IRREPS2))
    W = shared.weight.detach().expand(6, 2, -1)
    assert relative_error(per_row(X1, X2, W), shared(X1, X2)) < 1e-13


def test_gradcheck_and_gradgradcheck_with_weights(generator):
    product = ClebschGordanProduct(((1, 1), (1, 2)), 2, 3, weights="per_row", dtype=torch.float64,
                                   implementation="torch")
    X1 = randn(generator, 3, 2, 8).requires_grad_()
    X2 = randn(generator, 3, 1, 9).requires_grad_()  # broadcast over the channels: its gradient is summed
    W = randn(generator, 3, 2, product.n_paths).requires_grad_()
    assert torch.autograd.gradcheck(product, (X1, X2, W))
    assert torch.autograd.gradgradcheck(product, (X1, X2, W))


def test_weight_gradient_is_the_per_path_product(generator):
    """dL/dW[..., p] = <G_path p, unweighted path p> per row and channel."""
    product = ClebschGordanProduct(IRREPS1, IRREPS2, 3, weights="per_row", dtype=torch.float64,
                                   implementation="torch")
    X1, X2 = randn(generator, 4, 3, irreps_dim(IRREPS1)), randn(generator, 4, 1, irreps_dim(IRREPS2))
    W = randn(generator, 4, 3, product.n_paths).requires_grad_()
    G = randn(generator, 4, 3, product.dim_out)
    (product(X1, X2, W) * G).sum().backward()
    unweighted = per_row_oracle(product, X1, X2, torch.ones(product.n_paths, dtype=torch.float64))
    expected = torch.stack([(G * unweighted)[..., p.offset_out:p.offset_out + 2 * p.L + 1].sum(-1)
                            for p in product.paths], dim=-1)
    assert relative_error(W.grad, expected) < 1e-12


def test_one_fused_call_forward_and_backward(generator):
    product = ClebschGordanProduct(3, 3, 3, weights="per_row", dtype=torch.float64, implementation="torch")
    X1 = randn(generator, 6, 2, 16).requires_grad_()
    X2 = randn(generator, 6, 1, 16).requires_grad_()
    W = randn(generator, 6, 2, product.n_paths).requires_grad_()
    with CountOps() as forward:
        out = product(X1, X2, W)
    assert forward.calls == ["accumulate"]
    with CountOps() as backward:
        out.sum().backward()
    assert backward.calls == ["accumulate_backward"]
    assert all(t.grad is not None for t in (X1, X2, W))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_inputs_with_real_weights(generator, dtype):
    product = ClebschGordanProduct(((1, 0), (1, 1), (2, 2)), 3, 4, basis="complex", weights="per_row",
                                   dtype=torch.float64, implementation="torch")
    X1 = torch.complex(randn(generator, 5, 3, 14), randn(generator, 5, 3, 14)).to(dtype)
    X2 = torch.complex(randn(generator, 5, 1, 16), randn(generator, 5, 1, 16)).to(dtype)
    W = randn(generator, 5, 3, product.n_paths, dtype=X1.real.dtype)
    out = product(X1, X2, W)
    assert out.dtype == dtype and out.shape == (5, 3, product.dim_out)
    tolerance = 1e-5 if dtype == torch.complex64 else 1e-13
    assert relative_error(out, per_row_oracle(product, X1, X2, W)) < tolerance
    with pytest.raises(TypeError, match="W must be real"):
        product(X1, X2, W.to(dtype))


def test_errors(generator):
    with pytest.raises(ValueError, match="weights must be one of"):
        ClebschGordanProduct(2, 2, weights="per_path")
    with pytest.raises(ValueError, match="per-row weights"):
        ClebschGordanIteration(2, nu_max=3, weights="per_row")
    per_row = ClebschGordanProduct(1, 1, weights="per_row", dtype=torch.float64, implementation="torch")
    plain = ClebschGordanProduct(1, 1, dtype=torch.float64)
    X = randn(generator, 2, 3, 4)
    with pytest.raises(ValueError, match="W .* is required"):
        per_row(X, X)
    with pytest.raises(ValueError, match="no per-row weights"):
        plain(X, X, randn(generator, 2, 3, plain.n_paths))
    with pytest.raises(ValueError, match=rf"\[\.\.\., channels, {per_row.n_paths}\]"):
        per_row(X, X, randn(generator, 2, 3, per_row.n_paths + 1))
    with pytest.raises(TypeError, match="W must be a torch.Tensor"):
        per_row(X, X, [1.0] * per_row.n_paths)
    with pytest.raises(TypeError, match="dtype"):
        per_row(X, X, randn(generator, 2, 3, per_row.n_paths, dtype=torch.float32))
    with pytest.raises(ValueError, match="do not broadcast"):
        per_row(X, X, randn(generator, 4, 3, per_row.n_paths))
    assert "weights=per_row" in repr(per_row)
