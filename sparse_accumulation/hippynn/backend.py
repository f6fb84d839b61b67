"""A hippynn custom-kernel implementation made of this library's sums (hippynn is imported only when asked for)."""
from __future__ import annotations

import threading

from ..ops.pair_sums import api as sums

#: the name hippynn knows these kernels by, unless told otherwise
DEFAULT_NAME = "sparse_accumulation"

_lock = threading.Lock()
_registered: dict = {}


def _registry():
    try:
        from hippynn.custom_kernels.registry import MessagePassingKernels
    except ImportError as error:
        raise ImportError("sparse_accumulation.hippynn.register needs hippynn: pip install hippynn") from error
    return MessagePassingKernels


def register(name: str = DEFAULT_NAME):
    """Register :func:`~sparse_accumulation.envsum`, :func:`~sparse_accumulation.sensesum` and
    :func:`~sparse_accumulation.featsum` as hippynn's custom kernels named ``name``.

    Afterwards ``hippynn.custom_kernels.set_custom_kernels(name)`` makes hippynn's interaction layers run on
    them (hippynn warns that the name is not one of its own). They carry their own autograd (registered with
    ``wrap=False``), to any order, and pick numba on CPU tensors and Triton on CUDA tensors (the process default
    of :mod:`sparse_accumulation.backends`). Registering the same name again returns the first registration.

    Args:
        name: the implementation's name in hippynn's registry (hippynn lower-cases it).

    Returns:
        hippynn's ``MessagePassingKernels`` object of the registration.

    Raises:
        ImportError: hippynn is not installed.
        TypeError: ``name`` is not a string.
        ValueError: hippynn already has other kernels of that name.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    registry = _registry()
    key = name.lower()
    with _lock:
        if key in _registered:
            return _registered[key]
        if key in registry.get_available_implementations(hidden=True):
            raise ValueError(f"hippynn already has custom kernels named {key!r}; choose another name")
        _registered[key] = registry(key, sums.envsum, sums.sensesum, sums.featsum, wrap=False)
        return _registered[key]
