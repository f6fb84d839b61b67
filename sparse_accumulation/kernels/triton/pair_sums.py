"""Triton kernels of the pair sums (:mod:`sparse_accumulation.ops.pair_sums`); CUDA tensors, or CPU tensors
under ``TRITON_INTERPRET=1`` (set before this module is imported).

One small program (one warp by default) per atom and block of ``nu`` / ``feat`` sums the pairs of the atom's
CSR segment (:class:`sparse_accumulation.indices.Pairs`) in blocks of ``BLOCK_P`` pairs, in the segment's fixed order: no atomics
(except in the optional :data:`FEATSUM` ``= "atomic"``), every output element written once, results
reproducible run to run. The programs of one atom are adjacent in the grid (their rows are read from memory
once), and the other index is prepared in segment order once per index tensor, so a program's chain of
dependent loads is short: segment bounds, then its pairs and their other atoms side by side, then the rows.
Programs are small because the sums are bound by how many segments are in flight at once, not by arithmetic.

* ``envsum``: per atom ``a`` (segments by ``pair_first``), ``env[a] = s[seg]^T @ z[pair_second[seg]]``, a
  ``[nu, P] x [P, feat]`` product per block of pairs (``tl.dot``);
* ``sensesum``: per atom ``a`` (segments by ``pair_first``), ``sense[seg] = z[pair_second[seg]] @ env[a]^T``,
  a ``[P, feat] x [feat, nu]`` product per block of pairs, written to the pairs' own rows;
* ``featsum``: per atom ``b`` (segments by ``pair_second``), ``feat[b] = sum over the pairs and nu of
  sense[p, nu] * env[pair_first[p], nu]``: rows of env gathered ``BLOCK_P * BLOCK_NU`` at a time, multiplied and
  accumulated elementwise, reduced once at the end (env's rows are read once per pair, mostly from L2). With
  :data:`FEATSUM` ``= "atomic"`` instead per atom ``a`` (segments by ``pair_first``) ``sense[seg] @ env[a]``
  with ``tl.dot``, env read once, added to the second atoms' rows with atomic adds (faster where env is large,
  not reproducible bit for bit).

float32 products use ``tl.dot`` with ``input_precision`` :data:`FLOAT32_PRECISION`: by default ``"ieee"``
(float32 multiply-adds) for envsum, whose products are only a block of pairs deep, and ``"tf32x3"`` for the
others (each operand split into two tf32 parts on the tensor cores, the small-by-small product left out: about
2^-22 of each term, float32 accuracy); ``"tf32"`` alone would round the inputs to 10 bits and is not offered.
16-bit inputs multiply on tensor cores into float32, float64 multiplies elementwise (no ``tl.dot``). A pair
whose gathered atom index is out of range contributes nothing (its loads are masked; the range check itself is
:class:`sparse_accumulation.indices.PairIndex`' device-side assertion); a pair whose segment index is out of range is in no segment.
Offsets are 64-bit. No intermediate of more than one block per program.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


#: ``input_precision`` of the float32 products: "auto" ("ieee" for envsum, "tf32x3" for sensesum and the atomic
#: featsum), "tf32x3" or "ieee" for all; environment ``SPARSE_ACCUMULATION_HIPPYNN_PRECISION``
FLOAT32_PRECISION = os.environ.get("SPARSE_ACCUMULATION_HIPPYNN_PRECISION", "auto")
FLOAT32_PRECISIONS = ("auto", "tf32x3", "ieee")
_AUTO_PRECISION = {"envsum": "ieee", "sensesum": "tf32x3", "featsum_atomic": "tf32x3"}
#: how featsum sums: ``"segments"`` (by ``pair_second``, deterministic) or ``"atomic"`` (by ``pair_first`` with
#: ``tl.dot``, env read once, atomic adds: the order of the sums, and the last bits, vary from run to run);
#: environment ``SPARSE_ACCUMULATION_HIPPYNN_FEATSUM``
FEATSUM = os.environ.get("SPARSE_ACCUMULATION_HIPPYNN_FEATSUM", "segments")
FEATSUM_MODES = ("segments", "atomic")
#: block shapes, warps and stages by kernel ("envsum", "sensesum", "featsum", "featsum_atomic"), overriding the
#: defaults of :func:`_blocks` (``{"envsum": {"BLOCK_P": 32, "num_warps": 2}}``): for benchmarks
CONFIG: dict = {}
#: whether the kernels were decorated for the interpreter (fixed when this module is imported)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _pairs(order_ptr, other_ptr, i, end, n_atoms):
    """For positions ``i`` of a segment ending at ``end``: ``(inside, p, atom, ok)``: whether a position is in
    the segment, its pair, the pair's other atom (int64, read from the other index in segment order, so both
    loads are issued together), and whether the pair counts (atom in range)."""
    inside = i < end
    p = tl.load(order_ptr + i, mask=inside, other=0)
    atom = tl.load(other_ptr + i, mask=inside, other=0).to(tl.int64)
    return inside, p, atom, inside & (atom >= 0) & (atom < n_atoms)


@triton.jit
def _product(x, y, MODE: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    """``x @ y`` in the accumulation dtype (see :func:`_mode`)."""
    if MODE == 0:  # float32
        result = tl.dot(x, y, input_precision=PRECISION, out_dtype=ACC)
    elif MODE == 1:  # 16-bit
        result = tl.dot(x, y, out_dtype=ACC)
    elif MODE == 2:  # float64
        result = tl.sum(x[:, :, None] * y[None, :, :], axis=1)
    else:  # 16-bit, multiplied in float32
        result = tl.dot(x.to(tl.float32), y.to(tl.float32), input_precision=PRECISION, out_dtype=ACC)
    return result


@triton.jit
def _envsum_kernel(s_ptr, z_ptr, second_ptr, order_ptr, offsets_ptr, out_ptr, n_atoms, n_nu, n_feat,
                   BLOCK_P: tl.constexpr, BLOCK_NU: tl.constexpr, BLOCK_F: tl.constexpr, MODE: tl.constexpr,
                   PRECISION: tl.constexpr, ACC: tl.constexpr):
    # programs of one atom adjacent (its rows of s read once from memory): atom, then block of nu, of feat
    blocks_f = tl.cdiv(n_feat, BLOCK_F)
    blocks = tl.cdiv(n_nu, BLOCK_NU) * blocks_f
    pid = tl.program_id(0)
    a = (pid // blocks).to(tl.int64)
    nu = (pid % blocks) // blocks_f * BLOCK_NU + tl.arange(0, BLOCK_NU)
    f = pid % blocks_f * BLOCK_F + tl.arange(0, BLOCK_F)
    nu_ok = nu < n_nu
    f_ok = f < n_feat
    start = tl.load(offsets_ptr + a)
    end = tl.load(offsets_ptr + a + 1)
    acc = tl.zeros((BLOCK_NU, BLOCK_F), dtype=ACC)
    for first in range(start, end, BLOCK_P):
        inside, p, b, ok = _pairs(order_ptr, second_ptr, first + tl.arange(0, BLOCK_P), end, n_atoms)
        s = tl.load(s_ptr + p[:, None] * n_nu + nu[None, :], mask=ok[:, None] & nu_ok[None, :], other=0.0)
        z = tl.load(z_ptr + b[:, None] * n_feat + f[None, :], mask=ok[:, None] & f_ok[None, :], other=0.0)
        acc += _product(tl.trans(s), z, MODE, PRECISION, ACC)
    out = out_ptr + a * n_nu * n_feat + nu[:, None] * n_feat + f[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=nu_ok[:, None] & f_ok[None, :])


@triton.jit
def _sensesum_kernel(env_ptr, z_ptr, second_ptr, order_ptr, offsets_ptr, out_ptr, n_atoms, n_nu, n_feat,
                     BLOCK_P: tl.constexpr, BLOCK_NU: tl.constexpr, BLOCK_F: tl.constexpr, MODE: tl.constexpr,
                     PRECISION: tl.constexpr, ACC: tl.constexpr):
    blocks = tl.cdiv(n_nu, BLOCK_NU)  # programs of one atom adjacent: atom, then block of nu
    pid = tl.program_id(0)
    a = (pid // blocks).to(tl.int64)
    nu = pid % blocks * BLOCK_NU + tl.arange(0, BLOCK_NU)
    nu_ok = nu < n_nu
    start = tl.load(offsets_ptr + a)
    end = tl.load(offsets_ptr + a + 1)
    env = env_ptr + a * n_nu * n_feat + nu[None, :] * n_feat
    for first in range(start, end, BLOCK_P):
        inside, p, b, ok = _pairs(order_ptr, second_ptr, first + tl.arange(0, BLOCK_P), end, n_atoms)
        acc = tl.zeros((BLOCK_P, BLOCK_NU), dtype=ACC)
        for f0 in range(0, n_feat, BLOCK_F):
            f = f0 + tl.arange(0, BLOCK_F)
            f_ok = f < n_feat
            z = tl.load(z_ptr + b[:, None] * n_feat + f[None, :], mask=ok[:, None] & f_ok[None, :], other=0.0)
            e = tl.load(env + f[:, None], mask=f_ok[:, None] & nu_ok[None, :], other=0.0)  # [BLOCK_F, BLOCK_NU]
            acc += _product(z, e, MODE, PRECISION, ACC)
        out = out_ptr + p[:, None] * n_nu + nu[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=inside[:, None] & nu_ok[None, :])


@triton.jit
def _featsum_kernel(env_ptr, sense_ptr, first_ptr, order_ptr, offsets_ptr, out_ptr, n_atoms, n_nu, n_feat,
                    BLOCK_P: tl.constexpr, BLOCK_NU: tl.constexpr, BLOCK_F: tl.constexpr, ACC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = f < n_feat
    start = tl.load(offsets_ptr + b)
    end = tl.load(offsets_ptr + b + 1)
    k = tl.arange(0, BLOCK_P * BLOCK_NU)  # one (pair, nu) term per row of the tile
    k_pair = k // BLOCK_NU
    k_nu = k % BLOCK_NU
    acc = tl.zeros((BLOCK_P * BLOCK_NU, BLOCK_F), dtype=ACC)
    for first in range(start, end, BLOCK_P):
        inside, p, a, ok = _pairs(order_ptr, first_ptr, first + k_pair, end, n_atoms)
        for nu0 in range(0, n_nu, BLOCK_NU):
            nu = nu0 + k_nu
            term = ok & (nu < n_nu)
            s = tl.load(sense_ptr + p * n_nu + nu, mask=term, other=0.0).to(ACC)
            e = tl.load(env_ptr + (a * n_nu + nu)[:, None] * n_feat + f[None, :],
                        mask=term[:, None] & f_ok[None, :], other=0.0).to(ACC)
            acc += s[:, None] * e
    tl.store(out_ptr + b * n_feat + f, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=f_ok)


@triton.jit
def _featsum_atomic_kernel(env_ptr, sense_ptr, second_ptr, order_ptr, offsets_ptr, out_ptr, n_atoms, n_nu,
                           n_feat, BLOCK_P: tl.constexpr, BLOCK_NU: tl.constexpr, BLOCK_F: tl.constexpr,
                           MODE: tl.constexpr, PRECISION: tl.constexpr, ACC: tl.constexpr):
    a = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = f < n_feat
    start = tl.load(offsets_ptr + a)
    end = tl.load(offsets_ptr + a + 1)
    env = env_ptr + a * n_nu * n_feat + f[None, :]
    for first in range(start, end, BLOCK_P):
        inside, p, b, ok = _pairs(order_ptr, second_ptr, first + tl.arange(0, BLOCK_P), end, n_atoms)
        acc = tl.zeros((BLOCK_P, BLOCK_F), dtype=ACC)
        for nu0 in range(0, n_nu, BLOCK_NU):
            nu = nu0 + tl.arange(0, BLOCK_NU)
            nu_ok = nu < n_nu
            s = tl.load(sense_ptr + p[:, None] * n_nu + nu[None, :], mask=ok[:, None] & nu_ok[None, :], other=0.0)
            e = tl.load(env + nu[:, None] * n_feat, mask=nu_ok[:, None] & f_ok[None, :], other=0.0)
            acc += _product(s, e, MODE, PRECISION, ACC)
        tl.atomic_add(out_ptr + b[:, None] * n_feat + f[None, :], acc, mask=ok[:, None] & f_ok[None, :])


def _cdiv(n: int, d: int) -> int:
    return -(-n // d)  # triton.cdiv is a constexpr function: microseconds per call from Python


def _pow2(n: int, low: int, high: int) -> int:
    return max(low, min(high, triton.next_power_of_2(max(n, 1))))


def _mode(dtype: torch.dtype) -> int:
    """How the products multiply: 0 float32 ``tl.dot``, 1 16-bit ``tl.dot`` into float32, 2 float64
    elementwise, 3 16-bit inputs converted to float32 first (bfloat16 under the interpreter, whose ``tl.dot``
    multiplies bfloat16 bit patterns as integers)."""
    if dtype == torch.float64:
        return 2
    if dtype == torch.float32:
        return 0
    return 3 if dtype == torch.bfloat16 and _INTERPRETED else 1


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _precision(kernel: str) -> str:
    if FLOAT32_PRECISION not in FLOAT32_PRECISIONS:
        raise ValueError(f"pair_sums.FLOAT32_PRECISION must be one of {FLOAT32_PRECISIONS}, "
                         f"got {FLOAT32_PRECISION!r}")
    return _AUTO_PRECISION[kernel] if FLOAT32_PRECISION == "auto" else FLOAT32_PRECISION


def _blocks(kernel: str, n_nu: int, n_feat: int, dtype: torch.dtype) -> dict:
    """Block shapes, ``num_warps`` and ``num_stages`` of ``kernel`` ("envsum", "sensesum", "featsum",
    "featsum_atomic"), :data:`CONFIG` overriding them. Chosen on an H200 at hippynn's sizes
    (``benchmarks/hippynn_triton_variants.py``): programs of one warp where the tiles allow it."""
    wide = dtype == torch.float64
    if kernel == "featsum":  # [BLOCK_P * BLOCK_NU, BLOCK_F] terms
        if wide:
            found = dict(BLOCK_P=8, BLOCK_NU=min(_pow2(n_nu, 1, 8), 4), BLOCK_F=_pow2(n_feat, 1, 32), num_warps=2)
        else:
            found = dict(BLOCK_P=4, BLOCK_NU=_pow2(n_nu, 1, 8), BLOCK_F=_pow2(n_feat, 1, 32), num_warps=1)
    elif wide:  # elementwise products: a [P, NU, F] tile
        found = dict(BLOCK_P=8, BLOCK_NU=_pow2(n_nu, 1, 16), BLOCK_F=_pow2(n_feat, 1, 32), num_warps=4)
    elif kernel == "envsum":
        if n_nu <= 32:
            found = dict(BLOCK_P=16, BLOCK_NU=_pow2(n_nu, 16, 32), BLOCK_F=_pow2(n_feat, 16, 32), num_warps=1)
        else:
            found = dict(BLOCK_P=16, BLOCK_NU=64, BLOCK_F=_pow2(n_feat, 16, 64), num_warps=4)
    elif kernel == "sensesum":
        block_nu = _pow2(n_nu, 16, 64)
        found = dict(BLOCK_P=32, BLOCK_NU=block_nu, BLOCK_F=16, num_warps=1, num_stages=2 if block_nu <= 32 else 1)
    else:  # featsum_atomic
        found = dict(BLOCK_P=16, BLOCK_NU=_pow2(n_nu, 16, 32), BLOCK_F=_pow2(n_feat, 16, 32), num_warps=1)
    found.setdefault("num_stages", 1)
    found.update(CONFIG.get(kernel, {}))
    return found


_options: dict = {}


def _launch_options(kernel: str, n_nu: int, n_feat: int, dtype: torch.dtype) -> dict:
    """The keyword arguments of a launch of ``kernel``: :func:`_blocks` with ``MODE``, ``ACC`` and (but for
    the segment featsum) ``PRECISION``; remembered while :data:`CONFIG` is empty (a call then pays one dictionary
    lookup)."""
    key = (kernel, n_nu, n_feat, dtype, FLOAT32_PRECISION)
    found = _options.get(key) if not CONFIG else None
    if found is None:
        found = dict(_blocks(kernel, n_nu, n_feat, dtype), ACC=_acc(dtype))
        if kernel != "featsum":
            found.update(MODE=_mode(dtype), PRECISION=_precision(kernel))
        if not CONFIG:
            _options[key] = found
    return found


def _products(kernel, name, a, b, second, order, offsets, out, grid_nu_feat: bool):
    """Launch envsum's or sensesum's kernel: one program per atom and block of nu (and of feat where
    ``grid_nu_feat``), on one grid axis with the programs of an atom adjacent."""
    n_atoms, n_nu, n_feat = b.shape[0], a.shape[1], b.shape[1]  # a: s or env, b: features
    a, b = a.contiguous(), b.contiguous()
    options = _launch_options(name, n_nu, n_feat, a.dtype)
    programs = n_atoms * _cdiv(n_nu, options["BLOCK_NU"])
    if grid_nu_feat:
        programs *= _cdiv(n_feat, options["BLOCK_F"])
    kernel[(programs,)](a, b, second, order, offsets, out, n_atoms, n_nu, n_feat, **options)
    return out


def envsum(sensitivities, features, pairs):
    """``env[pair_first[p], nu, f] += sensitivities[p, nu] * features[pair_second[p], f]``: ``[n_atoms, n_nu,
    n_feat]`` (see :func:`sparse_accumulation.envsum`); tensors whose shapes were checked, ``pairs`` a
    :class:`sparse_accumulation.indices.Pairs`."""
    n_atoms, n_feat = features.shape
    order, offsets, second = pairs.by_first(other_in_order=True)
    out = features.new_empty((n_atoms, sensitivities.shape[1], n_feat))
    if out.numel() == 0:
        return out
    return _products(_envsum_kernel, "envsum", sensitivities, features, second, order, offsets, out, True)


def sensesum(env, features, pairs):
    """``sense[p, nu] = sum_f env[pair_first[p], nu, f] * features[pair_second[p], f]``: ``[n_pairs, n_nu]``
    (see :func:`sparse_accumulation.sensesum`); tensors whose shapes were checked, ``pairs`` a
    :class:`sparse_accumulation.indices.Pairs`."""
    n_atoms, n_nu, n_feat = env.shape
    order, offsets, second = pairs.by_first(other_in_order=True)
    out = env.new_empty((len(pairs), n_nu))
    if out.numel() == 0 or n_feat == 0:
        return out.zero_()
    return _products(_sensesum_kernel, "sensesum", env, features, second, order, offsets, out, False)


def featsum(env, sense, pairs):
    """``feat[pair_second[p], f] += sum_nu env[pair_first[p], nu, f] * sense[p, nu]``: ``[n_atoms, n_feat]``
    (see :func:`sparse_accumulation.featsum`); tensors whose shapes were checked, ``pairs`` a
    :class:`sparse_accumulation.indices.Pairs`."""
    if FEATSUM not in FEATSUM_MODES:
        raise ValueError(f"pair_sums.FEATSUM must be one of {FEATSUM_MODES}, got {FEATSUM!r}")
    if FEATSUM == "atomic":
        return _featsum_atomic(env, sense, pairs)
    n_atoms, n_nu, n_feat = env.shape
    order, offsets, first = pairs.by_second(other_in_order=True)
    out = env.new_empty((n_atoms, n_feat))
    if out.numel() == 0:
        return out
    e, s = env.contiguous(), sense.contiguous()
    options = _launch_options("featsum", n_nu, n_feat, e.dtype)
    grid = (n_atoms, _cdiv(n_feat, options["BLOCK_F"]))
    _featsum_kernel[grid](e, s, first, order, offsets, out, n_atoms, n_nu, n_feat, **options)
    return out


def _featsum_atomic(env, sense, pairs):
    """featsum by ``pair_first``: per atom ``a``, ``sense[seg] @ env[a]`` (``[P, nu] x [nu, feat]``, env read
    once) added to the rows of the pairs' second atoms with atomic adds (in float32, or float64)."""
    n_atoms, n_nu, n_feat = env.shape
    order, offsets, second = pairs.by_first(other_in_order=True)
    acc = torch.zeros((n_atoms, n_feat), dtype=torch.float64 if env.dtype == torch.float64 else torch.float32,
                      device=env.device)
    if acc.numel() and n_nu and sense.shape[0]:
        e, s = env.contiguous(), sense.contiguous()
        options = _launch_options("featsum_atomic", n_nu, n_feat, e.dtype)
        _featsum_atomic_kernel[(n_atoms, _cdiv(n_feat, options["BLOCK_F"]))](
            e, s, second, order, offsets, acc, n_atoms, n_nu, n_feat, **options)
    return acc if acc.dtype == env.dtype else acc.to(env.dtype)
