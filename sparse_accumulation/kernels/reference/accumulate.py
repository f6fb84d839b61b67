"""Reference implementations of sparse accumulation, for validation and benchmarks.

Each function has the public signature ``f(X1, X2, mu, output_size, m1, m2, C) -> out`` on ``[..., M]``
tensors (active dimension last, leading dimensions broadcasting) and is written with plain, differentiable
torch operations, so autograd gives reference gradients with respect to X1, X2 and C. ``loops`` and
``index_add`` also take a weight operand ``W`` with its indices ``w`` (``out[..., mu[k]] += X1[..., m1[k]] *
X2[..., m2[k]] * W[..., w[k]] * C[k]``). They do no validation beyond what torch does and are
slow or memory-hungry by design (``index_add`` and ``loops`` materialize ``[rows, nnz]`` work); use
:func:`sparse_accumulation.accumulate` for real work.
"""
from __future__ import annotations

import torch

__all__ = ["loops", "index_add", "dense_matmul", "sparse_matmul", "dense_coefficients", "BY_NAME"]


def _output(output_size: int, *operands) -> torch.Tensor:
    lead = torch.broadcast_shapes(*(t.shape[:-1] for t in operands))
    return torch.zeros(*lead, output_size, dtype=operands[0].dtype, device=operands[0].device)


def _weights(W, w):
    if (W is None) != (w is None):
        raise ValueError("W and w go together: give both or neither")
    return () if W is None else (W,)


def loops(X1, X2, mu, output_size, m1, m2, C, W=None, w=None):
    """The definition, one nonzero at a time: ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] * C[k]``
    (times ``W[..., w[k]]`` with weights)."""
    out = _output(output_size, X1, X2, *_weights(W, w))
    for k in range(len(C)):
        j = int(mu[k])
        term = X1[..., int(m1[k])] * X2[..., int(m2[k])] * C[k]
        if W is not None:
            term = term * W[..., int(w[k])]
        out[..., j] = out[..., j] + term
    return out


def index_add(X1, X2, mu, output_size, m1, m2, C, W=None, w=None):
    """Gather all products into a ``[..., nnz]`` tensor, then ``index_add`` them into the output columns."""
    products = X1[..., m1.long()] * X2[..., m2.long()] * C
    if W is not None or w is not None:
        products = products * _weights(W, w)[0][..., w.long()]
    return _output(output_size, X1, X2, *_weights(W, w)).index_add(-1, mu.long(), products)


def dense_coefficients(m1, m2, mu, C, M1: int, M2: int, output_size: int) -> torch.Tensor:
    """The dense ``[M1, M2, output_size]`` coefficient array of a rule (duplicates summed; differentiable in C)."""
    dense = torch.zeros(M1, M2, output_size, dtype=C.dtype, device=C.device)
    return dense.index_put((m1.long(), m2.long(), mu.long()), C, accumulate=True)


def dense_matmul(X1, X2, mu, output_size, m1, m2, C):
    """Outer product ``X1 (x) X2`` (``[rows, M1*M2]``) times the dense coefficient matrix, zeros included."""
    M1, M2 = X1.shape[-1], X2.shape[-1]
    dense = dense_coefficients(m1, m2, mu, C, M1, M2, output_size).reshape(M1 * M2, output_size)
    outer = (X1.unsqueeze(-1) * X2.unsqueeze(-2)).flatten(-2)
    return outer @ dense


def sparse_matmul(X1, X2, mu, output_size, m1, m2, C):
    """Outer product ``X1 (x) X2`` times the coefficients as a sparse COO ``[output_size, M1*M2]`` matrix."""
    M1, M2 = X1.shape[-1], X2.shape[-1]
    lead = torch.broadcast_shapes(X1.shape[:-1], X2.shape[:-1])
    indices = torch.stack([mu.long(), m1.long() * M2 + m2.long()])
    sparse = torch.sparse_coo_tensor(indices, C, (output_size, M1 * M2), check_invariants=True).coalesce()
    outer = (X1.unsqueeze(-1) * X2.unsqueeze(-2)).reshape(-1, M1 * M2)
    # CUDA's sparse.mm returns wrong values once the dense operand has 2**20 columns or more (seen with
    # torch 2.11): multiply in chunks of rows below that.
    chunks = [torch.sparse.mm(sparse, part.T).T for part in outer.split(_SPARSE_MM_ROWS)]
    out = torch.cat(chunks) if chunks else outer.new_zeros(0, output_size)
    return out.reshape(*lead, output_size)


_SPARSE_MM_ROWS = 1 << 19


#: the reference implementations by their ``implementation=`` name
BY_NAME = {"loops": loops, "index_add": index_add, "dense": dense_matmul, "sparse": sparse_matmul}
