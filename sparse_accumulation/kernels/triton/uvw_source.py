"""Triton source of the fused "uvw" kernels (plain Python: no triton import here).

One e3nn "uvw" instruction with shared weights, seen from its two operands ``p`` (``L`` channels of ``I``
components) and ``q`` (``D`` channels of ``J`` components, the operand with fewer components),

    out[z, w, k] = sum_l sum_ij C[i, j, k] p[z, l, i] Y[z, l, j, w],   Y[z, l, j, w] = sum_d q[z, d, j] W[l, d, w],

runs as small matrix products ``Y = q_j W_l`` (``[BZ, D] x [D, BW]``, on the tensor cores) whose results are
coupled with ``p`` and the 3j symbol in registers and summed into the output's tile: no ``[rows, u, v]``
intermediate reaches memory, and the matrix products read their operands as they lie (the weights' rows of
channel ``l``, ``q``'s component ``j`` of a block of rows), so that nothing is rearranged on chip.

Four kernels per instruction, all from :func:`kernel_source`:

* ``forward``: ``out += the product`` (``out`` may hold other instructions' parts already);
* ``grad_p``: ``gp[z, l, i] += sum_jk C[i, j, k] sum_w G[z, w, k] Y[z, l, j, w]`` (``G``: the output's gradient);
* ``grad_q``: ``gq[z, d, j] += sum_l sum_w E[z, l, j, w] W[l, d, w]``,
  ``E[z, l, j, w] = sum_ik C[i, j, k] p[z, l, i] G[z, w, k]``;
* ``grad_w``: ``gW[l, d, w] = sum_z sum_k F[z, l, k, d] G[z, w, k]``,
  ``F[z, l, k, d] = sum_ij C[i, j, k] p[z, l, i] q[z, d, j]``, one program per channel ``l``, tile of ``w`` and
  split ``s`` of the row blocks (``s, s + S, ..``), each writing its partial sum (added up afterwards:
  deterministic). ``F``, made in registers, is the left operand of the matrix products (the tensor cores read
  that one from registers), ``G`` the right one as it lies.

The weights are addressed as ``W[l, d, w]`` at ``l * WL + d * WD + w``, so that either input of the instruction
can be ``p``. Every index is masked: multiplicities need not be powers of two.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from .codegen import Code, next_pow2

#: rows ``z`` of a program (of a step, for ``grad_w``) per kernel kind, chosen by a sweep on an H200, for irreps up to
#: l = 2 (``J + K`` at most 10 tiles of ``[BZ, BW]`` in registers)
ROWS = {"forward": 32, "grad_p": 64, "grad_q": 32, "grad_w": 16}
#: output channels of a tile
BLOCK_W = 64


class Shape(NamedTuple):
    """An instruction as the kernels see it: ``p`` of ``L`` channels and ``I`` components, ``q`` of ``D`` and
    ``J``, the output of ``WO`` and ``K``; ``nonzeros``: ``(i, j, k, offset)`` where ``C[i, j, k]`` may be
    nonzero and its offset in the coefficient tensor; ``precision``: ``tl.dot``'s ``input_precision``."""

    L: int
    I: int  # noqa: E741 - the component index's name in the formulas
    D: int
    J: int
    WO: int
    K: int
    nonzeros: tuple
    precision: str


def sizes(shape: Shape, kind: str) -> dict:
    """The padded sizes and tiles of a kernel of ``kind``: ``DP`` (``q``'s channels), ``BW`` (output channels of
    a tile), ``NW`` (tiles of output channels), ``BZ`` (rows of a program or of a step)."""
    bw = min(BLOCK_W, max(16, next_pow2(shape.WO)))
    return dict(DP=max(16, next_pow2(shape.D)), BW=bw, NW=-(-shape.WO // bw), BZ=ROWS[kind])


def _pairs(shape: Shape) -> dict:
    """``{(j, k): [i, ..]}``: the 3j symbol's nonzeros by the pair ``(j, k)``."""
    pairs = {}
    for i, j, k, _ in shape.nonzeros:
        pairs.setdefault((j, k), []).append(i)
    return pairs


def _coefficients(shape: Shape, code: Code) -> None:
    for i, j, k, offset in shape.nonzeros:
        code(f"c{i}_{j}_{k} = tl.load(CO + {offset})")


def _coupled(shape: Shape, j: int, k: int) -> str:
    """``sum_i C[i, j, k] p_i`` over the nonzeros: a ``[BZ]`` vector."""
    return " + ".join(f"c{i}_{j}_{k} * p{i}" for i in _pairs(shape)[(j, k)])


def _rows(code: Code, block: str, indent: int) -> None:
    code(f"z = {block} * BZ + tl.arange(0, BZ)", indent)
    code("zm = z < ROWS", indent)
    code("zo = z.to(tl.int64)", indent)


def _load_q(shape: Shape, code: Code, indent: int, transposed: bool = False) -> None:
    for j in range(shape.J):
        if transposed:  # [DP, BZ]
            code(f"q{j} = tl.load(Q + zo[None, :] * SQ + d[:, None] * J + {j}, mask=dm[:, None] & zm[None, :], "
                 "other=0.0)", indent)
        else:  # [BZ, DP]
            code(f"q{j} = tl.load(Q + zo[:, None] * SQ + d[None, :] * J + {j}, mask=zm[:, None] & dm[None, :], "
                 "other=0.0)", indent)


def _load_p(shape: Shape, code: Code, indent: int) -> None:
    for i in range(shape.I):
        code(f"p{i} = tl.load(P + zo * SP + l * I + {i}, mask=zm, other=0.0)", indent)


def _load_g(shape: Shape, code: Code, indent: int) -> None:
    """``g<k>[BZ, BW]``: the output gradient's component ``k`` for the tile of channels ``w``."""
    for k in sorted({k for _, k in _pairs(shape)}):
        code(f"g{k} = tl.load(G + zo[:, None] * SG + w[None, :] * K + {k}, mask=zm[:, None] & wm[None, :], "
             "other=0.0)", indent)


def _add_to(code: Code, address: str, mask: str, value: str, indent: int) -> None:
    """``target[address] += value`` where ``mask``."""
    code(f"at = T + {address}", indent)
    code(f"tl.store(at, tl.load(at, mask={mask}, other=0.0) + {value}, mask={mask})", indent)


def _over_w_tiles(shape: Shape, code: Code) -> None:
    """A loop over the tiles of output channels ``w`` (two levels deep), the output gradient's tiles loaded."""
    code("for wb in range(NW):")
    code("w = wb * BW + tl.arange(0, BW)", 2)
    code("wm = w < WO", 2)
    _load_g(shape, code, 2)


def _e_tile(shape: Shape, j: int) -> str:
    """``E[z, l, j, w]`` of the tile: ``sum_k (sum_i C[i, j, k] p_i) g_k``."""
    ks = sorted(k for jj, k in _pairs(shape) if jj == j)
    return " + ".join(f"({_coupled(shape, j, k)})[:, None] * g{k}" for k in ks)


def _dot(shape: Shape, a: str, b: str) -> str:
    return f'tl.dot({a}, {b}, input_precision="{shape.precision}")'


def kernel_source(kind: str, name: str, shape: Shape) -> str:
    """The source of kernel ``name`` (``kind``: ``"forward"``, ``"grad_p"``, ``"grad_q"`` or ``"grad_w"``) of
    ``shape``; float32 operands, float32 accumulation.

    Parameters (:func:`parameters`): pointers ``P``, ``Q`` (the operands at their first column), ``W`` (the
    weights at the instruction's first), ``CO`` (the coefficients at the instruction's block ``C[i1, i2, k]``),
    ``G`` (the output's gradient at the instruction's first column; not in the forward) and the target ``T``
    (the output, ``gp``, ``gq``, or the partial sums ``[S, L, D, WO]`` of the weights' gradient); ints ``ROWS``,
    the row strides ``SP``, ``SQ`` (0: one row shared by all), ``SG`` (of the output or its gradient), ``ST`` (of
    the target), ``WL``, ``WD`` (the weights' strides of ``l`` and ``d``) and ``S`` (grad_w: programs per
    channel)."""
    s = sizes(shape, kind)
    pairs = _pairs(shape)
    code = Code()
    code("d = tl.arange(0, DP)")
    code("dm = d < D")
    _coefficients(shape, code)
    if kind == "forward":
        _rows(code, "tl.program_id(0)", 1)
        code("w = tl.program_id(1) * BW + tl.arange(0, BW)")
        code("wm = w < WO")
        _load_q(shape, code, 1)
        ks = sorted({k for _, k in pairs})
        for k in ks:
            code(f"a{k} = tl.full([BZ, BW], 0, dtype=tl.float32)")
        code("for l in range(L):")
        code("wt = tl.load(W + l * WL + d[:, None] * WD + w[None, :], mask=dm[:, None] & wm[None, :], other=0.0)", 2)
        _load_p(shape, code, 2)
        for j in range(shape.J):
            if not any(jj == j for jj, _ in pairs):
                continue
            code(f"y = {_dot(shape, f'q{j}', 'wt')}", 2)
            for k in sorted(k for jj, k in pairs if jj == j):
                code(f"a{k} += ({_coupled(shape, j, k)})[:, None] * y", 2)
        code("mk = zm[:, None] & wm[None, :]")
        for k in ks:
            _add_to(code, f"zo[:, None] * ST + w[None, :] * K + {k}", "mk", f"a{k}", 1)
    elif kind == "grad_p":
        _rows(code, "tl.program_id(0)", 1)
        _load_q(shape, code, 1)
        _over_w_tiles(shape, code)
        code("for l in range(L):", 2)
        code("wt = tl.load(W + l * WL + d[:, None] * WD + w[None, :], mask=dm[:, None] & wm[None, :], other=0.0)",
             3)
        for j in range(shape.J):
            ks = sorted(k for jj, k in pairs if jj == j)
            if not ks:
                continue
            code(f"y = {_dot(shape, f'q{j}', 'wt')}", 3)
            for k in ks:
                code(f"s{j}_{k} = tl.reduce(g{k} * y, 1, _add)", 3)
        for i in range(shape.I):
            terms = [f"c{i}_{j}_{k} * s{j}_{k}" for (j, k), rows in sorted(pairs.items()) if i in rows]
            if not terms:
                continue
            _add_to(code, f"zo * ST + l * I + {i}", "zm", " + ".join(terms), 3)
    elif kind == "grad_q":
        _rows(code, "tl.program_id(0)", 1)
        js = sorted({j for j, _ in pairs})
        for j in js:
            code(f"acc{j} = tl.full([BZ, DP], 0, dtype=tl.float32)")
        _over_w_tiles(shape, code)
        code("for l in range(L):", 2)
        code("wt = tl.load(W + l * WL + w[:, None] + d[None, :] * WD, mask=wm[:, None] & dm[None, :], other=0.0)",
             3)
        _load_p(shape, code, 3)
        for j in js:
            code(f"acc{j} += {_dot(shape, _e_tile(shape, j), 'wt')}", 3)
        code("mq = zm[:, None] & dm[None, :]")
        for j in js:
            _add_to(code, f"zo[:, None] * ST + d[None, :] * J + {j}", "mq", f"acc{j}", 1)
    elif kind == "grad_w":
        code("l = tl.program_id(0)")
        code("acc = tl.full([DP, BW], 0, dtype=tl.float32)")
        code("w = tl.program_id(2) * BW + tl.arange(0, BW)")
        code("wm = w < WO")
        code("for zb in range(tl.program_id(1), (ROWS + BZ - 1) // BZ, S):")
        _rows(code, "zb", 2)
        _load_p(shape, code, 2)
        _load_q(shape, code, 2, transposed=True)
        for k in sorted({k for _, k in pairs}):
            code(f"g = tl.load(G + zo[:, None] * SG + w[None, :] * K + {k}, mask=zm[:, None] & wm[None, :], "
                 "other=0.0)", 2)
            # F[d, z] = sum_j (sum_i C[i, j, k] p_i[z]) q_j[z, d]: the left operand, made in registers
            f = " + ".join(f"({_coupled(shape, j, k)})[None, :] * q{j}" for j in sorted(j for j, kk in pairs
                                                                                         if kk == k))
            code(f"acc += {_dot(shape, f, 'g')}", 2)
        code("at = T + ((tl.program_id(1) * L + l) * D + d[:, None]) * WO + w[None, :]")
        code("tl.store(at, acc, mask=dm[:, None] & wm[None, :])")
    else:
        raise ValueError(f"kind must be forward, grad_p, grad_q or grad_w, not {kind!r}")
    constants = dict(L=shape.L, I=shape.I, D=shape.D, J=shape.J, WO=shape.WO, K=shape.K, **s)
    pointers, ints = parameters(kind)
    # triton builtins and a local combine function only: triton's own @jit helpers (tl.sum, tl.zeros, tl.cdiv)
    # are made when triton is imported, and do not run interpreted unless TRITON_INTERPRET was set before that
    header = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def _add(a, b):",
              "    return a + b", "", "",
              f"# fused uvw {kind}: p {shape.L}x{shape.I}, q {shape.D}x{shape.J} -> {shape.WO}x{shape.K}, "
              f"{len(shape.nonzeros)} coefficients, {shape.precision}",
              f"def {name}({', '.join(pointers + ints)}):"]
    text = code.text()
    for key, value in constants.items():
        text = re.sub(rf"\b{key}\b", str(value), text)
    return "\n".join(header) + "\n" + text


def parameters(kind: str) -> tuple:
    """``(pointer names, int names)`` of a kernel of ``kind`` (see :func:`kernel_source`)."""
    pointers = ["P", "Q", "W", "CO", "T"] if kind == "forward" else ["P", "Q", "W", "CO", "G", "T"]
    ints = ["ROWS", "SP", "SQ", "SG", "ST", "WL", "WD"] + (["S"] if kind == "grad_w" else [])
    return pointers, ints
