"""NequIP models on this library's fused message passing: the model modifier ``enable_SparseAccumulation``.

NequIP's convolution is a ``TensorProductScatter``: e3nn's "uvu" tensor product of the neighbours' features
``x[edge_src]`` with the edges' spherical harmonics, weighted per edge by the radial network, then summed by
``edge_dst``. The modifier replaces each with :class:`~.convolution.SparseAccumulationTensorProductScatter`, which
computes the same in one fused call (:class:`sparse_accumulation.e3nn.TensorProduct` with ``indices_1``,
``indices_out``): no per-edge messages in memory, every derivative (forces, stress, training on forces) on the
kernels. Parameters and state dicts are NequIP's own (the replaced module keeps e3nn's product for its buffers,
as NequIP's other accelerations do), so checkpoints load with or without it.

Use it where NequIP takes modifiers (it is a classmethod of NequIP's ``TensorProductScatter``, registered when
NequIP is imported, through the ``nequip.extension`` entry point of this package):

* from Python: ``sparse_accumulation.nequip.enable(model)``, or
  ``nequip.model.modify(model, [{"modifier": "enable_SparseAccumulation"}])``;
* in a training config: ``_target_: nequip.model.modify`` with ``modifiers: [{modifier: enable_SparseAccumulation}]``;
* when compiling: ``nequip-compile ... --modifiers enable_SparseAccumulation`` (AOTInductor; the compiled
  model calls this library's ops, so it runs where Python imports this package: ASE, torch-sim, LAMMPS's
  ML-IAP).

nequip itself is imported only by the functions here, and by :mod:`.convolution`.
"""
from __future__ import annotations

MODIFIER = "enable_SparseAccumulation"

__all__ = ["enable", "register", "MODIFIER"]


def register() -> None:
    """Attach ``enable_SparseAccumulation`` to NequIP's ``TensorProductScatter`` (idempotent): ``nequip.model.modify``
    finds modifiers among the classmethods of a model's modules. Runs when NequIP is imported (the entry point);
    call it yourself only where this package was not installed with its entry points.

    Raises:
        ImportError: nequip is not installed.
    """
    try:
        from nequip.nn._tp_scatter_base import TensorProductScatter
    except ImportError as error:
        raise ImportError("sparse_accumulation.nequip needs nequip: pip install nequip") from error

    def enable_SparseAccumulation(cls, model):
        """Compute NequIP's convolutions (tensor product and scatter) with sparse_accumulation's fused message
        passing, on the CPU and on CUDA; parameters and state dicts unchanged."""
        from .convolution import replace

        return replace(model, cls)

    attach_modifier(TensorProductScatter, MODIFIER, enable_SparseAccumulation)


def enable(model):
    """``model`` (a NequIP model: a ``GraphModel`` or any module holding NequIP convolutions) with every
    ``TensorProductScatter`` replaced by the fused one, in place; returns it. The same as
    ``nequip.model.modify(model, [{"modifier": "enable_SparseAccumulation"}])``.

    Raises:
        ImportError: nequip is not installed.
        ValueError: ``model`` holds no NequIP convolution.
    """
    register()
    from .convolution import TensorProductScatter, replace

    return replace_every(model, TensorProductScatter, replace, "NequIP TensorProductScatter")


def attach_modifier(cls, name: str, method) -> None:
    """``method(cls, model)`` as the NequIP model modifier ``name`` of ``cls`` (idempotent): not persistent (named
    again where a model is compiled or deployed, as NequIP's own accelerations), on every device, for AOTInductor."""
    from nequip.nn.model_modifier_utils import model_modifier

    if name not in vars(cls):
        setattr(cls, name, model_modifier(persistent=False, private=False, unsupported_devices=[],
                                          supported_compile_modes=["aotinductor"])(classmethod(method)))


def replace_every(model, cls, replace, what: str):
    """``replace(model, cls)``, or ValueError naming ``what`` where ``model`` holds no module of class ``cls``."""
    if not any(isinstance(m, cls) for m in model.modules()):
        raise ValueError(f"model holds no {what} to replace (a {type(model).__name__})")
    return replace(model, cls)
