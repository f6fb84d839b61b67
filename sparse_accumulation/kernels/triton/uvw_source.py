"""Generation of the Triton source of fused "uvw" kernels (plain Python: no triton import here).

One e3nn "uvw" instruction with shared weights,

    out[z, w, k] = sum_uv W[u, v, w] A[z, k, u, v],   A[z, k, u, v] = sum_ij C[i, j, k] p[z, u, i] q[z, v, j],

is a matrix product whose left operand ``A`` (rows ``(z, k)``, columns ``(u, v)``) is made on the fly, tile by
tile, and never written: per block of ``BZ`` rows the components of ``q`` are loaded once; for each tile of
``BU`` channels ``u``, ``x[z, k, u, j] = sum_i C[i, j, k] p[z, u, i]`` (over the nonzeros of the 3j symbol,
whose positions are part of the source and values loaded from ``C``), then the tile
``A = sum_j x[z, k, u, j] q[z, v, j]`` meets the weights' rows ``(u, v)`` in ``tl.dot``. The output components
``k`` are padded to a power of two (``KP``), so a program's rows are ``BZ`` whole rows of ``z``.

Three kernels per instruction, all from :func:`kernel_source`:

* ``forward``: ``out += A W`` (``out`` holds other instructions' parts already);
* ``grad_p``: the gradient of the tiled operand ``p``,
  ``gp[z, u, i] += sum_jk C[i, j, k] sum_v (G W^T)[z, k, u, v] q[z, v, j]``
  with ``G`` the output's gradient; the gradient of ``q`` is the same kernel with the operands' roles swapped
  (the weights read transposed, the coefficients ``C[j, i, k]``);
* ``grad_w``: the weights' gradient ``A^T G``, summed over row blocks ``s, s + S, ..`` by each of ``S`` programs
  per weight tile into its own partial sum (added up afterwards: deterministic).

Every index is masked, so multiplicities need not be powers of two.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from .codegen import Code, next_pow2

#: columns ``(u, v)`` of a tile of ``A`` (the matrix product's inner dimension per step)
TILE_COLUMNS = 128
#: rows ``(z, k)`` of a program (``BZ`` rows of ``z`` times the padded components)
TILE_ROWS = 64


class Shape(NamedTuple):
    """An instruction seen from its tiled operand ``p``: ``U`` channels of ``D1`` components, the other operand
    ``q`` ``V`` of ``D2``, the output ``WO`` of ``DO``; ``nonzeros``: ``(i, j, k, offset)``, where
    ``C[i, j, k]`` may be nonzero and its offset in the coefficient tensor; ``precision``: ``tl.dot``'s
    ``input_precision``."""

    U: int
    D1: int
    V: int
    D2: int
    WO: int
    DO: int
    nonzeros: tuple
    precision: str


def sizes(shape: Shape) -> dict:
    """The padded sizes: ``VP``, ``KP`` (components), ``WP`` (output channels), ``BU``, ``BZ``."""
    vp = next_pow2(shape.V)
    kp = next_pow2(shape.DO)
    # tl.dot's operands are at least 16 x 16
    bu = max(1, min(next_pow2(shape.U), TILE_COLUMNS // vp), 16 // min(vp, 16))
    bz = max(1, TILE_ROWS // kp, 16 // kp)
    return dict(VP=vp, KP=kp, WP=max(16, next_pow2(shape.WO)), BU=bu, BZ=bz)


def _coefficient_vectors(shape: Shape, code: Code, indent: int) -> dict:
    """``c<i>_<j>[KP]``: ``C[i, j, k]`` over ``k``, for the pairs ``(i, j)`` with a nonzero; returns
    ``{j: [i, ..]}``."""
    by_pair = {}
    for i, j, k, offset in shape.nonzeros:
        by_pair.setdefault((i, j), {})[k] = offset
    pairs = {}
    for (i, j), per_k in sorted(by_pair.items()):
        vector = "zk"
        for k, offset in sorted(per_k.items()):
            vector = f"tl.where(kk == {k}, tl.load(C + {offset}).to(ACC), {vector})"
        code(f"c{i}_{j} = {vector}", indent)
        pairs.setdefault(j, []).append(i)
    return pairs


def _loads_q(shape: Shape, code: Code, indent: int) -> None:
    """``q<j>[BZ, VP]``: the components of ``q`` for the block's rows."""
    for j in range(shape.D2):
        code(f"q{j} = tl.load(Q + z[:, None] * SQ + v[None, :] * {shape.D2} + {j}, mask=zv, other=0.0).to(ACC)",
             indent)


def _tile_a(shape: Shape, pairs: dict, code: Code, indent: int) -> None:
    """``a[BZ * KP, BU * VP]``: the tile of ``A`` for channels ``u``, as ``sum_j x_j[z, k, u] q_j[z, v]`` with
    ``x_j = sum_i C[i, j, k] p_i`` (small: ``BU`` channels), so that only ``q`` is held across tiles."""
    for i in range(shape.D1):
        code(f"p{i} = tl.load(P + z[:, None] * SP + u[None, :] * {shape.D1} + {i}, mask=zu, other=0.0).to(ACC)",
             indent)
    for j, rows in sorted(pairs.items()):
        code(f"x{j} = " + " + ".join(f"c{i}_{j}[None, :, None] * p{i}[:, None, :]" for i in rows), indent)
    terms = " + ".join(f"x{j}[:, :, :, None] * q{j}[:, None, None, :]" for j in sorted(pairs))
    code(f"a = tl.reshape({terms}, (BZ * KP, BU * VP))", indent)


def kernel_source(kind: str, name: str, shape: Shape, acc: str) -> str:
    """The source of kernel ``name`` (``kind``: ``"forward"``, ``"grad_p"`` or ``"grad_w"``) of ``shape``,
    accumulating in ``acc`` (``"tl.float32"``, ``"tl.float64"``).

    Parameters: pointers ``P``, ``Q``, ``C`` (coefficients), then the weights ``W`` (forward, grad_p), the
    output's gradient ``G`` (grad_p, grad_w) and the target ``D`` (forward: the output; grad_p: ``gp``;
    grad_w: partial sums ``[S, U * V * WO]``); ints ``ROWS``, the row strides ``SP``, ``SQ``, ``SG`` (of the
    output, or of its gradient), ``SD`` (grad_p: of ``gp``), the weights' strides ``WU``, ``WV`` (of ``u`` and
    ``v``; ``w`` contiguous) and ``S`` (grad_w: programs per weight tile). ``P``, ``Q``, ``G`` and ``D`` point
    at the operand's first column; rows of ``p`` and ``q`` may have stride 0 (one row shared)."""
    s = sizes(shape)
    code = Code()
    code("kk = tl.arange(0, KP)")
    code("zk = kk.to(ACC) * 0")
    code("v = tl.arange(0, VP)")
    code("w = tl.arange(0, WP)")
    code("rr = tl.arange(0, BU * VP)")
    pairs = _coefficient_vectors(shape, code, 1)
    if kind == "grad_w":
        code("ur = tl.program_id(0) * BU + rr // VP")  # the channel u of each row (u, v) of the tile
        code("tile = tl.zeros([BU * VP, WP], dtype=ACC)")
        code("for zb in range(tl.program_id(1), tl.cdiv(ROWS, BZ), S):")
        body = 2
    else:
        code("zb = tl.program_id(0)")
        body = 1
    code("z = zb * BZ + tl.arange(0, BZ)", body)
    code("zm = z < ROWS", body)
    code("zv = zm[:, None] & (v < V)[None, :]", body)
    # (z, k, w) of the output or its gradient
    code("mk = (zm[:, None, None] & (kk < DO)[None, :, None]) & (w < WO)[None, None, :]", body)
    code("gout = z[:, None, None] * SG + w[None, None, :] * DO + kk[None, :, None]", body)
    _loads_q(shape, code, body)
    if kind in ("grad_p", "grad_w"):
        code("g = tl.reshape(tl.load(G + gout, mask=mk, other=0.0).to(ACC), (BZ * KP, WP))", body)
    if kind == "grad_w":
        code("u = tl.program_id(0) * BU + tl.arange(0, BU)", body)
        code("zu = zm[:, None] & (u < U)[None, :]", body)
        _tile_a(shape, pairs, code, body)
        code(f"tile += tl.dot(tl.trans(a), g, input_precision=\"{shape.precision}\")", body)
        code("at = D + tl.program_id(1) * (U * V * WO) + (ur * V + rr % VP) * WO")
        code("tl.store(at[:, None] + w[None, :], tile.to(D.dtype.element_ty), "
             "mask=((ur < U) & (rr % VP < V))[:, None] & (w < WO)[None, :])")
    else:
        if kind == "forward":
            code("out = tl.zeros([BZ * KP, WP], dtype=ACC)", body)
        code("for u0 in range(0, U, BU):", body)
        inner = body + 1
        code("u = u0 + tl.arange(0, BU)", inner)
        code("zu = zm[:, None] & (u < U)[None, :]", inner)
        code("wt = tl.load(W + (u0 + rr // VP)[:, None] * WU + (rr % VP)[:, None] * WV + w[None, :], "
             "mask=((u0 + rr // VP < U) & (rr % VP < V))[:, None] & (w < WO)[None, :], other=0.0).to(ACC)", inner)
        if kind == "forward":
            _tile_a(shape, pairs, code, inner)
            code(f"out += tl.dot(a, wt, input_precision=\"{shape.precision}\")", inner)
            code("at = D + gout", body)
            code("total = tl.reshape(out, (BZ, KP, WP)) + tl.load(at, mask=mk, other=0.0).to(ACC)", body)
            code("tl.store(at, total.to(D.dtype.element_ty), mask=mk)", body)
        else:
            code(f"ga = tl.reshape(tl.dot(g, tl.trans(wt), input_precision=\"{shape.precision}\"), "
                 "(BZ, KP, BU, VP))", inner)
            for j in sorted(pairs):
                code(f"h{j} = tl.sum(ga * q{j}[:, None, None, :], axis=3)", inner)  # [BZ, KP, BU]
            for i in range(shape.D1):
                terms = [f"c{i}_{j}[None, :, None] * h{j}" for j in sorted(pairs) if i in pairs[j]]
                code("gp = " + (f"tl.sum({' + '.join(terms)}, axis=1)" if terms else "tl.zeros([BZ, BU], dtype=ACC)"),
                     inner)
                code(f"at = D + z[:, None] * SD + u[None, :] * {shape.D1} + {i}", inner)
                code("tl.store(at, (tl.load(at, mask=zu, other=0.0).to(ACC) + gp).to(D.dtype.element_ty), "
                     "mask=zu)", inner)
    pointers, ints = parameters(kind)
    constants = dict(U=shape.U, V=shape.V, WO=shape.WO, DO=shape.DO, ACC=acc, **s)
    text = code.text()
    for key, value in constants.items():
        text = re.sub(rf"\b{key}\b", str(value), text)
    header = ["import triton", "import triton.language as tl", "", "",
              f"# fused uvw {kind}: {shape.U}x{shape.D1} x {shape.V}x{shape.D2} -> {shape.WO}x{shape.DO}, "
              f"{len(shape.nonzeros)} coefficients",
              f"def {name}({', '.join(pointers + ints)}):"]
    return "\n".join(header) + "\n" + text


def parameters(kind: str) -> tuple:
    """``(pointer names, int names)`` of a kernel of ``kind`` (see :func:`kernel_source`)."""
    pointers = {"forward": ["P", "Q", "C", "W", "D"], "grad_p": ["P", "Q", "C", "W", "G", "D"],
                "grad_w": ["P", "Q", "C", "G", "D"]}[kind]
    ints = {"forward": ["ROWS", "SP", "SQ", "SG", "WU", "WV"], "grad_p": ["ROWS", "SP", "SQ", "SG", "SD", "WU", "WV"],
            "grad_w": ["ROWS", "SP", "SQ", "SG", "S"]}[kind]
    return pointers, ints
