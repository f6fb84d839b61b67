"""Clebsch-Gordan rules as torch tensors, and the single-path module of the peer API."""
from __future__ import annotations

import torch

import cg

from .exact import ExactBuffers
from .ops.accumulate.api import accumulate_rule
from .ops.scripted import check_like, check_width
from .descriptors.rules import Rule


def get_cg_transformation_rule(l1: int, l2: int, l_output: int, dtype=torch.float32, device="cpu",
                               basis: str = "real"):
    """The flattened CG rule ``(m1, m2, mu, C)`` of the path ``l1 x l2 -> l_output`` as torch tensors.

    Indices are int64 and offset by ``+l`` (``0 .. 2l``), sorted by ``mu`` (then ``m1``, ``m2``), with no
    explicit zeros; ``C`` has ``dtype``. All four live on ``device``.

    Raises:
        ValueError: invalid ``l`` values (negative, non-integer, ``l_output`` outside ``|l1-l2|..l1+l2``) or
            unknown ``basis`` (``"real"``, ``"complex"`` or ``"e3nn"``); a ``device`` that torch does not know,
            or a CUDA device where torch sees none.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}, but torch {torch.__version__} sees no CUDA device "
                         f"({'a GPU build' if torch.backends.cuda.is_built() else 'a build without CUDA'})")
    m1, m2, mu, C = cg.transformation_rule(l1, l2, l_output, basis=basis)
    indices = tuple(torch.as_tensor(a, dtype=torch.int64, device=device) for a in (m1, m2, mu))
    return indices + (torch.as_tensor(C, dtype=dtype, device=device),)


class CGCalculatorSingle(ExactBuffers, torch.nn.Module):
    """One CG path ``l1 x l2 -> l_output``: ``forward(X1 [..., 2 l1 + 1], X2 [..., 2 l2 + 1]) -> [..., 2 l_output + 1]``.

    The indices are held as a :class:`~sparse_accumulation.Rule` (``rule``, read by no call) and, for
    the peer API, as buffers ``m1``, ``m2``, ``mu``; the coefficients ``C`` are a buffer, so ``.to(device)``
    moves them with the module. The leading dimensions of X1 and X2 broadcast.

    Args:
        l1, l2, l_output: angular momenta of the inputs and the output.
        dtype: dtype of the coefficients (and so of the inputs).
        basis: ``"real"`` (default), ``"complex"`` or ``"e3nn"``.
        implementation: passed to :func:`sparse_accumulation.accumulate`.
    """

    def __init__(self, l1: int, l2: int, l_output: int, dtype=torch.float32, basis: str = "real",
                 implementation=None):
        super().__init__()
        m1, m2, mu, C = get_cg_transformation_rule(l1, l2, l_output, dtype=torch.float64, basis=basis)
        self.l1, self.l2, self.l_output, self.implementation = l1, l2, l_output, implementation
        for name, tensor in (("m1", m1), ("m2", m2), ("mu", mu)):
            self.register_buffer(name, tensor)
        self.register_exact("C", C, dtype, persistent=True)
        self.rule = Rule(m1, m2, mu, 2 * l_output + 1, input_sizes=(2 * l1 + 1, 2 * l2 + 1))
        self._rule_key = self.rule.key  # what a scripted call passes to the registered op

    def forward(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        """The path's product ``[..., 2 l_output + 1]``; under ``torch.jit.script``, the registered op
        ``torch.ops.sparse_accumulation.accumulate`` (``implementation=None`` meaning ``"auto"``)."""
        if torch.jit.is_scripting():
            check_width("X1", X1, 2 * self.l1 + 1, f"[..., {2 * self.l1 + 1}]")
            check_width("X2", X2, 2 * self.l2 + 1, f"[..., {2 * self.l2 + 1}]")
            check_like("X1", X1, "the coefficients C", self.C)
            check_like("X2", X2, "the coefficients C", self.C)
            implementation = "auto" if self.implementation is None else self.implementation
            return torch.ops.sparse_accumulation.accumulate(X1, X2, None, self.C, self._rule_key, implementation)
        return accumulate_rule(X1, X2, self.rule, self.C, implementation=self.implementation)

    def extra_repr(self) -> str:
        return f"l1={self.l1}, l2={self.l2}, l_output={self.l_output}, nnz={self.C.shape[0]}"
