"""``sparse-accumulation check``: the installed kernels against float64 references, on every device."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from .. import backends
from ..ops.accumulate.api import accumulate
from ..kernels import reference
from ..modules import get_cg_transformation_rule
from .cases import available_devices
from .checking import TOLERANCE, relative_error
from .progress import progress_bar
from .timing import waits_for_compiles

__all__ = ["CheckResult", "run_check", "format_check"]


@dataclass
class CheckResult:
    """Outcome of :func:`run_check` for one implementation on one device."""

    implementation: str
    device: str
    status: str  # "OK", "FAILED" or "skipped"
    detail: str = ""
    max_error: float = 0.0
    checks: int = 0
    failures: list = field(default_factory=list)


def _check_rules(generator: torch.Generator):
    """Real CG rules and one random rule with unsorted, repeated output indices."""
    rules = [("real 1x1->2", get_cg_transformation_rule(1, 1, 2, dtype=torch.float64)),
             ("real 2x1->2", get_cg_transformation_rule(2, 1, 2, dtype=torch.float64)),
             ("real 3x2->4", get_cg_transformation_rule(3, 2, 4, dtype=torch.float64)),
             ("e3nn 4x4->4", get_cg_transformation_rule(4, 4, 4, dtype=torch.float64, basis="e3nn"))]
    nnz, sizes = 23, (4, 6, 5)
    random = tuple(torch.randint(0, size, (nnz,), generator=generator) for size in sizes)
    rules.append(("random unsorted", random + (torch.randn(nnz, generator=generator, dtype=torch.float64),)))
    return rules


def _kernel_reason(name: str, device: torch.device) -> tuple:
    """``(status, detail)`` for an implementation that is not available: skipped or FAILED (broken install)."""
    expected_here = (name == "numba" and device.type == "cpu") or (name == "triton" and device.type == "cuda")
    if not expected_here:
        needs = {"numba": "a CPU device", "triton": "a CUDA device (or TRITON_INTERPRET=1 on CPU)"}[name]
        return "skipped", f"needs {needs}"
    # the package itself first: the Triton kernel modules import without triton (they report it unavailable)
    operations = [op for op, kernels in backends.KERNELS_OF.items() if name in kernels]
    for module in (name,) + tuple(f"sparse_accumulation.kernels.{name}.{op}" for op in operations):
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - the point is to report it
            return "FAILED", f"cannot import the {name} kernels ({module}): {type(error).__name__}: {error}"
    return "FAILED", f"{name} reports itself unavailable on {device.type}"


def _derivatives(fn, inputs, G, H1, H2, double: bool) -> dict:
    """The output, its gradients for ``G`` and (with ``double``) the gradients of ``<dX1, H1> + <dX2, H2>``."""
    out = fn(*inputs)
    d1, d2, dC = torch.autograd.grad(out, inputs, G, create_graph=double)
    values = {"forward": out.detach(), "dX1": d1.detach(), "dX2": d2.detach(), "dC": dC.detach()}
    if double:
        gg = torch.autograd.grad((d1 * H1).sum() + (d2 * H2).sum(), inputs, allow_unused=True)
        for key, value, like in zip(("ddX1", "ddX2", "ddC"), gg, inputs):
            values[key] = torch.zeros_like(like) if value is None else value.detach()
    return values


def _check_one(name: str, device: torch.device, generator: torch.Generator, rows=(7, 19)) -> CheckResult:
    """Forward, gradients (X1, X2, C) and a double backward of ``name`` against float64 index_add."""
    result = CheckResult(name, device.type, "OK")
    dtypes = (torch.float64, torch.float32, torch.bfloat16)
    if name == "triton" and device.type == "cpu":
        dtypes, rows = (torch.float32,), (2, 5)  # the interpreter is slow
    for rule_name, (m1, m2, mu, C64) in _check_rules(generator):
        M1, M2, O = int(m1.max()) + 1, int(m2.max()) + 1, int(mu.max()) + 1
        if rule_name.startswith("random"):
            M1, M2, O = M1 + 1, M2 + 1, O + 1  # unused components at the end
        m1, m2, mu, C64 = (t.to(device) for t in (m1, m2, mu, C64))
        X1 = torch.randn(*rows, M1, generator=generator, dtype=torch.float64).to(device)
        X2 = torch.randn(*rows, M2, generator=generator, dtype=torch.float64).to(device)
        G = torch.randn(*rows, O, generator=generator, dtype=torch.float64).to(device)
        H1, H2 = torch.randn_like(X1), torch.randn_like(X2)
        for dtype in dtypes:
            label = f"{rule_name} {str(dtype).replace('torch.', '')}"
            try:
                inputs = [t.to(dtype).requires_grad_(True) for t in (X1, X2, C64)]
                # the reference sees exactly the rounded inputs, in float64
                reference_inputs = [t.detach().double().requires_grad_(True) for t in inputs]
                double = dtype == torch.float64
                got = _derivatives(lambda a, b, c: accumulate(a, b, mu, O, m1, m2, c, implementation=name),
                                   inputs, G.to(dtype), H1.to(dtype), H2.to(dtype), double)
                want = _derivatives(lambda a, b, c: reference.index_add(a, b, mu, O, m1, m2, c),
                                    reference_inputs, G.double(), H1, H2, double)
                for quantity, actual in got.items():
                    error = relative_error(actual, want[quantity])
                    result.checks += 1
                    result.max_error = max(result.max_error, error)
                    tolerance = TOLERANCE[dtype] * (10 if dtype in (torch.float16, torch.bfloat16) else 1)
                    if not error <= tolerance:
                        result.failures.append(f"{label} {quantity}: max relative error {error:.1e}")
            except Exception as error:  # noqa: BLE001 - reported, not raised
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                result.failures.append(f"{label}: {type(error).__name__}: {message}"[:300])
    if result.failures:
        result.status = "FAILED"
        result.detail = f"{len(result.failures)} problem(s); first: {result.failures[0]}"
    else:
        names = ", ".join(str(t).replace("torch.", "") for t in dtypes)
        double = "; double backward in float64" if torch.float64 in dtypes else ""
        result.detail = (f"{result.checks} checks (forward, dX1, dX2, dC{double}; {names}), "
                         f"max rel err {result.max_error:.1e}")
    return result


@waits_for_compiles
def run_check(implementations: Optional[Sequence[str]] = None, devices: Optional[Sequence[str]] = None,
              seed: int = 0, progress=False) -> list:
    """Check every kernel implementation on every device against float64 references.

    Each available (implementation, device) pair runs real and random rules in float64, float32 and
    bfloat16: forward, gradients with respect to X1, X2 and C, and (in float64) a double backward, through
    the public :func:`~sparse_accumulation.accumulate`. A kernel that should work on a device but cannot be
    imported (a broken numba install, Triton on a CUDA machine) is ``FAILED``, not skipped.

    Args:
        implementations: kernel names (default: all of ``numba``, ``triton``, ``torch``).
        devices: device names (default: every available device).
        seed: seed of the random inputs.
        progress: ``True`` for a progress bar on stderr, or a text stream to draw it on (hidden when the
            stream is not a terminal).

    Returns:
        One :class:`CheckResult` per (implementation, device).
    """
    implementations = list(implementations or backends.KERNELS)
    devices = available_devices() if devices is None else list(devices)
    generator = torch.Generator().manual_seed(seed)
    pairs = [(name, torch.device(device)) for device in devices for name in implementations]
    results = []
    with progress_bar(len(pairs), "check", progress) as bar:
        for name, device in pairs:
            bar.set_postfix_str(f"{name} {device.type}", refresh=False)
            if name in backends.KERNELS and not backends.is_available(name, device):
                status, detail = _kernel_reason(name, device)
                results.append(CheckResult(name, device.type, status, detail))
            else:
                results.append(_check_one(name, device, generator))
            bar.update()
    return results


def format_check(results: Sequence[CheckResult]) -> str:
    """One line per implementation and device, then what ``"auto"`` picks on each device."""
    width = max([len(r.implementation) for r in results] + [4])
    lines = [f"{r.implementation.ljust(width)}  {r.device.ljust(4)}  {r.status.ljust(7)}  {r.detail}".rstrip()
             for r in results]
    for device in sorted({r.device for r in results}):
        preferred = "triton" if device == "cuda" else "numba" if device == "cpu" else "torch"
        picked = preferred if backends.is_available(preferred, device) else \
            f"torch (fallback: {preferred} is not available)"
        lines.append(f"{'auto'.ljust(width)}  {device.ljust(4)}  ->       {picked}")
    return "\n".join(lines)
