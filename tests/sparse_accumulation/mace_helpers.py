"""MACE's own symmetric contraction as the reference of the ``sparse_accumulation.mace`` tests, loaded by
:func:`sparse_accumulation.mace.reference.mace_symmetric_contraction_module` (without mace's package imports).
Tests skip, saying so, where mace-torch, e3nn or opt_einsum_fx are not installed."""
import functools

import pytest
import torch

from sparse_accumulation.mace.reference import mace_symmetric_contraction_module


def mace_module():
    """``mace.modules.symmetric_contraction``, or skip the test."""
    pytest.importorskip("e3nn")
    pytest.importorskip("opt_einsum_fx")
    try:
        return mace_symmetric_contraction_module()
    except ImportError as error:
        pytest.skip(str(error))


@functools.lru_cache(maxsize=None)
def _built(irreps_in: str, irreps_out: str, correlation: int, num_elements: int):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return mace_module().SymmetricContraction(irreps_in, irreps_out, correlation=correlation,
                                                  num_elements=num_elements)
    finally:
        torch.set_default_dtype(previous)


def mace_contraction(irreps_in: str, irreps_out: str, correlation: int, num_elements: int, generator):
    """A float64 MACE module (built once per configuration: MACE's construction takes seconds) with fresh random
    weights drawn from ``generator``."""
    module = _built(irreps_in, irreps_out, correlation, num_elements)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return module


def inputs(generator, nodes: int, channels: int, dim: int, num_elements: int):
    """Fresh random ``x [nodes, channels, dim]`` float64, element indices with every element present, one-hot."""
    x = torch.randn(nodes, channels, dim, generator=generator, dtype=torch.float64)
    elements = torch.randint(0, num_elements, (nodes,), generator=generator)
    elements[:num_elements] = torch.arange(num_elements)
    elements = elements[torch.randperm(nodes, generator=generator)]
    one_hot = torch.nn.functional.one_hot(elements, num_elements).to(torch.float64)
    return x, elements, one_hot
