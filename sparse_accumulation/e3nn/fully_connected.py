"""e3nn's ``nn.FullyConnectedNet`` (the radial networks of NequIP and MACE) with its normalisation constants
folded into the weights.

e3nn's layer multiplies its output by the activation's normalisation constant and by ``variance_out ** 0.5``
(1 inside the network), two passes over a ``[rows, width]`` tensor per layer, and as many again in each
backward. Both are constants after a linear map, so they scale the next layer's (small) weight matrix instead;
the network computes the same function. A SiLU activation (MACE's radial networks) runs as
:func:`sparse_accumulation.ops.activations.silu`: its second derivative, which a training step on forces takes
over every edge, in one pass on CUDA.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from ..ops.activations import silu

__all__ = ["FullyConnectedNet", "DeferredWeights"]


class DeferredWeights:
    """The output of a network whose last layer is linear, not yet computed: ``hidden_of(features) @ matrix``, each
    row scaled by ``scale`` (None: 1). A convolution that takes it (:class:`sparse_accumulation.mace.Convolution`)
    computes the rows it needs when it needs them, so that a ``[rows, matrix.shape[1]]`` tensor (MACE's per-edge
    weights: 5 KB an edge at 128 channels), and the network's hidden rows, need not be held whole, forward or
    backward.

    Args:
        features: ``[rows, f]``, the network's input rows; matrix: ``[h, n]``, its last layer's weight (constants
        folded in); scale: None or ``[rows, 1]``; hidden_of: the layers before the last, ``[rows, f] -> [rows, h]``
        (None: the features are the last layer's input).
    """

    def __init__(self, features: torch.Tensor, matrix: torch.Tensor, scale: Optional[torch.Tensor] = None,
                 hidden_of: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        self.features, self.matrix, self.scale, self.hidden_of = features, matrix, scale, hidden_of

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.features.shape[:-1], self.matrix.shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.features.dtype

    @property
    def device(self) -> torch.device:
        return self.features.device

    def _like(self, matrix: torch.Tensor, scale: Optional[torch.Tensor], features=None) -> "DeferredWeights":
        return DeferredWeights(self.features if features is None else features, matrix, scale, self.hidden_of)

    def __mul__(self, other):
        """Scaled rows (``other`` a ``[rows, 1]`` tensor or a number) stay deferred; anything else computes them."""
        rows = self.features.shape[:-1]
        if isinstance(other, torch.Tensor) and other.shape[-1:] == (1,) and other.shape[:-1] == rows:
            return self._like(self.matrix, other if self.scale is None else self.scale * other)
        if isinstance(other, (int, float)):
            return self._like(self.matrix * other, self.scale)
        return self.materialize() * other

    __rmul__ = __mul__

    def rows(self, start: int, end: int) -> "DeferredWeights":
        """The rows ``start:end``, still deferred."""
        return self._like(self.matrix, None if self.scale is None else self.scale[start:end],
                          self.features[start:end])

    def materialize(self) -> torch.Tensor:
        """``[rows, n]``: the network's output."""
        hidden = self.features if self.hidden_of is None else self.hidden_of(self.features)
        out = hidden @ self.matrix
        return out if self.scale is None else out * self.scale


def _e3nn_nn():
    try:
        import e3nn.nn
    except ImportError as error:
        raise ImportError("sparse_accumulation.e3nn.FullyConnectedNet needs e3nn (pip install e3nn)") from error
    return e3nn.nn


_LAYER = None


def _e3nn_layer() -> type:
    """e3nn's layer class, whose weights the folded forward reads (imported on first use: e3nn is optional)."""
    global _LAYER
    if _LAYER is None:
        from e3nn.nn._fc import _Layer

        _LAYER = _Layer
    return _LAYER


def _is_silu(f) -> bool:
    return f is torch.nn.functional.silu or (type(f) is torch.nn.SiLU and not f.inplace)


class FullyConnectedNet(torch.nn.Module):
    r"""e3nn's fully connected network: e3nn 0.6.0's constructor, parameters (``layer{i}.weight`` of shape
    ``[hs[i], hs[i + 1]]``), initialisation and state dict; ``forward(x [..., hs[0]]) -> [..., hs[-1]]``.

    Args:
        hs: input, hidden and output widths.
        act: the activation (normalised to a second moment of 1 as e3nn does), or None.
        variance_in, variance_out: e3nn's variances of the input and output.
        out_act: apply the activation after the last layer too.

    Raises:
        ImportError: e3nn is not installed.
    """

    __jit_ignored_attributes__ = ["_steps", "defer_last_layer"]  # the eager forward's constants and switches
    #: eager forward of a network whose last layer is linear returns :class:`DeferredWeights` (set on the radial
    #: networks of the convolutions that take them, by :func:`sparse_accumulation.mace.accelerate`)
    defer_last_layer = False
    __e3nn_compile_mode__ = "script"  # e3nn.util.jit.compile (MACE's scripting) scripts it, as e3nn's own

    def __init__(self, hs: Sequence[int], act: Optional[Callable] = None, variance_in: float = 1,
                 variance_out: float = 1, out_act: bool = False) -> None:
        super().__init__()
        self._adopt(_e3nn_nn().FullyConnectedNet(list(hs), act, variance_in, variance_out, out_act))

    @classmethod
    def from_e3nn(cls, net: torch.nn.Module) -> "FullyConnectedNet":
        """The same network as e3nn's ``net`` (an ``e3nn.nn.FullyConnectedNet``), holding its layers and so its
        weight parameters (training either trains both).

        Raises:
            TypeError: ``net`` is not e3nn's ``FullyConnectedNet`` of e3nn's layers and normalised activations.
        """
        nn = _e3nn_nn()
        if type(net) is not nn.FullyConnectedNet:
            raise TypeError(f"net must be e3nn's nn.FullyConnectedNet, got {type(net).__module__}."
                            f"{type(net).__qualname__}")
        ours = cls.__new__(cls)
        torch.nn.Module.__init__(ours)
        ours._adopt(net)
        return ours

    def _adopt(self, net: torch.nn.Module) -> None:
        """Hold ``net``'s layers under their names; read each layer's scale and activation."""
        from e3nn.math import normalize2mom

        self.hs: List[int] = list(net.hs)
        self._steps = []  # (scale of the layer's weight, activation or None), the constants carried forward
        carry = 1.0
        for name, layer in net.named_children():
            if type(layer) is not _e3nn_layer() or not (layer.act is None or isinstance(layer.act, normalize2mom)):
                raise TypeError(f"net.{name} is not e3nn's layer with a normalised activation: {layer!r}")
            self.add_module(name, layer)
            if layer.act is None:
                self._steps.append((carry / (layer.h_in * layer.var_in / layer.var_out) ** 0.5, None))
                carry = 1.0
            else:
                act = silu if _is_silu(layer.act.f) else layer.act.f
                self._steps.append((carry / (layer.h_in * layer.var_in) ** 0.5, act))
                carry = (1.0 if layer.act._is_id else layer.act.cst) * layer.var_out ** 0.5
        self._last_scale = carry

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}{self.hs}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., hs[0]]`` -> ``[..., hs[-1]]``, e3nn's function. Under ``torch.jit.script``, and where a
        layer is no longer e3nn's own (wrapped by MACE's LoRA adapters, say), the layers compute it one after the
        other, as e3nn's network does. With :attr:`defer_last_layer`, a 2-D ``x`` and a last layer without
        activation, eager calls return :class:`DeferredWeights` instead (the same values, computed by their
        user)."""
        if torch.jit.is_scripting():
            for layer in self.children():
                x = layer(x)
            return x
        layers, e3nns = list(self.children()), _e3nn_layer()
        if any(type(layer) is not e3nns for layer in layers):
            for layer in layers:
                x = layer(x)
            return x
        if (self.defer_last_layer and self._steps[-1][1] is None and x.dim() == 2
                and not torch.compiler.is_compiling()):
            return DeferredWeights(x, layers[-1].weight * (self._steps[-1][0] * self._last_scale),
                                   hidden_of=self._hidden)
        x = self._layers(x, len(layers))
        return x if self._last_scale == 1.0 else x * self._last_scale

    @torch.jit.unused
    def _layers(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """The first ``count`` layers, with their folded constants and activations (eager)."""
        for layer, (scale, act) in zip(list(self.children())[:count], self._steps[:count]):
            x = x @ (layer.weight * scale)
            if act is not None:
                x = act(x)
        return x

    @torch.jit.unused
    def _hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The layers before the last (what :class:`DeferredWeights` computes its rows from)."""
        return self._layers(x, len(self._steps) - 1)
