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
