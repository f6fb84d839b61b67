"""The registered ops of the pair sums, ``torch.ops.sparse_accumulation.{envsum, sensesum, featsum}``: fake
implementations and autograd.

Each op takes the data and index tensors of its public function (:mod:`sparse_accumulation.ops.pair_sums.api`)
and the name of an implementation (``"auto"``, ``"numba"``, ``"triton"`` or ``"torch"``, resolved where the op
runs, so an exported graph keeps ``"auto"``), and calls the pair-sum kernels of that implementation (``kernels/<backend>/pair_sums.py``) with
the pairs prepared (:class:`sparse_accumulation.indices.Pairs`). The ops are opaque to ``torch.compile`` and
``torch.export`` (their fake implementations give the shapes).

The three sums are each other's gradients, so every backward is written with these ops and is differentiable
again, to any order:

* ``envsum(s, z)``: ``ds = sensesum(G, z)``, ``dz = featsum(G, s)``;
* ``sensesum(env, z)``: ``denv = envsum(G, z)``, ``dz = featsum(env, G)``;
* ``featsum(env, sense)``: ``denv = envsum(sense, G)``, ``dsense = sensesum(env, G)``;

all with the same ``pair_first`` and ``pair_second``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ... import backends
from ...indices import Pairs, unremembered

_NAMESPACE = "sparse_accumulation"

def pairs_of(name: str, a, b, pair_first, pair_second) -> Pairs:
    """The :class:`~sparse_accumulation.indices.Pairs` of sum ``name`` with data ``a``, ``b``: its atoms are
    the rows of its atom-indexed input (``features`` of envsum, ``env`` of the others)."""
    return Pairs(pair_first, pair_second, (b if name == "envsum" else a).shape[0])


def run(name: str, a, b, pair_first, pair_second, implementation: str):
    """Sum ``name`` of data ``a``, ``b`` on the kernels of ``implementation`` (resolved here: a resolved name
    stays itself; a reference name runs the portable torch kernels)."""
    kernels = backends.kernel_module("pair_sums", backends.resolved(implementation, a.device))
    return getattr(kernels, name)(a, b, pairs_of(name, a, b, pair_first, pair_second))


@torch.library.custom_op(f"{_NAMESPACE}::envsum", mutates_args=())
def envsum(sensitivities: Tensor, features: Tensor, pair_first: Tensor, pair_second: Tensor,
           implementation: str) -> Tensor:
    """``env[pair_first[p], nu, f] += sensitivities[p, nu] * features[pair_second[p], f]``."""
    with unremembered():  # compiled graphs call the op: see sparse_accumulation.indices
        return run("envsum", sensitivities, features, pair_first, pair_second, implementation)


@torch.library.custom_op(f"{_NAMESPACE}::sensesum", mutates_args=())
def sensesum(env: Tensor, features: Tensor, pair_first: Tensor, pair_second: Tensor, implementation: str) -> Tensor:
    """``sense[p, nu] = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]``."""
    with unremembered():  # compiled graphs call the op: see sparse_accumulation.indices
        return run("sensesum", env, features, pair_first, pair_second, implementation)


@torch.library.custom_op(f"{_NAMESPACE}::featsum", mutates_args=())
def featsum(env: Tensor, sense: Tensor, pair_first: Tensor, pair_second: Tensor, implementation: str) -> Tensor:
    """``feat[pair_second[p], f] += sum_nu env[pair_first[p], nu, f] * sense[p, nu]``."""
    with unremembered():  # compiled graphs call the op: see sparse_accumulation.indices
        return run("featsum", env, sense, pair_first, pair_second, implementation)


@envsum.register_fake
def _(sensitivities, features, pair_first, pair_second, implementation):
    return features.new_empty((features.shape[0], sensitivities.shape[1], features.shape[1]))


@sensesum.register_fake
def _(env, features, pair_first, pair_second, implementation):
    return env.new_empty((pair_first.shape[0], env.shape[1]))


@featsum.register_fake
def _(env, sense, pair_first, pair_second, implementation):
    return env.new_empty((env.shape[0], env.shape[2]))


#: each sum's gradients: per differentiable input, the sum that computes it and its data arguments from
#: (output gradient, first input, second input)
GRADIENTS = {
    "envsum": (("sensesum", lambda g, a, b: (g, b)), ("featsum", lambda g, a, b: (g, a))),
    "sensesum": (("envsum", lambda g, a, b: (g, b)), ("featsum", lambda g, a, b: (a, g))),
    "featsum": (("envsum", lambda g, a, b: (b, g)), ("sensesum", lambda g, a, b: (a, g))),
}


def gradients(name: str, saved, needs, grad, call) -> tuple:
    """The gradients of sum ``name`` with respect to its two data inputs (``None`` where not needed), each
    computed by ``call(sum_name, x, y, pair_first, pair_second)``; ``saved`` holds the sum's data inputs and
    indices, ``needs`` whether each input needs its gradient."""
    a, b, pair_first, pair_second = saved
    return tuple(call(op, *arguments(grad, a, b), pair_first, pair_second) if need else None
                 for (op, arguments), need in zip(GRADIENTS[name], needs[:2]))


def _setup(ctx, inputs, output):
    first, second, pair_first, pair_second, implementation = inputs
    ctx.save_for_backward(first, second, pair_first, pair_second)
    ctx.implementation = implementation


def _gradient_of(name: str):
    def backward(ctx, grad):
        def call(op, x, y, pair_first, pair_second):
            return _OPS[op](x, y, pair_first, pair_second, ctx.implementation)

        return gradients(name, ctx.saved_tensors, ctx.needs_input_grad, grad, call) + (None, None, None)

    return backward


_OPS = {"envsum": envsum, "sensesum": sensesum, "featsum": featsum}
for _name, _op in _OPS.items():
    _op.register_autograd(_gradient_of(_name), setup_context=_setup)
