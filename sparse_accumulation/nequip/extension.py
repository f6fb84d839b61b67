"""NequIP's extension hook (the ``nequip.extension`` entry point ``init_always``, loaded while NequIP imports
itself): the modifiers are attached to their classes right after the modules defining them are imported
(NequIP's ``TensorProductScatter``; Allegro's ``Contracter`` where Allegro is installed), whenever that happens.
Loading this hook imports nothing of NequIP, Allegro or this library's kernels: NequIP runs its entry points
while its own modules are half imported."""
from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings

#: the module defining a class -> the module of this package whose ``register()`` attaches its modifier
HOOKS = {"nequip.nn._tp_scatter_base": "sparse_accumulation.nequip",
         "allegro.nn._strided._contract": "sparse_accumulation.allegro"}


def _register(module: str) -> None:
    try:
        importlib.import_module(HOOKS[module]).register()
    except Exception as error:  # noqa: BLE001 - a broken install must not break NequIP's own import
        warnings.warn(f"sparse_accumulation could not register its modifier on {module}: "
                      f"{type(error).__name__}: {error}", RuntimeWarning, stacklevel=2)


class _Loader(importlib.abc.Loader):
    """A module's own loader, then its modifier's registration."""

    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _register(self.name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`HOOKS` as the other finders do, with :class:`_Loader` around their loaders."""

    def find_spec(self, name, path, target=None):
        if name not in HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())
for _name in HOOKS:
    if _name in sys.modules:  # imported before this hook was loaded
        _register(_name)
