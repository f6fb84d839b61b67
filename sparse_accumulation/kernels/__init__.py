"""Kernels: plain callables, no autograd, no validation, one module per backend and operation.

``kernels/<backend>/<operation>.py``: backends ``numba`` (CPU), ``triton`` (CUDA; CPU tensors under
``TRITON_INTERPRET=1``), ``torch`` (any device) and ``reference`` (plain differentiable torch, for
validation); operations ``accumulate``, ``graph``, ``polynomial`` and ``pair_sums``. Every module of an
operation meets that operation's contract below. :func:`sparse_accumulation.backends.kernel_module` finds the
module of ``(operation, implementation)``. Two Triton modules serve one caller each and have no other backends:
``triton/activations.py`` (SiLU's second derivatives, :mod:`sparse_accumulation.ops.activations`) and
``triton/uvw.py`` (e3nn's fused "uvw" instructions, :mod:`sparse_accumulation.ops.factored`).

Sparse accumulation
-------------------

``kernels/<backend>/accumulate.py`` offers two functions. Operands are the
caller's tensors ``[..., M_i]`` of any strides (stride 0 included), whose leading dimensions broadcast; ``rows``
(a :class:`.layout.Rows`, from :func:`.layout.plan`) says how to address
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

``rule`` is a :class:`~sparse_accumulation.descriptors.rules.Rule` whose indices were already checked.

Graph (message passing)
-----------------------

A call computes outputs of a :class:`~sparse_accumulation.descriptors.channel_rules.ChannelRule` over ``edges`` edges.
The rule's four slots are X1, X2, W (weighted rules) and out (0, 1, 2, 3); output slot ``j`` receives, for
every edge ``e``, channel ``b`` and nonzero ``k``, at its row of edge ``e`` and its column of component
``index_j[k]`` and channel ``b``, ``C[k]`` times the values of every other slot (X1's at ``m1[k]``, X2's at
``m2[k]``, W's at ``w[k]``, out's at ``mu[k]``). The forward is output slot 3 from X1, X2 and W; the gradient of
X1 is output slot 0 with the output gradient in slot 3; and so on.

``run(crule, tensors, indices, outputs, C, *, edges, segments=None, hoisted=(), traceable=False) -> tuple``:

* ``tensors``: per slot, a 2-D ``[rows, width]`` tensor (unit column stride; a slot without index has
  ``edges`` rows, possibly one row expanded with stride 0) or None for a slot that is only written;
* ``indices``: per slot, the int64 ``[edges]`` row of each edge (gathered rows; for an output: the row it adds
  to), or None: edge ``e`` uses row ``e``;
* ``outputs``: ``(slot, mode, rows)`` each: ``"edge"`` (one row per edge, no index), ``"segment"`` (summed into
  ``rows`` rows by its index, through ``segments``) or ``"atomic"`` (the same sum, by atomic adds: the order of
  summation is not fixed);
* ``segments``: ``(offsets, order)`` of one index (the grid index; the segment outputs are gathered by it):
  the edges of row ``r`` are ``order[offsets[r]:offsets[r + 1]]`` (``order`` None: the edges in order, the
  index sorted); kernels may visit the edges row by row in that order;
* ``hoisted``: slots gathered by the grid index (a kernel may read their rows once per segment);
* ``C``: ``[nnz]`` coefficients of the operands' dtype.

Each output is a new ``[rows, width]`` tensor of the operands' dtype (16-bit inputs are computed in float32).
Rows gathered from outside ``[0, rows)`` read as zeros and contributions to rows outside are dropped.

``segment_sum(Z, segments, rows, traceable=False) -> [rows, width]``: row ``r`` is the sum of the rows of
``Z [edges, width]`` of the edges of segment ``r``, in the segments' order.

``coefficient_sums(crule, tensors, indices, *, edges) -> [nnz]``: for every nonzero, the sum over edges and
channels of the product of all four slots (the gradient of C).

Polynomial
----------

``run(program, tensors, elements, outputs) -> tuple`` computes outputs of a
:class:`~sparse_accumulation.descriptors.programs.Program`:

* ``tensors``: per operand a 2-D tensor with unit column stride, ``[N, width]`` for a lane operand and
  ``[E, width]`` for an element operand (``N`` nodes, ``E`` elements);
* ``elements``: the :class:`~sparse_accumulation.indices.Elements` of the nodes (their element, the order
  that sorts them and its tiles);
* ``outputs``: the indices of the program's outputs to compute.

Each output is a new tensor of the operands' dtype, ``[N, width]`` (lane) or ``[E, width]`` (element), with
zeros in the columns its map does not write; float64 is computed in float64, everything else in float32.
Results never depend on how nodes are split into tiles or threads: an element output is summed tile by tile
in a fixed order.

Pair sums
---------

``envsum(s, z, pairs)``, ``sensesum(env, z, pairs)``, ``featsum(env, sense, pairs)``: the sums of
:func:`sparse_accumulation.envsum` and its siblings on tensors whose shapes were checked, ``pairs`` a
:class:`sparse_accumulation.indices.Pairs` (what a kernel needs of the pair indices, prepared on demand).
Outputs are new tensors of the inputs' dtype (16-bit inputs computed in float32).

Activations
-----------

``silu_second_order(x, g, gg) -> (dx, dg)``: the gradients of ``g * silu'(x)`` for its output gradient ``gg``
(three tensors of one shape and dtype; new tensors of that dtype, 16-bit inputs computed in float32). The Triton
module returns None where an eager call's kernel is still compiling.
"""
# imported under another name: importing the subpackage ``kernels.torch`` sets this package's attribute ``torch``
import torch as _torch

#: how a graph kernel writes an output: summed into rows through the segments of its index, one row per edge,
#: or summed by atomic adds (CUDA)
SEGMENT, EDGE, ATOMIC = "segment", "edge", "atomic"


def accumulation_dtype(dtype: _torch.dtype) -> _torch.dtype:
    """The dtype kernels compute in for inputs of ``dtype``: float64 stays, everything else uses float32."""
    return _torch.float64 if dtype == _torch.float64 else _torch.float32
