"""Shared helpers of the message-passing tests: random graphs and rules, and an independent float64 reference
(the rows gathered with plain indexing, the product by the brute-force ``loops`` reference, the rows summed
with ``index_add``)."""
import torch

import sparse_accumulation as sa


def weighted_rule(l1=2, l2=1, L=2, weight_size=3):
    """``(rule, C)``: a real CG rule with weights ``w[k] = k % weight_size`` (float64 C)."""
    m1, m2, mu, C = sa.get_cg_transformation_rule(l1, l2, L, dtype=torch.float64)
    w = torch.arange(len(C)) % weight_size
    rule = sa.Rule(m1, m2, mu, 2 * L + 1, input_sizes=(2 * l1 + 1, 2 * l2 + 1), w=w, weight_size=weight_size)
    return rule, C


def random_graph(generator, nodes: int, edges: int, sorted_dst: bool = False):
    """``(src, dst)``: random int64 indices into ``nodes`` rows (``dst`` sorted when asked)."""
    src = torch.randint(0, nodes, (edges,), generator=generator)
    dst = torch.randint(0, nodes, (edges,), generator=generator)
    if sorted_dst:
        dst = dst.sort().values
    return src, dst


def reference(X1, X2, W, C, rule, indices, size_out):
    """``out[indices_out[e]] += rule(X1[indices_1[e]], X2[indices_2[e]], W[indices_w[e]])`` in float64 with
    plain torch (differentiable); operands ``[rows, *channels, M]``, missing indices the edge's own row."""
    operands = [X1, X2, W]
    gathered = [None if t is None else (t if i is None else t[i]) for t, i in zip(operands, indices[:3])]
    gathered = [None if t is None else t.double() for t in gathered]
    extra = {} if W is None else {"W": gathered[2]}
    per_edge = sa.accumulate_rule(gathered[0], gathered[1], rule, C.double(), implementation="loops", **extra)
    if indices[3] is None:
        return per_edge
    out = torch.zeros(size_out, *per_edge.shape[1:], dtype=per_edge.dtype, device=per_edge.device)
    return out.index_add(0, indices[3], per_edge)


def assert_close_to(ours, theirs, rtol):
    """``ours`` (any dtype) against a float64 reference ``theirs``: relative ``rtol``, absolute ``rtol`` times
    the largest reference value (sums cancel, so small entries carry the rounding error of the large ones)."""
    theirs = theirs.double()
    scale = theirs.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(ours.double().cpu(), theirs.cpu(), rtol=rtol, atol=rtol * scale)


#: the patterns of :func:`pattern_case`
PATTERNS = ("X1", "X2", "W", "all", "unweighted", "one-row", "shared-channels")


def pattern_case(generator, pattern):
    """``(operands [X1, X2, W or None], C, rule, indices, size_out)`` of a tiny float64 message-passing call
    (``[rows, channels or 1, M]`` operands) for gradgradcheck: ``pattern`` is ``"X1"``, ``"X2"`` or ``"W"``
    (that operand alone gathered), ``"all"`` (all four indices), ``"unweighted"`` (all indices, a rule
    without weights), ``"one-row"`` (X2 and W one row read by every edge) or ``"shared-channels"`` (X1 and X2
    ``[rows, 1, M]`` against W ``[rows, B, M]``)."""
    channels, nodes, edges = 2, 3, 5
    weighted = pattern != "unweighted"
    if weighted:
        rule, C = weighted_rule(1, 1, 1)
    else:
        m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1, dtype=torch.float64)
        rule = sa.Rule(m1, m2, mu, 3, input_sizes=(3, 3))
    src, dst = random_graph(generator, nodes, edges)
    second = torch.randint(0, 2, (edges,), generator=generator)
    weight_rows = torch.randint(0, 2, (edges,), generator=generator)
    rows = {"X1": edges, "X2": edges, "W": edges}
    operand_channels = {"X1": channels, "X2": 1, "W": channels}
    indices = [None, None, None, None]
    size_out = None
    if pattern == "X1":
        indices[0], rows["X1"] = src, nodes
    elif pattern == "X2":
        indices[1], rows["X2"] = second, 2
    elif pattern == "W":
        indices[2], rows["W"] = weight_rows, 2
    elif pattern in ("all", "unweighted"):
        indices = [src, second, weight_rows if weighted else None, dst]
        rows.update(X1=nodes, X2=2, W=2)
        size_out = nodes
    elif pattern == "one-row":
        indices[0], indices[3], size_out = src, dst, nodes
        rows.update(X1=nodes, X2=1, W=1)
    elif pattern == "shared-channels":
        indices[0], indices[3], size_out = src, dst, nodes
        rows["X1"] = nodes
        operand_channels.update(X1=1, X2=1, W=channels)
    else:
        raise ValueError(f"unknown pattern {pattern!r}")
    names = ("X1", "X2", "W") if weighted else ("X1", "X2")
    operands = [torch.randn(rows[n], operand_channels[n], 3, generator=generator, dtype=torch.float64)
                for n in names]
    if not weighted:
        operands.append(None)
    return operands, C, rule, indices, size_out
