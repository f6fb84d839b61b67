"""Allegro models on this library's kernels: the model modifier ``enable_SparseAccumulationContracter``.

Allegro's tensor product (``allegro.nn._strided.Contracter``) couples each edge's tensor features ``x1 [edges, u,
I]`` with its centre atom's environment ``x2 [atoms, u, J]`` (gathered by ``edge_center``) through e3nn's 3j
symbols, weighted per channel and path: ``out[e, u, k] = sum x1[e, u, i] x2[center[e], u, j] w[u, p] C_p[i, j,
k]``. Allegro computes it as dense ``[edges, u, I, J, K]`` products (its ``enable_TritonContracter`` and
``enable_CuEquivarianceContracter`` run on CUDA only). The modifier replaces each contraction but the last
layer's (a diagonal product, cheap as it is) with one sparse accumulation over the 3j symbols' nonzeros, the
gather inside the kernels (:func:`sparse_accumulation.accumulate_rule` with ``indices_2``), differentiable to
every order (forces, stress, training on forces); on the CPU and on CUDA. Parameters and state dicts stay
Allegro's.

Apply it as NequIP's modifiers are applied (:mod:`sparse_accumulation.nequip`): ``enable(model)``,
``nequip.model.modify(model, [{"modifier": "enable_SparseAccumulationContracter"}])``, a training config's
``nequip.model.modify``, or ``nequip-compile ... --modifiers enable_SparseAccumulationContracter``. It is
registered with NequIP when NequIP is imported (this package's ``nequip.extension`` entry point), where Allegro is
installed.
"""
from __future__ import annotations

from ..nequip import attach_modifier, replace_every

MODIFIER = "enable_SparseAccumulationContracter"

__all__ = ["enable", "register", "MODIFIER"]


def register() -> None:
    """Attach ``enable_SparseAccumulationContracter`` to Allegro's ``Contracter`` (idempotent).

    Raises:
        ImportError: Allegro (nequip-allegro) is not installed.
    """
    try:
        from allegro.nn._strided._contract import Contracter
    except ImportError as error:
        raise ImportError("sparse_accumulation.allegro needs Allegro: pip install nequip-allegro") from error

    def enable_SparseAccumulationContracter(cls, model):
        """Compute Allegro's tensor products with sparse_accumulation's kernels, on the CPU and on CUDA, for
        inference and training; parameters and state dicts unchanged."""
        from .contracter import replace

        return replace(model, cls)

    attach_modifier(Contracter, MODIFIER, enable_SparseAccumulationContracter)


def enable(model):
    """``model`` (an Allegro model, or any module holding Allegro's ``Contracter`` s) with its contractions on
    this library's kernels, in place; returns it. The same as
    ``nequip.model.modify(model, [{"modifier": "enable_SparseAccumulationContracter"}])``.

    Raises:
        ImportError: Allegro is not installed.
        ValueError: ``model`` holds no Allegro ``Contracter``.
    """
    register()
    from .contracter import Contracter, replace

    return replace_every(model, Contracter, replace, "Allegro Contracter")
