"""sparse-accumulation: fast, differentiable sparse accumulation for Clebsch-Gordan products.

``accumulate(X1, X2, mu, output_size, m1, m2, C)`` computes
``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]`` with numba kernels on the CPU and Triton
kernels on CUDA, registered as torch custom ops (``torch.ops.sparse_accumulation``) with gradients for X1,
X2 and C to any order. ``accumulate_rule(X1, X2, rule, C, W=None)`` does the same with a prepared
:class:`Rule` (no index read per call; optional per-row weights ``W``). ``reference`` holds slow, independent
implementations for validation. ``accumulate_graph`` is the message-passing form (gathered rows, summed rows,
fused), ``envsum``, ``sensesum`` and ``featsum`` the pair sums of HIP-NN (:mod:`.hippynn` makes them a hippynn
kernel backend). How the package is laid out: docs, "Inside the package".
"""
from . import ops  # registers torch.ops.sparse_accumulation
from .ops.accumulate.api import accumulate, accumulate_active_dim_first, accumulate_active_dim_middle, accumulate_rule
from .ops.graph.api import accumulate_graph
from .ops.pair_sums.api import envsum, featsum, sensesum
from .backends import get_default_implementation, is_available, set_default_implementation
from .kernels import reference
from .modules import CGCalculatorSingle, get_cg_transformation_rule
from .descriptors import ChannelRule, ColumnMap, Program, Rule
from .indices import Elements, Index
from . import products
from .products import ClebschGordanIteration, ClebschGordanProduct
from . import hippynn

__version__ = "0.1.0"

__all__ = [
    "accumulate",
    "accumulate_active_dim_first",
    "accumulate_active_dim_middle",
    "accumulate_rule",
    "accumulate_graph",
    "Rule",
    "ChannelRule",
    "ColumnMap",
    "Program",
    "Index",
    "Elements",
    "set_default_implementation",
    "get_default_implementation",
    "is_available",
    "get_cg_transformation_rule",
    "CGCalculatorSingle",
    "ClebschGordanProduct",
    "ClebschGordanIteration",
    "envsum",
    "sensesum",
    "featsum",
    "hippynn",
    "products",
    "reference",
    "ops",
]
