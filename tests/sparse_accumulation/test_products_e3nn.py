"""e3nn interop: with basis "e3nn" and the mul x l layout, one fused call reproduces e3nn's uuu TensorProduct."""
import pytest
import torch

from sparse_accumulation.products import ClebschGordanProduct, from_e3nn_layout, irreps_dim, to_e3nn_layout

from products_helpers import expand, relative_error

o3 = pytest.importorskip("e3nn.o3")

MUL = 3


def _letter(parity: int) -> str:
    return "e" if parity == 1 else "o"


def e3nn_tensor_product(product, mul, irrep_normalization, weights=False):
    """e3nn's TensorProduct with one uuu instruction per path of ``product``, in output order.

    Inputs carry parity (-1)^l ("0e", "1o", "2e", ...); a path's output irrep has parity (-1)^(l1 + l2), so
    with parity="even" every output is again (-1)^L, and with parity="all" the l1 + l2 + L odd paths
    produce pseudo-tensors ("1e", "2o", ...).
    """
    def irreps(ls):
        return o3.Irreps([(mul, (l, (-1) ** l)) for l in ls])

    irreps1 = irreps([l for l, _ in expand(product.irreps1)])
    irreps2 = irreps([l for l, _ in expand(product.irreps2)])
    irreps_out = o3.Irreps([(mul, (p.L, (-1) ** (p.l1 + p.l2))) for p in product.paths])
    instructions = [(p.block1, p.block2, p.index, "uuu", weights) for p in product.paths]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn computes its 3j symbols in the default dtype
    try:
        return o3.TensorProduct(irreps1, irreps2, irreps_out, instructions, irrep_normalization=irrep_normalization,
                                path_normalization="none", internal_weights=False, shared_weights=True)
    finally:
        torch.set_default_dtype(previous)


# e3nn's irrep_normalization -> ours (e3nn's "none" is the bare 3j symbol, C / sqrt(2L + 1))
NORMALIZATIONS = {"component": "component", "norm": "norm", "none": lambda l1, l2, L: (2 * L + 1) ** -0.5}


@pytest.mark.parametrize("irrep_normalization", ["none", "component", "norm"])
@pytest.mark.parametrize("parity", ["even", "all"])
@pytest.mark.parametrize("irreps1,irreps2,lmax_out", [(3, 3, 3), (((1, 0), (2, 1), (1, 2)), 2, 3)])
def test_matches_e3nn_uuu_tensor_product(generator, irrep_normalization, parity, irreps1, irreps2, lmax_out):
    product = ClebschGordanProduct(irreps1, irreps2, lmax_out, parity=parity, basis="e3nn",
                                   normalization=NORMALIZATIONS[irrep_normalization], dtype=torch.float64)
    tp = e3nn_tensor_product(product, MUL, irrep_normalization)
    assert tp.irreps_in1.dim == MUL * product.dim1 and tp.irreps_out.dim == MUL * product.dim_out
    y1 = torch.randn(4, 5, MUL * product.dim1, generator=generator, dtype=torch.float64)  # e3nn layout
    y2 = torch.randn(4, 5, MUL * product.dim2, generator=generator, dtype=torch.float64)
    x1, x2 = from_e3nn_layout(y1, product.irreps1, MUL), from_e3nn_layout(y2, product.irreps2, MUL)
    assert x1.shape == (4, 5, MUL, product.dim1)
    ours = to_e3nn_layout(product(x1, x2), product.irreps_out)
    assert relative_error(ours, tp(y1, y2)) < 1e-13


def test_weights_match_e3nn_path_weights(generator):
    """Per-path weights equal e3nn uuu weights that are constant over channels; gradients agree too."""
    product = ClebschGordanProduct(2, 2, 2, parity="even", basis="e3nn", weights=True, dtype=torch.float64)
    with torch.no_grad():
        product.weight.copy_(torch.randn(product.n_paths, generator=generator, dtype=torch.float64))
    tp = e3nn_tensor_product(product, MUL, "component", weights=True)
    assert tp.weight_numel == MUL * product.n_paths
    e3nn_weight = product.weight.detach().repeat_interleave(MUL).requires_grad_()
    y1 = torch.randn(6, MUL * irreps_dim(2), generator=generator, dtype=torch.float64)
    y2 = torch.randn(6, MUL * irreps_dim(2), generator=generator, dtype=torch.float64)
    G = torch.randn(6, MUL * product.dim_out, generator=generator, dtype=torch.float64)
    expected = tp(y1, y2, e3nn_weight)
    ours = to_e3nn_layout(product(from_e3nn_layout(y1, 2, MUL), from_e3nn_layout(y2, 2, MUL)), product.irreps_out)
    assert relative_error(ours, expected) < 1e-13
    (ours * G).sum().backward()
    (expected * G).sum().backward()
    assert relative_error(product.weight.grad, e3nn_weight.grad.view(-1, MUL).sum(-1)) < 1e-12
