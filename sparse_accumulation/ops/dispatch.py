"""Which path a call takes: the eager ``torch.autograd.Function`` s, or the registered ops.

Going through ``torch.ops.sparse_accumulation`` costs several Python layers per call (argument filling, the
custom-op autograd wrapper, redispatch); plain eager calls skip them. Under ``torch.compile``, tensor
subclasses, dispatch modes or ``torch.func`` transforms only the registered ops work (they alone have fake
implementations and dispatcher registrations).
"""
import contextlib
import threading

import torch


def eager_applies(*tensors) -> bool:
    """Whether the call may skip the dispatcher: plain tensors, no compile, mode or functorch transform."""
    if torch.compiler.is_compiling():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active():
        return False
    for t in tensors:
        if t is not None and type(t) is not torch.Tensor:
            return False
    return True


_mode = threading.local()


@contextlib.contextmanager
def saving_only():
    """Within it (in this thread), the eager paths of the accumulation and graph ops save what their backward
    needs and compute nothing: their outputs are NaN. For recomputing a forward whose outputs are discarded, only
    its saved tensors wanted (a checkpoint's backward, see :class:`sparse_accumulation.mace.Convolution`)."""
    previous = saves_only()
    _mode.saving_only = True
    try:
        yield
    finally:
        _mode.saving_only = previous


def saves_only() -> bool:
    """Whether this thread is inside :func:`saving_only`."""
    return getattr(_mode, "saving_only", False)
