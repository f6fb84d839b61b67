"""MACE's own symmetric contraction as the reference of the ``sparse_accumulation.mace`` tests.

mace-torch's package ``__init__`` files import its training tools (pandas, ase, torch-ema ...); :func:`mace_module`
puts empty ``mace``, ``mace.tools`` and ``mace.modules`` package objects (their ``__path__`` the installed
folders) into ``sys.modules`` first and imports only ``mace.modules.symmetric_contraction`` (which needs e3nn and
opt_einsum_fx). Tests skip, saying so, where mace-torch or those are not installed.
"""
import functools
import importlib
import importlib.util
import sys
import types

import pytest
import torch


def mace_module():
    """``mace.modules.symmetric_contraction``, or skip the test."""
    pytest.importorskip("e3nn")
    pytest.importorskip("opt_einsum_fx")
    found = sys.modules.get("mace.modules.symmetric_contraction")
    if found is not None:
        return found
    spec = importlib.util.find_spec("mace")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mace-torch is not installed (pip install --no-deps mace-torch opt_einsum_fx opt_einsum)")
    root = spec.submodule_search_locations[0]
    for name, path in (("mace", root), ("mace.tools", f"{root}/tools"), ("mace.modules", f"{root}/modules")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    return importlib.import_module("mace.modules.symmetric_contraction")


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
