"""Buffers of exact coefficients (Clebsch-Gordan values, path weights) that stay exact whatever dtype their module
takes: a module built in float32 and then ``.double()``'d computes with the float64 values, not with float32
values widened (which are off by about 1e-8 relative)."""
from __future__ import annotations

import torch


class ExactBuffers:
    """A mixin for ``torch.nn.Module`` subclasses: :meth:`register_exact` registers a buffer made from float64
    values, which every ``.to()``, ``.float()``, ``.double()``, ``.half()`` (anything that goes through
    ``Module._apply``) remakes from those values in the buffer's new dtype and device. TorchScript does not see
    the float64 copies (list ``"_exact_values"`` in a subclass's own ``__jit_ignored_attributes__``)."""

    __jit_ignored_attributes__ = ["_exact_values"]

    def register_exact(self, name: str, values, dtype: torch.dtype, device=None, persistent: bool = False) -> None:
        """Register buffer ``name`` holding ``values`` (array-like, exact in float64) in ``dtype`` on ``device``."""
        exact = torch.as_tensor(values, dtype=torch.float64).detach().to("cpu", copy=True)
        self.__dict__.setdefault("_exact_values", {})[name] = exact
        self.register_buffer(name, exact.to(device=device, dtype=dtype), persistent=persistent)

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        for name, exact in self.__dict__.get("_exact_values", {}).items():
            held = self._buffers.get(name)
            if held is not None and held.is_floating_point():
                self._buffers[name] = exact.to(device=held.device, dtype=held.dtype)
        return module
