"""What ``bench`` measures: cases, the standard sets of cases, implementation and mode names, floor bytes.

A :class:`Case` is a real CG rule ``l1 x l2 -> L`` applied to ``[A, B, 2l + 1]`` inputs of one dtype on one
device. A *mode* is what one call computes (``forward``, or ``backward``: the forward and the gradients of
``sum(out * G)``); how a call is timed is a *timing* (:mod:`sparse_accumulation.bench.timing`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch

from .. import backends
from ..modules import get_cg_transformation_rule

__all__ = [
    "Case", "DTYPES", "MODES", "IMPLEMENTATIONS", "BASELINE", "FLOOR", "DEFAULT_RULES", "QUICK_RULES",
    "DEFAULT_ROWS", "QUICK_ROWS", "available_devices", "default_implementations", "standard_cases",
    "normalize_modes", "floor_bytes", "mode_label",
]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
#: ``forward`` computes ``out = op(X1, X2, C)``; ``backward`` the forward and the gradients of
#: ``sum(out * G)`` with respect to X1 and X2 (and C with ``grad_c=True``).
MODES = ("forward", "backward")
_MODE_ALIASES = {"forward": "forward", "fwd": "forward", "backward": "backward", "bwd": "backward",
                 "fwd+bwd": "backward", "forward+backward": "backward"}
#: The speed-up column compares every implementation with this one.
BASELINE = "index_add"
#: Plain torch ``sin(a * b)`` on two ``[A, B, 2L + 1]`` tensors: not the op, but the cost of the smallest
#: elementwise forward (+ backward) torch runs on inputs of that size, i.e. the host-overhead floor.
FLOOR = "elementwise"
#: Names accepted by :func:`~sparse_accumulation.bench.run_benchmark`: the kernels, the references, ``e3nn``
#: (e3nn's ``uuu`` TensorProduct, in its own basis, when e3nn is installed) and :data:`FLOOR`.
IMPLEMENTATIONS = backends.KERNELS + backends.REFERENCES + ("e3nn", FLOOR)
DEFAULT_RULES = ((8, 8, 8), (4, 4, 4), (2, 2, 2), (3, 2, 4), (1, 1, 2))
QUICK_RULES = ((8, 8, 8), (2, 2, 2))
DEFAULT_ROWS = {"cpu": (1000, 200), "cuda": (1000, 2000)}
QUICK_ROWS = (100, 50)


@dataclass(frozen=True)
class Case:
    """One benchmark case: the real CG rule ``l1 x l2 -> L`` on ``[A, B, 2l + 1]`` inputs."""

    l1: int
    l2: int
    L: int
    rows: tuple = (1000, 200)
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    @property
    def rule_name(self) -> str:
        return f"{self.l1}x{self.l2}->{self.L}"

    @property
    def sizes(self) -> tuple:
        """``(M1, M2, O)``: the component counts ``2l + 1`` of X1, X2 and the output."""
        return 2 * self.l1 + 1, 2 * self.l2 + 1, 2 * self.L + 1

    @property
    def n_rows(self) -> int:
        return math.prod(self.rows)


def available_devices() -> list:
    """``["cpu"]`` plus ``"cuda"`` when a CUDA device is usable."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def default_implementations(device: str) -> tuple:
    """The implementations :func:`~sparse_accumulation.bench.run_benchmark` runs by default on ``device``."""
    if torch.device(device).type == "cuda":
        return ("triton", "torch", BASELINE, "dense", "sparse", "e3nn", FLOOR)
    return ("numba", "torch", BASELINE, "dense", "sparse", FLOOR)


def standard_cases(quick: bool = False, devices: Optional[Sequence[str]] = None, rules=None, rows=None,
                   dtypes: Sequence[torch.dtype] = (torch.float32,)) -> list:
    """The standard set: :data:`DEFAULT_RULES` (or :data:`QUICK_RULES`) on every device and dtype.

    Rows default to 1000 x 200 on CPU and 1000 x 2000 on CUDA (:data:`QUICK_ROWS` with ``quick``).
    """
    devices = available_devices() if devices is None else list(devices)
    rules = (QUICK_RULES if quick else DEFAULT_RULES) if rules is None else rules
    cases = []
    for device in devices:
        device_rows = rows or (QUICK_ROWS if quick else DEFAULT_ROWS[torch.device(device).type])
        for dtype in dtypes:
            cases += [Case(l1, l2, L, tuple(device_rows), dtype, device) for l1, l2, L in rules]
    return cases


def normalize_modes(modes: Iterable[str]) -> tuple:
    """Map mode names and aliases (``fwd``, ``bwd``, ``fwd+bwd``) to :data:`MODES` entries.

    Raises:
        ValueError: for an unknown name.
    """
    result = []
    for mode in modes:
        if mode not in _MODE_ALIASES:
            raise ValueError(f"unknown mode {mode!r}; use forward or backward")
        if _MODE_ALIASES[mode] not in result:
            result.append(_MODE_ALIASES[mode])
    return tuple(result)


def mode_label(mode: str) -> str:
    """``"fwd"`` or ``"fwd+bwd"``: how tables and charts name a mode."""
    return "fwd" if mode == "forward" else "fwd+bwd"


def floor_bytes(case: Case, mode: str, grad_c: bool = False) -> int:
    """Bytes a perfect implementation moves: every input read once and every output written once.

    ``forward`` reads X1, X2 (and the rule) and writes the output; ``backward`` adds reading G, X1 and X2
    and writing dX1 and dX2 (and dC).
    """
    M1, M2, O = case.sizes
    elt = torch.empty(0, dtype=case.dtype).element_size()
    nnz = len(get_cg_transformation_rule(case.l1, case.l2, case.L)[3])
    rule_bytes = nnz * (elt + 3 * 8)
    total = case.n_rows * (M1 + M2 + O) * elt + rule_bytes
    if mode == "backward":
        total += case.n_rows * (O + M1 + M2 + M1 + M2) * elt + rule_bytes + (nnz * elt if grad_c else 0)
    return total
