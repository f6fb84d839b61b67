"""Kernels: plain callables on 2-D ``[rows, components]`` tensors, no autograd, no validation.

Every kernel module (numba_cpu, triton_gpu, torch_chunked) offers the same two functions:

* ``accumulate(X1, X2, C, rule, output_size) -> out``:
  ``out[r, mu[k]] += X1[r, m1[k]] * X2[r, m2[k]] * C[k]``, ``out`` contiguous ``[rows, output_size]``.
* ``accumulate_backward(G, X1, X2, C, rule, want_x1, want_x2, want_c) -> (dX1, dX2, dC)``: the gradients of
  ``accumulate`` for the output gradient ``G``, ``None`` where not wanted:
  ``dX1[r, m1[k]] += G[r, mu[k]] * X2[r, m2[k]] * C[k]``, ``dX2`` likewise, and
  ``dC[k] = sum_r G[r, mu[k]] * X1[r, m1[k]] * X2[r, m2[k]]`` (deterministic: no atomics).

Inputs may have any strides; outputs are contiguous, in the dtype of ``X1``; 16-bit inputs are computed in
float32.

``rule`` is a :class:`sparse_accumulation.rules.PreparedRule` whose indices were already checked.
"""
import torch


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels compute in for inputs of ``dtype``: float64 stays, everything else uses float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
