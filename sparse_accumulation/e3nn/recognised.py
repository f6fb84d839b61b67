"""This library's e3nn layers as subclasses of e3nn's own classes, for code that finds e3nn's layers with
``isinstance``: MACE's LoRA (``mace.modules.lora.inject_lora`` wraps every ``o3.Linear`` and builds its adapters
with ``type(layer)(irreps_in, irreps_out, internal_weights=True, biases=False)``). :func:`sparse_accumulation.mace.accelerate`
installs these. Importing this module imports e3nn.
"""
from __future__ import annotations

from e3nn import o3

from .linear import Linear as _Linear

__all__ = ["Linear"]


class Linear(_Linear, o3.Linear):
    """:class:`sparse_accumulation.e3nn.Linear`, and an ``e3nn.o3.Linear`` to ``isinstance``: every method is this
    library's (e3nn's constructor never runs); its ``instructions`` (``i_in``, ``i_out``, ``path_shape``,
    ``path_weight``), flat ``weight`` and the ``weight`` it reads at each call are e3nn's."""
