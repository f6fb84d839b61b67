"""Correctness of a benchmarked result against float64 references, before anything is timed."""
from __future__ import annotations

import math

import torch

from ..kernels import reference
from .cases import Case

__all__ = ["TOLERANCE", "tolerance", "relative_error", "reference_dC", "check_result"]

#: Largest accepted max-abs error relative to the largest reference value, per dtype (ten times more for dC,
#: a sum over every row).
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def tolerance(dtype: torch.dtype, quantity: str) -> float:
    """The tolerance of :func:`check_result` for ``quantity`` (``out``, ``dX1``, ``dX2`` or ``dC``)."""
    return TOLERANCE[dtype] * (10 if quantity == "dC" else 1)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|`` in float64; ``inf`` for NaN or a shape mismatch of empties.

    Raises:
        ValueError: when the shapes differ (for non-empty ``expected``).
    """
    actual, expected = actual.detach(), expected.detach()
    if expected.numel() == 0:
        return 0.0 if actual.shape == expected.shape else math.inf
    if actual.shape != expected.shape:
        raise ValueError(f"shape {tuple(actual.shape)} instead of {tuple(expected.shape)}")
    difference = float((actual.double() - expected).abs().max())
    if math.isnan(difference):
        return math.inf
    return difference / max(float(expected.abs().max()), 1e-30)


def _check_rows(n_rows: int, check_rows: int, device) -> torch.Tensor:
    if check_rows <= 0 or check_rows >= n_rows:
        return torch.arange(n_rows, device=device)
    return torch.linspace(0, n_rows - 1, check_rows, device=device).round().long().unique()


def reference_dC(X1, X2, G, rule) -> torch.Tensor:
    """``dC[k] = sum_r G[r, mu[k]] X1[r, m1[k]] X2[r, m2[k]]`` in float64 over ``[R, M]`` rows, in chunks."""
    m1, m2, mu, C = rule
    step = max(1, (1 << 22) // max(1, len(C)))
    total = torch.zeros(len(C), dtype=torch.float64, device=C.device)
    for start in range(0, X1.shape[0], step):
        rows = slice(start, start + step)
        total += (G[rows].double()[:, mu] * X1[rows].double()[:, m1] * X2[rows].double()[:, m2]).sum(0)
    return total


def check_result(result, mode: str, X1, X2, G, rule, case: Case, grad_c: bool, check_rows: int) -> tuple:
    """``(max relative error, worst quantity)`` of a result against float64 ``index_add``.

    Args:
        result: the forward output ``[A, B, O]`` (``mode="forward"``) or the gradients ``(dX1, dX2[, dC])``
            of ``sum(out * G)`` (``mode="backward"``; ``dC`` is compared when ``grad_c`` and present).
        X1, X2, G: the inputs ``[A, B, M1]``, ``[A, B, M2]`` and the output gradient ``[A, B, O]``.
        rule: ``(m1, m2, mu, C)`` with C in float64.
        check_rows: rows compared, spread over all rows (``0``: all); ``dC`` always sums every row.
    """
    m1, m2, mu, C = rule
    M1, M2, O = case.sizes
    R = case.n_rows
    flat = [t.reshape(R, -1) for t in (X1, X2, G)]
    index = _check_rows(R, check_rows, X1.device)
    x1, x2, g = (t[index].double() for t in flat)
    if mode == "forward":
        expected = {"out": reference.index_add(x1, x2, mu, O, m1, m2, C)}
        actual = {"out": result.reshape(R, O)[index]}
    else:
        x1.requires_grad_(True)
        x2.requires_grad_(True)
        d1, d2 = torch.autograd.grad(reference.index_add(x1, x2, mu, O, m1, m2, C), (x1, x2), g)
        expected = {"dX1": d1, "dX2": d2}
        actual = {"dX1": result[0].reshape(R, M1)[index], "dX2": result[1].reshape(R, M2)[index]}
        if grad_c and len(result) > 2 and result[2] is not None:
            expected["dC"] = reference_dC(*flat[:2], flat[2], rule)
            actual["dC"] = result[2]
    errors = {key: relative_error(actual[key], expected[key]) for key in expected}
    worst = max(errors, key=lambda key: errors[key] / tolerance(case.dtype, key))
    return errors[worst], worst
