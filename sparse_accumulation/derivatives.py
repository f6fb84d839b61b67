"""Second derivatives of the sparse accumulation, written once for the registered ops and the eager path.

With ``dX1[m1] += C G[mu] X2[m2]``, ``dX2[m2] += C G[mu] X1[m1]`` and ``dC = sum G[mu] X1[m1] X2[m2]``, the
gradient of ``<gg1, dX1> + <gg2, dX2> + <ggC, dC>`` with respect to ``G, X1, X2, C`` is a sum of sparse
accumulations with the roles of the indices swapped, and of coefficient gradients: the op family is closed
under differentiation, so any order of derivative runs on the same kernels.
"""
from __future__ import annotations


def _sum(terms):
    terms = [t for t in terms if t is not None]
    if not terms:
        return None
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def backward_of_backward(G, X1, X2, C, upstream, needed, accumulate, coefficient_gradient):
    """Gradients ``(dG, dX1, dX2, dC)`` of the backward ``(G, X1, X2, C) -> (dX1, dX2, dC)``.

    Args:
        G, X1, X2, C: the backward's inputs.
        upstream: ``(gg1, gg2, ggC)``, gradients flowing into ``dX1, dX2, dC``, ``None`` where absent.
        needed: four booleans, whether ``dG, dX1, dX2, dC`` are wanted (``None`` is returned otherwise).
        accumulate: ``accumulate(a, b, c, role)``, a differentiable sparse accumulation with the rule
            (``role=None``, output like ``G``), the rule of dX1 (``"X1"``: m1 and mu swapped, output like X1)
            or the rule of dX2 (``"X2"``: m2 and mu swapped, output like X2).
        coefficient_gradient: ``coefficient_gradient(a, b)``, differentiable
            ``sum_r G[r, mu[k]] * a[r, m1[k]] * b[r, m2[k]]``.
    """
    gg1, gg2, ggC = upstream
    need_G, need_X1, need_X2, need_C = needed
    dG = dX1 = dX2 = dC = None
    if need_G:
        dG = _sum([accumulate(gg1, X2, C, None) if gg1 is not None else None,
                   accumulate(X1, gg2, C, None) if gg2 is not None else None,
                   accumulate(X1, X2, ggC, None) if ggC is not None else None])
    if need_X1:
        dX1 = _sum([accumulate(G, gg2, C, "X1") if gg2 is not None else None,
                    accumulate(G, X2, ggC, "X1") if ggC is not None else None])
    if need_X2:
        dX2 = _sum([accumulate(gg1, G, C, "X2") if gg1 is not None else None,
                    accumulate(X1, G, ggC, "X2") if ggC is not None else None])
    if need_C:
        dC = _sum([coefficient_gradient(gg1, X2) if gg1 is not None else None,
                   coefficient_gradient(X1, gg2) if gg2 is not None else None])
    return dG, dX1, dX2, dC
