"""Triton kernels in the tests: compiled on a CUDA machine, else on CPU tensors under the Triton interpreter.

``triton.jit`` reads ``TRITON_INTERPRET`` when a function is decorated; the kernel modules create (decorate)
their generated kernels lazily and key their caches on the flag, and the generated code calls only triton
builtins and helpers defined next to it (not triton's own ``@jit`` library functions, decorated once when
triton is imported). So a test module sets the variable with :func:`enable` before its imports, puts it back
with :func:`restore` (modules collected after it must see the environment as it was), and sets it again
while its own tests run with the fixture :func:`module_fixture` returns.
"""
import os

import pytest
import torch

_PREVIOUS = os.environ.get("TRITON_INTERPRET")
#: whether the Triton kernels run interpreted (no GPU, or TRITON_INTERPRET=1 from outside)
INTERPRET = _PREVIOUS == "1" or not torch.cuda.is_available()
#: the device of the tensors the kernels run on
DEVICE = "cpu" if INTERPRET else "cuda"
#: marks tests that only run compiled on a GPU
cuda = pytest.mark.skipif(INTERPRET, reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")


def enable() -> None:
    if INTERPRET:
        os.environ["TRITON_INTERPRET"] = "1"


def restore() -> None:
    if _PREVIOUS is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _PREVIOUS


def module_fixture():
    """An autouse, module-scoped fixture that interprets the module's tests (assign it to a module name)."""
    @pytest.fixture(autouse=True, scope="module")
    def _interpreter():
        enable()
        yield
        restore()

    return _interpreter
