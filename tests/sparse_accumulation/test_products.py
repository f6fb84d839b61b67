"""ClebschGordanProduct / ClebschGordanIteration: values against a per-path dense oracle, layouts, options,
learnable weights, complex inputs, gradients, one fused call, torch.compile and errors."""
import math

import numpy as np
import pytest
import torch

import cg
import sparse_accumulation  # noqa: F401  (registers the ops)
from sparse_accumulation.products import (ClebschGordanIteration, ClebschGordanProduct, concatenate,
                                          from_e3nn_layout, irreps_dim, normalize_irreps, split, to_e3nn_layout)

from accumulation_helpers import CountOps
from products_helpers import documented_paths, expand, product_oracle, relative_error

IRREPS1 = ((1, 0), (2, 1), (1, 2))
IRREPS2 = ((1, 1), (1, 2), (1, 3))


def randn(generator, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("basis", ["real", "complex", "e3nn"])
@pytest.mark.parametrize("parity", ["all", "even"])
@pytest.mark.parametrize("normalization", ["none", "component", "norm"])
def test_matches_per_path_oracle(generator, basis, parity, normalization):
    product = ClebschGordanProduct(IRREPS1, IRREPS2, lmax_out=4, parity=parity, basis=basis,
                                   normalization=normalization, dtype=torch.float64)
    expected_paths = documented_paths(IRREPS1, IRREPS2, range(5), parity)
    assert [(p.block1, p.l1, p.block2, p.l2, p.L) for p in product.paths] == expected_paths
    counts = {}
    for *_, L in expected_paths:
        counts[L] = counts.get(L, 0) + 1
    assert product.irreps_out == tuple((n, L) for L, n in sorted(counts.items()))
    assert product.dim_out == irreps_dim(product.irreps_out) == sum(2 * p[-1] + 1 for p in expected_paths)
    X1 = randn(generator, 2, 3, 4, irreps_dim(IRREPS1))  # [batch, atoms, channels, dim]
    X2 = randn(generator, 2, 3, 4, irreps_dim(IRREPS2))
    out = product(X1, X2)
    assert out.shape == (2, 3, 4, product.dim_out) and out.dtype == torch.float64
    expected = product_oracle(X1, X2, IRREPS1, IRREPS2, range(5), parity, basis, normalization)
    assert relative_error(out, expected) < 1e-13


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lmax_out_l_out_and_dtypes(generator, dtype):
    product = ClebschGordanProduct(3, 2, l_out=[4, 1], dtype=torch.float64)
    assert [L for _, L in product.irreps_out] == [1, 4]
    assert ClebschGordanProduct(3, 2).irreps_out[-1][1] == 5  # default lmax_out = lmax1 + lmax2
    assert ClebschGordanProduct(3, 2, 0).irreps_out == ((3, 0),)
    X1, X2 = randn(generator, 5, 3, 16, dtype=dtype), randn(generator, 5, 3, 9, dtype=dtype)
    out = product(X1, X2)  # coefficients (float64) are cast to the inputs' dtype
    assert out.dtype == dtype
    expected = product_oracle(X1, X2, normalize_irreps(3), normalize_irreps(2), [1, 4])
    assert relative_error(out, expected) < (1e-5 if dtype == torch.float32 else 1e-13)


def test_callable_normalization(generator):
    factor = lambda l1, l2, L: 1.0 / (1 + l1 + 10 * l2 + 100 * L)  # noqa: E731
    product = ClebschGordanProduct(IRREPS1, IRREPS2, 3, normalization=factor, dtype=torch.float64)
    X1, X2 = randn(generator, 7, 2, irreps_dim(IRREPS1)), randn(generator, 7, 2, irreps_dim(IRREPS2))
    expected = product_oracle(X1, X2, IRREPS1, IRREPS2, range(4), normalization=factor)
    assert relative_error(product(X1, X2), expected) < 1e-13


def test_normalizations_give_unit_scale(generator):
    """'component': unit-variance components stay unit variance; 'norm': unit expected norm per block."""
    n = 200000  # the 0.08 bound is then ~12 standard errors of the estimated mean
    for normalization in ("component", "norm"):
        product = ClebschGordanProduct(2, 2, 2, normalization=normalization, dtype=torch.float64)
        X1, X2 = randn(generator, n, 1, 9), randn(generator, n, 1, 9)
        if normalization == "norm":  # each block of expected unit norm
            scale = torch.cat([torch.full((2 * l + 1,), (2 * l + 1) ** -0.5, dtype=torch.float64) for l in range(3)])
            X1, X2 = X1 * scale, X2 * scale
        out = product(X1, X2)
        for L, block in product.split(out).items():
            if normalization == "component":
                measured = block.pow(2).mean(dim=(0, 1, 3))
            else:
                measured = block.pow(2).sum(-1).mean(dim=(0, 1))
            assert torch.allclose(measured, torch.ones_like(measured), atol=0.08), (normalization, L, measured)


def test_dict_list_inputs_split_and_concatenate(generator):
    product = ClebschGordanProduct(2, 2, dtype=torch.float64)
    parts = {l: randn(generator, 3, 4, 2 * l + 1) for l in range(3)}
    X, irreps = concatenate(parts)
    assert irreps == ((1, 0), (1, 1), (1, 2)) and X.shape == (3, 4, 9)
    reference = product(X, X)
    assert torch.equal(product(parts, parts), reference)
    assert torch.equal(product([parts[0], parts[1], parts[2]], X), reference)
    pieces = product.split(reference)
    assert list(pieces) == [L for _, L in product.irreps_out]
    for (n, L), path_block in zip(product.irreps_out, pieces.values()):
        assert path_block.shape == (3, 4, n, 2 * L + 1)
        assert path_block.untyped_storage().data_ptr() == reference.untyped_storage().data_ptr()  # views
    for path in product.paths:  # path j of L sits at index j of its block, at offset_out in the tensor
        j = [p.index for p in product.paths if p.L == path.L].index(path.index)
        assert torch.equal(pieces[path.L][..., j, :], reference[..., path.offset_out:path.offset_out + 2 * path.L + 1])
    again, irreps_again = concatenate(pieces, product.irreps_out)  # split form [..., C, n_l, 2l+1] round-trips
    assert torch.equal(again, reference) and irreps_again == product.irreps_out
    # a multi-block input given as a dict (next CG iteration step)
    step = ClebschGordanProduct(product.irreps_out, 2, 2, dtype=torch.float64)
    assert torch.equal(step(pieces, parts), step(reference, X))


def test_e3nn_layout_round_trip(generator):
    irreps = ((1, 0), (2, 1), (1, 3))
    x = randn(generator, 5, 3, irreps_dim(irreps))
    y = to_e3nn_layout(x, irreps)
    assert y.shape == (5, 3 * irreps_dim(irreps))
    # block 1 (second block, l = 1) of channel 2 sits at 3*1 + 2*3 ... in the mul-major e3nn layout
    assert torch.equal(y[:, 3 + 2 * 3:3 + 3 * 3], x[:, 2, 1:4])
    assert torch.equal(from_e3nn_layout(y, irreps, 3), x)


def test_learnable_weights_are_folded_and_get_gradients(generator):
    product = ClebschGordanProduct(IRREPS1, IRREPS2, 3, weights=True, normalization="norm", dtype=torch.float64)
    assert product.weight.shape == (product.n_paths,) and [n for n, _ in product.named_parameters()] == ["weight"]
    with torch.no_grad():
        product.weight.copy_(randn(generator, product.n_paths))
    X1 = randn(generator, 4, 2, irreps_dim(IRREPS1)).requires_grad_()
    X2 = randn(generator, 4, 2, irreps_dim(IRREPS2)).requires_grad_()
    expected = product_oracle(X1, X2, IRREPS1, IRREPS2, range(4), normalization="norm", weights=product.weight)
    assert relative_error(product(X1, X2), expected) < 1e-13
    # the weight gradient of <G, out> is, per path, <G_path, out_path / weight_path>
    G = randn(generator, 4, 2, product.dim_out)
    (product(X1, X2) * G).sum().backward()
    unweighted = product_oracle(X1, X2, IRREPS1, IRREPS2, range(4), normalization="norm")
    for path in product.paths:
        sl = slice(path.offset_out, path.offset_out + 2 * path.L + 1)
        expected_grad = (G[..., sl] * unweighted[..., sl]).sum()
        assert abs(product.weight.grad[path.index].item() - expected_grad.item()) < 1e-11 * max(1, abs(expected_grad))


def test_gradcheck_and_double_backward(generator):
    product = ClebschGordanProduct(((1, 1), (1, 2)), 2, 3, weights=True, dtype=torch.float64)
    with torch.no_grad():
        product.weight.copy_(randn(generator, product.n_paths))
    X1 = randn(generator, 3, 2, 8).requires_grad_()
    X2 = randn(generator, 3, 2, 9).requires_grad_()
    weight = product.weight.detach().clone().requires_grad_()

    def f(a, b, w):
        return torch.func.functional_call(product, {"weight": w}, (a, b))

    assert torch.autograd.gradcheck(f, (X1, X2, weight))
    assert torch.autograd.gradgradcheck(f, (X1, X2, weight))


def test_whole_product_is_one_fused_call(generator):
    """One accumulate forward and one accumulate_backward for all gradients (X1, X2, weights)."""
    product = ClebschGordanProduct(3, 3, 3, weights=True, dtype=torch.float64)
    assert product.n_paths == 34
    X1 = randn(generator, 6, 2, 16).requires_grad_()
    X2 = randn(generator, 6, 2, 16).requires_grad_()
    with CountOps() as forward:
        out = product(X1, X2)
    assert forward.calls == ["accumulate"]
    with CountOps() as backward:
        out.sum().backward()
    assert backward.calls == ["accumulate_backward"]
    assert X1.grad is not None and X2.grad is not None and product.weight.grad is not None


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_inputs_match_brute_force(generator, dtype):
    irreps1, irreps2 = ((1, 0), (1, 1), (2, 2)), 3
    product = ClebschGordanProduct(irreps1, irreps2, 4, basis="complex", weights=True, dtype=torch.float64)
    with torch.no_grad():
        product.weight.copy_(randn(generator, product.n_paths))
    X1 = torch.complex(randn(generator, 5, 3, 14), randn(generator, 5, 3, 14)).to(dtype)
    X2 = torch.complex(randn(generator, 5, 3, 16), randn(generator, 5, 3, 16)).to(dtype)
    out = product(X1, X2)
    assert out.dtype == dtype and out.shape == (5, 3, product.dim_out)
    # brute force: complex128 loop over the nonzeros of every path, no real/imaginary rewriting
    x1, x2 = X1.to(torch.complex128).numpy(), X2.to(torch.complex128).numpy()
    expected = np.zeros((5, 3, product.dim_out), dtype=np.complex128)
    b1, b2 = expand(normalize_irreps(irreps1)), expand(normalize_irreps(irreps2))
    for path in product.paths:
        C = np.asarray(cg.clebsch_gordan(path.l1, path.l2, path.L, basis="complex"))
        w = product.weight[path.index].item()
        for m1, m2, mu in zip(*np.nonzero(C)):
            expected[..., path.offset_out + mu] += (x1[..., b1[path.block1][1] + m1] * x2[..., b2[path.block2][1] + m2]
                                                    * C[m1, m2, mu] * w)
    assert relative_error(out, torch.from_numpy(expected)) < (1e-5 if dtype == torch.complex64 else 1e-13)
    assert relative_error(product(X1.conj(), X2), product_oracle(X1.conj(), X2, normalize_irreps(irreps1),
                                                                  normalize_irreps(irreps2), range(5), basis="complex",
                                                                  weights=product.weight)) < 1e-5


def test_complex_gradients_match_torch_complex_autograd(generator):
    """Gradients through view_as_real equal torch's complex autograd of a dense complex einsum."""
    irreps = ((1, 1), (1, 2))
    product = ClebschGordanProduct(irreps, irreps, 3, basis="complex", weights=True, dtype=torch.float64)
    with torch.no_grad():
        product.weight.copy_(randn(generator, product.n_paths))

    def dense(a, b, w):
        outs = []
        for p in product.paths:
            C = torch.as_tensor(cg.clebsch_gordan(p.l1, p.l2, p.L, basis="complex")).to(a.dtype)
            outs.append(torch.einsum("...i,...j,ijk->...k", a[..., p.offset1:p.offset1 + 2 * p.l1 + 1],
                                     b[..., p.offset2:p.offset2 + 2 * p.l2 + 1], C) * w[p.index])
        return torch.cat(outs, -1)

    X1 = torch.complex(randn(generator, 4, 2, 8), randn(generator, 4, 2, 8)).requires_grad_()
    X2 = torch.complex(randn(generator, 4, 2, 8), randn(generator, 4, 2, 8)).requires_grad_()
    G = torch.complex(randn(generator, 4, 2, product.dim_out), randn(generator, 4, 2, product.dim_out))
    ours = torch.autograd.grad((product(X1, X2) * G.conj()).real.sum(), (X1, X2, product.weight))
    w = product.weight.detach().clone().requires_grad_()
    theirs = torch.autograd.grad((dense(X1, X2, w) * G.conj()).real.sum(), (X1, X2, w))
    for a, b in zip(ours, theirs):
        assert relative_error(a, b) < 1e-12


def test_iteration_repeats_products(generator):
    iteration = ClebschGordanIteration(2, nu_max=4, parity="even", weights=True, dtype=torch.float64)
    assert len(iteration.products) == 3 and len(iteration.irreps) == 4
    X = randn(generator, 3, 2, 9)
    features = iteration(X)
    assert len(features) == 4 and torch.equal(features[0], X)
    for nu, product in enumerate(iteration.products):
        # step nu: (previous output, grouped by L) x X^1, paths for every (block, l) pair and L <= lmax_out
        assert product.irreps1 == iteration.irreps[nu] and product.irreps2 == normalize_irreps(2)
        assert product.irreps_out == iteration.irreps[nu + 1]
        expected_paths = documented_paths(iteration.irreps[nu], normalize_irreps(2), range(3), "even")
        assert len(product.paths) == len(expected_paths)
        expected = product_oracle(features[nu], X, iteration.irreps[nu], normalize_irreps(2), range(3), "even",
                                  weights=product.weight)
        assert relative_error(features[nu + 1], expected) < 1e-12
    # multiplicities grow with the number of paths: n_L(nu+1) = #{(block of X^nu, l): l, L couple}
    n = [dict((L, c) for c, L in irreps) for irreps in iteration.irreps]
    assert n[1] == {0: 3, 1: 4, 2: 4}  # 00 11 22 -> 0 | 01 10 12 21 -> 1 (11->1 is odd) | 02 20 11 22 -> 2
    assert n[2][0] == n[1][0] * 1 + n[1][1] * 1 + n[1][2] * 1
    assert ClebschGordanIteration(2, nu_max=1)(X) == [X]


def test_torch_compile_fullgraph(generator):
    product = ClebschGordanProduct(2, 2, 2, weights=True, dtype=torch.float64)
    X1, X2 = randn(generator, 4, 3, 9), randn(generator, 4, 3, 9)
    compiled = torch.compile(product, fullgraph=True, backend="aot_eager")
    a1, a2 = X1.clone().requires_grad_(), X2.clone().requires_grad_()
    out = compiled(a1, a2)
    out.pow(2).sum().backward()
    grads = (a1.grad, a2.grad, product.weight.grad.clone())
    product.weight.grad = None
    b1, b2 = X1.clone().requires_grad_(), X2.clone().requires_grad_()
    eager = product(b1, b2)
    eager.pow(2).sum().backward()
    assert torch.allclose(out, eager, rtol=1e-13, atol=0)
    for g, h in zip(grads, (b1.grad, b2.grad, product.weight.grad)):
        assert torch.allclose(g, h, rtol=1e-12, atol=1e-14)


def test_module_moves_and_state_dict():
    product = ClebschGordanProduct(2, 2, weights=True)
    assert set(product.state_dict()) == {"weight"}  # the rule buffers are derived, not saved
    product.to(torch.float64)
    assert product.C.dtype == torch.float64 and product.path_index.dtype == torch.int64
    assert product.rule.nnz == product.C.shape[0] and product.rule.output_size == product.dim_out
    assert "paths=" in repr(product)


def test_errors(generator):
    with pytest.raises(ValueError, match="parity"):
        ClebschGordanProduct(2, 2, parity="odd")
    with pytest.raises(ValueError, match="basis"):
        ClebschGordanProduct(2, 2, basis="spherical")
    with pytest.raises(ValueError, match="normalization"):
        ClebschGordanProduct(2, 2, normalization="unit")
    with pytest.raises(ValueError, match="not both"):
        ClebschGordanProduct(2, 2, 2, l_out=[1])
    with pytest.raises(ValueError, match="no CG path"):
        ClebschGordanProduct(((1, 3),), ((1, 0),), 2)
    with pytest.raises(ValueError, match="irreps"):
        normalize_irreps([(1, 2, 3)])
    with pytest.raises(ValueError):
        normalize_irreps(-1)
    product = ClebschGordanProduct(1, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"\[\.\.\., channels, 4\]"):
        product(randn(generator, 2, 3, 5), randn(generator, 2, 3, 4))
    with pytest.raises(ValueError, match="do not broadcast"):
        product(randn(generator, 2, 3, 4), randn(generator, 3, 3, 4))
    with pytest.raises(TypeError, match="complex"):
        product(torch.zeros(2, 3, 4, dtype=torch.complex128), torch.zeros(2, 3, 4, dtype=torch.complex64))
    with pytest.raises(ValueError, match="degrees"):
        product({0: randn(generator, 2, 1), 2: randn(generator, 2, 5)}, randn(generator, 2, 4))
    with pytest.raises(ValueError, match="leading shape"):
        concatenate({0: randn(generator, 2, 3, 1), 1: randn(generator, 2, 4, 3)})
    with pytest.raises(ValueError, match="irreps are required"):
        concatenate(randn(generator, 2, 4))
    with pytest.raises(ValueError, match="one entry per degree"):
        split(randn(generator, 2, 6), ((1, 1), (1, 1)))
    with pytest.raises(ValueError, match="nu_max"):
        ClebschGordanIteration(2, nu_max=0)
    with pytest.raises(ValueError, match=r"\[\.\.\., channels, 9\]"):
        ClebschGordanIteration(2, nu_max=2)(randn(generator, 2, 3, 8))
    assert math.isclose(irreps_dim(((2, 1), (3, 0))), 9)
