"""Kernels: plain callables, no autograd, no validation.

Every kernel module (numba_cpu, triton_gpu, torch_chunked) offers the same two functions. Operands are the
caller's tensors ``[..., M_i]`` of any strides (stride 0 included), whose leading dimensions broadcast; ``rows``
(a :class:`sparse_accumulation.layout.Rows`, from :func:`sparse_accumulation.layout.plan`) says how to address
them in the folded ``(A, B)`` row space, without copies.

* ``accumulate(X1, X2, W, C, rule, rows) -> out``, ``W`` None for a rule without weights:
  ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * W[..., w[k]] * C[k]`` (broadcast indexing),
  ``out`` contiguous ``[*rows.lead, rule.output_size]``.
* ``accumulate_backward(G, X1, X2, W, C, rule, rows, want_x1, want_x2, want_w, want_c) -> (dX1, dX2, dW, dC)``:
  the gradients of ``accumulate`` for the output gradient ``G`` (``[*rows.lead, output_size]``, any strides),
  ``None`` where not wanted (``want_w`` is False without weights). Each input gradient is contiguous, of the
  shape of its input: summed over what that input broadcasts. ``dC[k] = sum over rows of
  G[mu[k]] * X1[m1[k]] * X2[m2[k]] * W[w[k]]``. Deterministic: no atomics, a fixed order of summation.

Outputs are in the dtype of ``X1`` (all operands share one floating dtype); 16-bit inputs are computed in
float32. ``(M1, M2) == rule.input_sizes`` and, with weights, ``W.shape[-1] == rule.weight_size``. With no rows
the outputs are empty and the gradients zero.

``rule`` is a :class:`sparse_accumulation.rules.Rule` whose indices were already checked.
"""
import torch


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels compute in for inputs of ``dtype``: float64 stays, everything else uses float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
