"""The functions ``bench`` times: ``f(X1 [A, B, M1], X2 [A, B, M2], C) -> [A, B, O]`` for each implementation
name, the rule each one uses, and why an implementation cannot run on a case."""
from __future__ import annotations

import importlib
import math
import os
from typing import Callable, Optional

import torch

from .. import backends
from ..ops.accumulate.api import accumulate_rule
from ..kernels import reference
from ..modules import get_cg_transformation_rule
from ..descriptors.rules import Rule
from .cases import FLOOR, Case

__all__ = ["rule", "forward_function", "unavailable_reason", "is_out_of_memory", "LOOPS_MAX_WORK"]

#: rows * nnz above which the Python-loop reference is skipped
LOOPS_MAX_WORK = 2_000_000


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a host or device out-of-memory error."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(error).lower()


def _memory_limit(device: torch.device) -> float:
    """Bytes an intermediate may take before a memory-hungry reference is skipped."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / 2
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 4
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def unavailable_reason(name: str, case: Case, mode: str, nnz: int) -> Optional[str]:
    """Why ``name`` is skipped for this case and mode (``None`` when it runs)."""
    device = torch.device(case.device)
    if name in backends.KERNELS:
        return None if backends.is_available(name, device) else f"not available on {device.type}"
    if name == FLOOR:
        return None
    if name == "e3nn":
        try:
            importlib.import_module("e3nn.o3")
        except Exception as error:  # noqa: BLE001 - not installed or broken: skipped with the reason
            return f"e3nn not importable ({type(error).__name__})"
        return None
    M1, M2, O = case.sizes
    elt = torch.empty(0, dtype=case.dtype).element_size()
    factor = 3 if mode == "backward" else 1
    if name == "loops" and case.n_rows * nnz > LOOPS_MAX_WORK:
        return "too large for the loop reference"
    work = {"loops": case.n_rows * O, "index_add": 3 * case.n_rows * nnz,
            "dense": 2 * case.n_rows * M1 * M2, "sparse": 3 * case.n_rows * M1 * M2}[name]
    if work * elt * factor > _memory_limit(device):
        return "intermediate too large for memory"
    return None


def rule(case: Case, basis: str = "real") -> tuple:
    """``(m1, m2, mu, C)`` of the case in float64 on its device; e3nn's TensorProduct scaling for ``e3nn``."""
    m1, m2, mu, C = get_cg_transformation_rule(case.l1, case.l2, case.L, dtype=torch.float64,
                                               device=case.device, basis=basis)
    if basis == "e3nn":  # e3nn's TensorProduct with normalization "none" is wigner_3j = C / sqrt(2L + 1)
        C = C / math.sqrt(2 * case.L + 1)
    return m1, m2, mu, C


def forward_function(name: str, case: Case, case_rule) -> Callable:
    """``f(X1 [A, B, M1], X2 [A, B, M2], C) -> [A, B, O]`` for an implementation name.

    The kernels are called with a :class:`~sparse_accumulation.Rule`, as the modules call them (no index
    read per call, compile-visible Triton kernels). :data:`~sparse_accumulation.bench.cases.FLOOR` is
    ``sin(X1 * X2)`` on inputs of the output's shape.
    """
    m1, m2, mu, _ = case_rule
    M1, M2, O = case.sizes
    if name in backends.KERNELS:
        prepared = Rule(m1, m2, mu, O, input_sizes=(M1, M2))
        return lambda X1, X2, C: accumulate_rule(X1, X2, prepared, C, implementation=name)
    if name == FLOOR:
        return lambda X1, X2, C: torch.sin(X1 * X2)
    if name == "e3nn":
        from e3nn import o3

        A, B = case.rows
        tp = o3.TensorProduct(f"{B}x{case.l1}e", f"{B}x{case.l2}e", f"{B}x{case.L}e",
                              [(0, 0, 0, "uuu", False)], irrep_normalization="none",
                              path_normalization="none").to(device=case.device, dtype=case.dtype)
        return lambda X1, X2, C: tp(X1.reshape(A, -1), X2.reshape(A, -1)).reshape(A, B, O)
    function = reference.BY_NAME[name]
    return lambda X1, X2, C: function(X1, X2, mu, O, m1, m2, C)
