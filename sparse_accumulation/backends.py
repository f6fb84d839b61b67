"""Choosing an implementation: names, availability, the process-wide default and the kernel modules.

:func:`kernel_module` is the one lookup from an operation and an implementation to the module of kernels that
runs it (:mod:`sparse_accumulation.kernels`).

Kernel implementations (run inside the registered ops): ``"numba"`` (CPU), ``"triton"`` (CUDA; CPU tensors
only under ``TRITON_INTERPRET=1``), ``"torch"`` (any device). Reference implementations (plain torch,
autograd by torch, for validation): ``"loops"``, ``"index_add"``, ``"dense"``, ``"sparse"``.
``None`` or ``"auto"`` picks the fastest kernel available for the device.
"""
from __future__ import annotations

import importlib
import os
import warnings
from functools import lru_cache

import torch

KERNELS = ("numba", "triton", "torch")
REFERENCES = ("loops", "index_add", "dense", "sparse")
IMPLEMENTATIONS = ("auto",) + KERNELS + REFERENCES
ENVIRONMENT_VARIABLE = "SPARSE_ACCUMULATION_IMPLEMENTATION"

#: the operations, each with the kernel implementations that have a module of kernels for it
#: (``kernels/<backend>/<operation>.py``): the registered ops' have all three; SiLU's second derivative
#: (``"activations"``) runs on Triton or torch, e3nn's fused "uvw" products and shared-weight ``Linear`` on Triton only
KERNELS_OF = {"accumulate": KERNELS, "graph": KERNELS, "polynomial": KERNELS, "pair_sums": KERNELS,
              "activations": ("triton", "torch"), "uvw": ("triton",), "linear": ("triton",)}
OPERATIONS = tuple(KERNELS_OF)


def _check_name(implementation, argument: str = "implementation") -> str:
    if implementation is None:
        return "auto"
    if not isinstance(implementation, str) or implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{argument} must be one of {', '.join(IMPLEMENTATIONS)} or None, got {implementation!r}")
    return implementation


_default = _check_name(os.environ.get(ENVIRONMENT_VARIABLE) or None, f"environment variable {ENVIRONMENT_VARIABLE}")


def set_default_implementation(implementation) -> None:
    """Set the implementation used when a call passes ``implementation=None`` (``None`` restores ``"auto"``).

    The initial default comes from the environment variable ``SPARSE_ACCUMULATION_IMPLEMENTATION``.

    Raises:
        ValueError: unknown implementation name.
    """
    global _default
    _default = _check_name(implementation)


def get_default_implementation() -> str:
    """The implementation used when a call passes ``implementation=None``."""
    return _default


def _triton_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@lru_cache(maxsize=None)
def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # a broken install (ImportError, numba/LLVM errors) counts as unavailable
        return False
    return True


def is_available(implementation: str, device) -> bool:
    """Whether ``implementation`` can run on tensors of ``device`` in this process."""
    device = torch.device(device)
    if implementation in REFERENCES:
        return True
    if implementation == "numba":
        return device.type == "cpu" and _importable("numba")
    if implementation == "triton":
        on_device = device.type == "cuda" or (device.type == "cpu" and _triton_interpreter())
        return on_device and _importable("triton")
    if implementation == "torch":
        return True
    raise ValueError(f"implementation must be one of {', '.join(KERNELS + REFERENCES)}, got {implementation!r}")


_warned = set()


def resolve(implementation, device) -> str:
    """The concrete implementation name for a call on ``device``.

    ``None`` means the process default; ``"auto"`` picks numba on CPU and triton on CUDA, falling back to
    ``"torch"`` with one warning when those are unavailable.

    Raises:
        ValueError: unknown name.
        RuntimeError: an explicitly requested implementation is unavailable for this device.
    """
    name = _check_name(implementation) if implementation is not None else _default
    return _resolve_name(name, torch.device(device).type)


@torch.compiler.assume_constant_result
def _resolve_name(name: str, device_type: str) -> str:
    # Run eagerly even under torch.compile (the answer is fixed for the process), so that import probing and
    # the fallback warning never enter a traced graph.
    device = torch.device(device_type)
    if name == "auto":
        preferred = "triton" if device.type == "cuda" else "numba" if device.type == "cpu" else "torch"
        if is_available(preferred, device):
            return preferred
        if (preferred, device.type) not in _warned:
            _warned.add((preferred, device.type))
            warnings.warn(f"sparse_accumulation: {preferred} is not available for {device.type} tensors; "
                          f"falling back to the slower 'torch' implementation", RuntimeWarning, stacklevel=3)
        return "torch"
    if not is_available(name, device):
        raise RuntimeError(f"implementation {name!r} is not available for {device.type} tensors"
                           + (" (numba runs on CPU tensors only)" if name == "numba" else "")
                           + (" (triton is not installed: pip install triton, or this package's [gpu] extra)"
                              if name == "triton" and not _importable("triton") else
                              " (triton needs CUDA tensors, or TRITON_INTERPRET=1 for CPU tensors)"
                              if name == "triton" else ""))
    return name


_resolved: dict = {}


def resolved(implementation, device) -> str:
    """:func:`resolve`, remembered per process default, name and device type (the answer is fixed for the
    process), so that a call pays one dictionary lookup; resolved afresh while ``torch.compile`` traces."""
    if torch.compiler.is_compiling():
        return resolve(implementation, device)
    key = (_default, implementation, device.type)
    name = _resolved.get(key)
    if name is None:
        name = _resolved[key] = resolve(implementation, device)
    return name


_modules: dict = {}


def kernel_module(operation: str, implementation: str):
    """The kernel module of ``operation`` (one of :data:`OPERATIONS`) for a resolved implementation. A kernel
    implementation without kernels for the operation, and a reference name, give the portable ``"torch"``
    kernels where the operation has them (a reference of ``"accumulate"`` has none: its references are not
    kernels). Imported once, then remembered.

    Raises:
        ValueError: an unknown operation or implementation, or no kernels of the operation for it.
    """
    module = _modules.get((operation, implementation))
    if module is None:
        if operation not in KERNELS_OF:
            raise ValueError(f"operation must be one of {', '.join(OPERATIONS)}, got {operation!r}")
        backend = implementation if implementation in KERNELS_OF[operation] else "torch"
        known = implementation in KERNELS or (implementation in REFERENCES and operation != "accumulate")
        if not known or backend not in KERNELS_OF[operation]:
            raise ValueError(f"no {operation} kernels for implementation {implementation!r}")
        module = importlib.import_module(f"sparse_accumulation.kernels.{backend}.{operation}")
        _modules[(operation, implementation)] = module
    return module


def triton_launch():
    """The launch controls of the Triton kernels (:mod:`sparse_accumulation.kernels.triton.launch`: waiting
    for compiles, the portable interim), or None where triton is not installed."""
    if not _importable("triton"):
        return None
    return importlib.import_module("sparse_accumulation.kernels.triton.launch")
