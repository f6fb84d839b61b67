"""The numba kernel: one function for the forward and every gradient, compiled per variant on first use.

The op is closed under differentiation: the forward is the pass that computes ``dX1`` from G and X2, with
the roles of X1 and G (and of ``m1`` and ``mu``) swapped. So one kernel, :func:`_accumulate`, computes
the gradients of X1, X2, W and C for an output gradient G, and the host (:mod:`.accumulate`) runs the
forward through it as a ``dX1`` pass; a first forward then compiles what the first backward runs too.

A call is cut into tasks of rows (from the shapes alone); the kernel runs the tasks
``first_task .. last_task`` with the GIL released, so the host runs small calls in one go and large ones as a
few ranges on threads. Each task walks its rows in blocks (:mod:`.blocks`).

A variant is compiled for what a call needs only: with or without weights, with or without ``dC``. These
are compile-time constants of the variant (:data:`WEIGHTED`, :data:`WANT_C`), so the branches a variant does
not take are dropped before numba types them; which of the other gradients a call wants is a run-time
argument. Variants are compiled on their first call and kept in numba's disk cache (:func:`variant`);
:mod:`sparse_accumulation.warmup` compiles them all ahead of time.
"""
from __future__ import annotations

import hashlib
import itertools
import types
from pathlib import Path

import numba
import numpy as np
from numba import types as nbtypes
from numba.extending import intrinsic

from . import blocks, prefetch, transpose
from .blocks import (ADD_PRIVATE, ADD_SHARED, BLOCK, SKIP, coefficient_sums, gather, products,
                           products_and_sums, weighted_products, write)

# compile-time constants of a variant (module-level defaults; each variant compiles with its own values)
WEIGHTED = False
WANT_C = False

# stages of a call (a bit mask): zero the gradients that tasks add into, run the tasks, then sum the private
# copies of gradients and the tasks' shares of dC in task order
PREPARE, TASKS, FINISH = 1, 2, 4


@intrinsic
def _pointer(typingctx, address, zero):
    """The integer ``address`` as a pointer to elements of the type of ``zero``."""
    pointer = nbtypes.CPointer(zero)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(address, zero), codegen


# The host passes each tensor as its data address and the number of elements the kernel may touch (a few
# hundred nanoseconds less per tensor than a numpy view); the caller keeps the memory alive.


def _accumulate(addresses, zero, table, numbers, indices, first_task, last_task, stages):
    """Gradients of ``out[r, mu] += c * x1[m1] * x2[m2] (* x3[w])`` for the output gradient G.

    Operands: G, X1, X2, W, C at ``addresses[:5]``; the gradients dX1, dX2, dW, dC at ``addresses[5:9]``, the
    tasks' private copies of dX1, dX2, dW at ``addresses[9:12]``, the tasks' shares of dC (``[tasks, nnz]``)
    at ``addresses[12]``; ``zero`` of the compute dtype. ``table``: a line per operand X1, X2, W, G (``A_i,
    B_i, s_a, s_b, col_stride, linear, reduced, read``: row ``r = a * B + b`` starts at ``a * s_a + b * s_b``
    unless its rows lie one after the other (``linear``); ``reduced``: its gradient adds into a contiguous
    ``[A_i, B_i]`` target; ``read``: the kernel reads it). ``numbers``: ``sizes = (M1, M2, Mw, O)``, the
    ``modes`` of the gradients dX1, dX2, dW (how each is written), their ``private_sizes`` (private copies are
    that far apart), ``rows, B, span, tasks`` (task ``t`` does rows ``t * span ..``), and the ``spans``: the
    elements the kernel may touch in G, X1, X2, W, C, dX1, dX2, dW (or their private copies) and the shares of
    dC. ``indices``: rows of the 15 sorted index arrays (by ``m1`` for dX1: ``order, starts`` and the indices
    of G, X2, W; by ``m2`` for dX2: of X1, G, W; by ``w`` for dW: of X1, X2, G), then m1, m2, mu, w.
    ``stages``: a mask of :data:`PREPARE`, :data:`TASKS` (tasks ``first_task .. last_task``) and
    :data:`FINISH`.
    """
    sizes, modes, private_sizes = numbers[0:4], numbers[4:7], numbers[7:10]
    rows, B, span, tasks = numbers[10], numbers[11], numbers[12], numbers[13]
    spans = numbers[14:23]
    g = numba.carray(_pointer(addresses[0], zero), spans[0])
    x1 = numba.carray(_pointer(addresses[1], zero), spans[1])
    x2 = numba.carray(_pointer(addresses[2], zero), spans[2])
    x3 = numba.carray(_pointer(addresses[3], zero), spans[3])
    c = numba.carray(_pointer(addresses[4], zero), spans[4])
    d1 = numba.carray(_pointer(addresses[9 if modes[0] == ADD_PRIVATE else 5], zero), spans[5])
    d2 = numba.carray(_pointer(addresses[10 if modes[1] == ADD_PRIVATE else 6], zero), spans[6])
    d3 = numba.carray(_pointer(addresses[11 if modes[2] == ADD_PRIVATE else 7], zero), spans[7])
    partial = numba.carray(_pointer(addresses[12], zero), spans[8])
    nnz = c.shape[0]
    if stages & PREPARE:
        for i, d in enumerate((d1, d2, d3)):
            if modes[i] == ADD_SHARED:
                d[:] = 0
    if stages & TASKS and first_task < last_task:
        dtype = x1.dtype
        # per gradient i: c in the order of its grouping, and a C-contiguous accumulator block (a row slice of a
        # shared block would type as non-contiguous)
        cs = (np.empty(nnz, dtype=dtype), np.empty(nnz, dtype=dtype), np.empty(nnz, dtype=dtype))
        accumulators = (np.empty((sizes[0], BLOCK), dtype=dtype), np.empty((sizes[1], BLOCK), dtype=dtype),
                        np.empty((sizes[2], BLOCK), dtype=dtype))
        for i in range(3):
            order, ci = indices[5 * i], cs[i]
            for k in range(nnz):
                ci[k] = c[order[k]]
        # the blocks of X1, X2, W and G
        blocks = (np.empty((sizes[0], BLOCK), dtype=dtype), np.empty((sizes[1], BLOCK), dtype=dtype),
                  np.empty((sizes[2], BLOCK), dtype=dtype), np.empty((sizes[3], BLOCK), dtype=dtype))
        t1, t2, t3, tg = blocks
        ds = (d1, d2, d3)
        offsets = np.empty((4, BLOCK), dtype=np.int64)
        targets = np.empty((4, BLOCK), dtype=np.int64)
        ahead = np.empty((4, 2), dtype=np.int64)
        sources = (x1, x2, x3, g)
        for task in range(first_task, last_task):
            share_of_c = partial[task * nnz:(task + 1) * nnz]
            end = min(rows, (task + 1) * span)
            for first in range(task * span, end, BLOCK):
                n = min(BLOCK, end - first)
                after = min(BLOCK, end - first - n)
                for i in range(4):
                    line = table[i]
                    # the next block's rows, where they lie one after the other: prefetched by the products
                    ahead[i, 0] = (first + n) * sizes[i]
                    ahead[i, 1] = after * sizes[i] if line[5] and line[7] else 0
                    if not line[7] and not line[6]:
                        continue
                    if not line[5] or line[6]:  # where each row starts, and the row of the gradient it adds to
                        a = first // B
                        b = first - a * B
                        for r in range(n):
                            offsets[i, r] = a * line[2] + b * line[3]
                            targets[i, r] = (a if line[0] > 1 else 0) * line[1] + (b if line[1] > 1 else 0)
                            b += 1
                            if b == B:
                                b = 0
                                a += 1
                    if line[7]:
                        gather(sources[i], line, first, n, offsets[i], blocks[i])
                # gradient i: the products of the blocks with that of operand i replaced by G's, grouped by the
                # component of operand i they add to (by m1 for dX1: C G[mu] X2[m2] (W[w]), and so on)
                for i in range(3):
                    if modes[i] == SKIP:
                        continue
                    acc, ci, starts = accumulators[i], cs[i], indices[5 * i + 1]
                    ia, ib, iw = indices[5 * i + 2], indices[5 * i + 3], indices[5 * i + 4]
                    a, b, w = tg if i == 0 else t1, tg if i == 1 else t2, tg if i == 2 else t3
                    acc[:] = 0
                    if WANT_C and i == 0:  # and dC from the same products
                        products_and_sums(acc, a, b, w, ci, ia, ib, iw, starts, n, WEIGHTED, t1, indices[0],
                                          share_of_c, zero, sources, ahead)
                    elif WEIGHTED:
                        weighted_products(acc, a, b, w, ci, ia, ib, iw, starts, n, sources, ahead)
                    else:
                        products(acc, a, b, ci, ia, ib, starts, n, sources, ahead)
                    write(acc, first, n, ds[i], targets[i], modes[i], task, private_sizes[i])
                if WANT_C and modes[0] == SKIP:  # dC[k] = sum over rows of G[mu] X1[m1] X2[m2] (W[w])
                    coefficient_sums(tg, t1, t2, t3, indices[15], indices[16], indices[17], indices[18], nnz, n,
                                     WEIGHTED, share_of_c, zero)
    if stages & FINISH:
        for i, d in enumerate((d1, d2, d3)):
            if modes[i] == ADD_PRIVATE:  # the target is the sum of the copies, in task order
                size = private_sizes[i]
                target = numba.carray(_pointer(addresses[5 + i], zero), size)
                for j in range(size):
                    total = d[j]
                    for task in range(1, tasks):
                        total += d[task * size + j]
                    target[j] = total
        if WANT_C:
            dc = numba.carray(_pointer(addresses[8], zero), nnz)
            for k in range(nnz):
                total = 0.0
                for task in range(tasks):
                    total += partial[task * nnz + k]
                dc[k] = total


def _source_tag() -> str:
    """A digest of the kernel sources (this file and the modules compiled into its kernel)."""
    digest = hashlib.sha256()
    for module in (blocks, prefetch, transpose):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:12]


_SOURCE_TAG = _source_tag()

#: the names of the compile-time constants of a variant
CONSTANTS = ("WEIGHTED", "WANT_C")

_variants: dict = {}


def variant(weighted: bool, want_c: bool):
    """The kernel compiled with :data:`WEIGHTED` = ``weighted`` and :data:`WANT_C` = ``want_c``, made on first
    use (numba compiles it on its first call, or loads it from its disk cache).

    Each variant has a name of its own that carries a digest of the kernel sources: numba's disk cache keys
    compiled code by function name and signature, not by the values of globals, and it checks only the file of
    the function it caches, so without the digest a change to a helper in another file would go unnoticed.
    """
    key = (bool(weighted), bool(want_c))
    dispatcher = _variants.get(key)
    if dispatcher is None:
        constants = dict(zip(CONSTANTS, key))
        tag = "".join(f"_{name.lower()}" for name, value in constants.items() if value)
        name = f"_accumulate{tag}_{_SOURCE_TAG}"
        scope = dict(_accumulate.__globals__, **constants)
        named = types.FunctionType(_accumulate.__code__, scope, name)
        named.__qualname__ = name
        dispatcher = _variants[key] = numba.njit(cache=True, nogil=True, no_cfunc_wrapper=True,
                                                 fastmath={"contract"})(named)
    return dispatcher


def all_variants() -> list:
    """``(weighted, want_c)`` of every variant."""
    return list(itertools.product((False, True), repeat=2))
