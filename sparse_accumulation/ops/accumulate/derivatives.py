"""Second derivatives of the sparse accumulation, written once for the registered ops and the eager path.

The accumulation is multilinear: with operands ``x = (X1, X2)`` or ``(X1, X2, W)`` and output gradient ``G``,
its backward is ``dx_i = accumulation of (x with x_i replaced by G)`` under the rule with slot ``i`` and the
output swapped, and ``dC = sum over rows of G * prod_i x_i``. The gradient of
``sum_i <gg_i, dx_i> + <ggC, dC>`` with respect to ``G``, every ``x_j`` and ``C`` is again a sum of such
accumulations and coefficient gradients: the op family is closed under differentiation, so any order of
derivative runs on the same kernels.
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


def _sum_to(t, like):
    """``t`` summed over the dimensions that ``like`` broadcasts (a no-op when the shapes agree)."""
    if t is None or t.shape == like.shape:
        return t
    return t.sum_to_size(like.shape)


def backward_of_backward(G, xs, C, upstream, needed, accumulate, coefficient_gradient):
    """Gradients ``(dG, *dxs, dC)`` of the backward ``(G, *xs, C) -> (*dxs, dC)``.

    Args:
        G: the output gradient the backward received.
        xs: the operands, ``(X1, X2)`` or ``(X1, X2, W)``.
        C: the coefficients.
        upstream: gradients flowing into ``(*dxs, dC)``, ``None`` where absent.
        needed: ``1 + len(xs) + 1`` booleans, whether ``dG``, each ``dx_j`` and ``dC`` are wanted (``None`` is
            returned otherwise).
        accumulate: ``accumulate(operands, c, role)``, a differentiable accumulation of ``operands`` (one per
            slot, in the order of ``xs``) with coefficients ``c`` under the rule (``role=None``, output shaped
            like ``G``) or under the rule with slot ``role`` (an index into ``xs``) and the output swapped,
            whose output has the broadcast shape of the operands.
        coefficient_gradient: ``coefficient_gradient(operands)``, the differentiable
            ``sum over rows of G[mu[k]] * prod_i operands_i[index_i[k]]``.
    """
    n = len(xs)
    gg, ggC = upstream[:n], upstream[n]
    need_G, need_x, need_C = needed[0], needed[1:n + 1], needed[n + 1]

    def replaced(values):
        """``xs`` with the given ``{slot: tensor}`` replacements."""
        return tuple(values.get(j, x) for j, x in enumerate(xs))

    dG = dC = None
    if need_G:
        dG = _sum([accumulate(replaced({i: g}), C, None) for i, g in enumerate(gg) if g is not None]
                  + [accumulate(xs, ggC, None) if ggC is not None else None])
    dxs = []
    for j in range(n):
        if not need_x[j]:
            dxs.append(None)
            continue
        terms = [accumulate(replaced({i: g, j: G}), C, j) for i, g in enumerate(gg) if g is not None and i != j]
        if ggC is not None:
            terms.append(accumulate(replaced({j: G}), ggC, j))
        dxs.append(_sum_to(_sum(terms), xs[j]))
    if need_C:
        dC = _sum([coefficient_gradient(replaced({i: g})) for i, g in enumerate(gg) if g is not None])
    return (dG, *dxs, dC)
