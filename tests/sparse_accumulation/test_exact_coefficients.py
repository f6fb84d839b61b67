"""Exact coefficients follow the module's dtype: a module built in float32 (or float16) and then taken to float64
computes with the float64 coefficients, the same values as the module built in float64 (bit for bit), also
scripted; and the float32 module still computes with float32 coefficients."""
import pytest
import torch

import sparse_accumulation as sa


def _tensor_product(dtype):
    e3nn = pytest.importorskip("sparse_accumulation.e3nn")
    pytest.importorskip("e3nn")
    # 16x1o x 16x1o: a factored instruction beside the kernels' ones (both coefficient sets)
    return e3nn.FullyConnectedTensorProduct("4x0e + 16x1o + 2x2e", "1x0e + 16x1o", "4x0e + 4x1o + 2x2e", dtype=dtype)


def _linear(dtype):
    e3nn = pytest.importorskip("sparse_accumulation.e3nn")
    pytest.importorskip("e3nn")
    return e3nn.Linear("4x0e + 3x1o + 5x0e", "2x0e + 3x1o").to(dtype)


def _contraction(dtype):
    from sparse_accumulation.mace import SymmetricContraction

    return SymmetricContraction("4x0e + 4x1o", "4x0e + 4x1o", 3, num_elements=2, dtype=dtype)


MODULES = {
    "TensorProduct": (_tensor_product, lambda m, g: (torch.randn(6, m.irreps_in1.dim, generator=g),
                                                     torch.randn(6, m.irreps_in2.dim, generator=g))),
    "Linear": (_linear, lambda m, g: (torch.randn(6, m.irreps_in.dim, generator=g),)),
    "SymmetricContraction": (_contraction, lambda m, g: (torch.randn(6, 4, 4, generator=g),
                                                         torch.tensor([0, 1, 0, 1, 1, 0]))),
    "ClebschGordanProduct": (lambda dtype: sa.ClebschGordanProduct(2, 2, lmax_out=2, parity="even", weights=True,
                                                                   dtype=dtype),
                             lambda m, g: ({l: torch.randn(6, 3, 2 * l + 1, generator=g) for l in range(3)},) * 2),
    "CGCalculatorSingle": (lambda dtype: sa.CGCalculatorSingle(2, 1, 2, dtype=dtype),
                           lambda m, g: (torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g))),
}


def _double(inputs):
    return tuple({k: v.double() for k, v in t.items()} if isinstance(t, dict) else
                 (t.double() if t.is_floating_point() else t) for t in inputs)


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("built", [torch.float32, torch.float16])
def test_a_module_taken_to_float64_computes_with_exact_coefficients(generator, name, built):
    make, inputs = MODULES[name]
    exact = make(torch.float64)
    taken = make(built).double()
    with torch.no_grad():  # the same parameters (not buffers, which a state dict would restore): only the
        for mine, theirs in zip(taken.parameters(), exact.parameters(), strict=True):  # coefficients could differ
            mine.copy_(theirs)
    args = _double(inputs(exact, generator))
    expected = exact(*args)
    assert expected.dtype == torch.float64 and expected.abs().max() > 0
    assert torch.equal(taken(*args), expected)
    if name in ("TensorProduct", "Linear", "CGCalculatorSingle"):  # (the others' scripted calls take other forms)
        assert torch.equal(torch.jit.script(taken)(*args), expected)
    assert all(b.dtype == torch.float64 for b in taken.buffers() if b.is_floating_point())


def test_a_float32_module_keeps_float32_coefficients(generator):
    module = sa.CGCalculatorSingle(2, 1, 2, dtype=torch.float64).float()
    assert module.C.dtype == torch.float32
    assert torch.equal(module.C, sa.get_cg_transformation_rule(2, 1, 2, dtype=torch.float32)[3])
