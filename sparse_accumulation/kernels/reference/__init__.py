"""Reference implementations, for validation and benchmarks: plain, differentiable torch code, slow or
memory-hungry by design. :mod:`.accumulate`: the sparse accumulation's (its functions are re-exported here,
and as ``sparse_accumulation.reference``); :mod:`.pair_sums`: the pair sums'.
"""
from .accumulate import BY_NAME, dense_coefficients, dense_matmul, index_add, loops, sparse_matmul

__all__ = ["BY_NAME", "dense_coefficients", "dense_matmul", "index_add", "loops", "sparse_matmul"]
