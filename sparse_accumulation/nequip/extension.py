"""NequIP's extension hook (the ``nequip.extension`` entry point ``init_always``): registers the modifier when
NequIP is imported, without importing this library's kernels until the modifier runs."""
from . import register

register()
