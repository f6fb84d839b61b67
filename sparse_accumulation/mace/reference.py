"""MACE's own symmetric contraction, the reference of the tests and benchmarks (mace-torch, imported lazily).

mace-torch's package ``__init__`` files import its training tools (pandas, ase, torch-ema ...), which a test or
benchmark environment may lack; :func:`mace_symmetric_contraction_module` imports MACE's package as it is
where it can, else only ``mace.modules.symmetric_contraction`` (which needs e3nn and opt_einsum_fx), with empty
``mace``, ``mace.tools`` and ``mace.modules`` package objects (their ``__path__`` the installed folders) put into
``sys.modules`` where those packages were not imported already.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types

_MODULE = "mace.modules.symmetric_contraction"


def mace_symmetric_contraction_module():
    """The module ``mace.modules.symmetric_contraction`` of the installed mace-torch.

    Raises:
        ImportError: mace-torch, e3nn or opt_einsum_fx is not installed.
    """
    found = sys.modules.get(_MODULE)
    if found is not None:
        return found
    try:  # mace-torch with its dependencies: its own packages, so that later imports of MACE's models work
        return importlib.import_module(_MODULE)
    except ImportError:
        pass
    package = sys.modules.get("mace")
    if package is not None:
        paths = list(getattr(package, "__path__", None) or [])
    else:
        spec = importlib.util.find_spec("mace")
        paths = list(spec.submodule_search_locations or []) if spec is not None else []
    if not paths:
        raise ImportError("mace-torch is not installed (pip install --no-deps mace-torch opt_einsum_fx opt_einsum)")
    root = paths[0]
    for name, path in (("mace", root), ("mace.tools", f"{root}/tools"), ("mace.modules", f"{root}/modules")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    return importlib.import_module(_MODULE)
