"""Fused multi-path Clebsch-Gordan products and CG iterations: a whole product is ONE sparse accumulation.

Layout convention (one for every tensor of this module)
-------------------------------------------------------
Features with several angular blocks are held as ONE tensor ``[..., channels, dim]``:

* ``channels`` is shared by every block, and the product is element-wise over it ("uuu"): channel ``c`` of
  X1 only meets channel ``c`` of X2. Every leading dimension (batch, atoms, channels, ...) is just a row of
  the accumulation, and the leading dimensions of X1 and X2 broadcast as in torch: ``[E, 1, dim2]``
  spherical harmonics of an edge meet every channel of ``[E, channels, dim1]`` features without being
  copied.
* the last dimension concatenates blocks of ``2l + 1`` components (index ``m + l``), described by *irreps*:
  a sequence of ``(n, l)`` pairs, ``n`` consecutive blocks of degree ``l``, so
  ``dim = sum n (2l + 1)``. ``n`` counts blocks *within* a channel (it is not e3nn's channel multiplicity).
  An ``int`` ``lmax`` stands for ``((1, 0), (1, 1), ..., (1, lmax))``.

Dicts ``{l: [..., channels, 2l+1]}`` or ``{l: [..., channels, n_l, 2l+1]}`` and lists indexed by ``l``
(``None`` for absent degrees) are accepted as inputs too (:func:`concatenate`).

Output of a product, grouped by ``L``: for each kept ``L`` in increasing order, one ``2L + 1`` block per
path ``(block i1 of X1) x (block i2 of X2) -> L``, paths ordered by ``(i1, i2)``. Its irreps are therefore
``((n_0, 0), (n_1, 1), ...)`` with ``n_L`` the number of paths to ``L`` (degrees without a path are left
out), and :func:`split` / :meth:`ClebschGordanProduct.split` return the views
``{L: [..., channels, n_L, 2L+1]}`` without copying. :attr:`ClebschGordanProduct.paths` lists the paths in
output order.

e3nn's ``mul x l`` layout ``[..., sum_b mul (2 l_b + 1)]`` (one ``mul x l_b`` irrep per block, channel-major
inside a block) converts to and from this layout with :func:`to_e3nn_layout` / :func:`from_e3nn_layout`.

All paths of a product are concatenated, with block offsets, into a single rule over the concatenated
components, held as buffers, so a product costs one kernel launch forward and one per gradient. Learnable
per-path weights (``weights=True``) are folded into the coefficients (``C[k] * weight[path[k]]``), so they
stay in that one call and receive their gradient through ``dC``. Per-row weights (``weights="per_row"``, a
``W[..., channels, n_paths]`` operand given at call time, as the radial network of a message-passing layer
makes them per edge and channel) are the third operand of a weighted rule (``w[k] = path[k]``): the kernels
read ``W`` once per row, in the same single call.

Complex inputs (complex64 / complex128) run the same real kernels on ``torch.view_as_real`` data: the rule
is rewritten over components ``2 m + {0: real, 1: imaginary}``, four real nonzeros per complex one,
``(a + ib)(c + id) = (ac - bd) + i(ad + bc)``.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, List, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

import cg

from .exact import ExactBuffers
from .ops.accumulate.api import accumulate_rule
from .ops.scripted import check_like, check_width
from .descriptors.rules import Rule

__all__ = [
    "Path",
    "ClebschGordanProduct",
    "ClebschGordanIteration",
    "normalize_irreps",
    "irreps_dim",
    "concatenate",
    "split",
    "to_e3nn_layout",
    "from_e3nn_layout",
]

IrrepsLike = Union[int, Sequence[Sequence[int]]]
PARITIES = ("all", "even")
NORMALIZATIONS = ("none", "component", "norm")
WEIGHTS = (False, True, "per_row")


# --------------------------------------------------------------------------------------------------------
# irreps descriptions and layout helpers


def _check_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)) or int(value) < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def normalize_irreps(irreps: IrrepsLike) -> tuple:
    """``irreps`` as a tuple of ``(n, l)`` int pairs; an ``int`` ``lmax`` means one block of each ``l <= lmax``.

    Entries with ``n == 0`` are dropped.

    Raises:
        ValueError: not an int nor a sequence of non-negative ``(n, l)`` pairs.
    """
    if isinstance(irreps, (numbers.Integral, np.integer)) and not isinstance(irreps, bool):
        return tuple((1, l) for l in range(_check_int(irreps, "lmax") + 1))
    try:
        pairs = [tuple(entry) for entry in irreps]
    except TypeError:
        raise ValueError(f"irreps must be an int lmax or a sequence of (n, l) pairs, got {irreps!r}") from None
    result = []
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"irreps entries must be (n, l) pairs, got {pair!r}")
        n, l = _check_int(pair[0], "n"), _check_int(pair[1], "l")
        if n:
            result.append((n, l))
    return tuple(result)


def irreps_dim(irreps: IrrepsLike) -> int:
    """Size of the last dimension of the concatenated layout: ``sum n (2l + 1)``."""
    return sum(n * (2 * l + 1) for n, l in normalize_irreps(irreps))


def _blocks(irreps) -> list:
    """``[(l, offset)]`` of every block, expanded (``n`` entries per ``(n, l)``)."""
    blocks, offset = [], 0
    for n, l in irreps:
        for _ in range(n):
            blocks.append((l, offset))
            offset += 2 * l + 1
    return blocks


def concatenate(features, irreps: IrrepsLike | None = None) -> tuple:
    """Concatenate per-degree features into the ``[..., channels, dim]`` layout.

    Args:
        features: a tensor already in the layout (returned as it is), a dict ``{l: tensor}`` or a list
            indexed by ``l`` (``None`` entries are skipped). A degree with one block is
            ``[..., channels, 2l+1]`` (``[..., channels, 1, 2l+1]``, the form :func:`split` returns, is
            accepted when another degree has several blocks); a degree with ``n_l > 1`` blocks is
            ``[..., channels, n_l, 2l+1]``.
        irreps: the expected description, ``((n_l, l), ...)`` in increasing ``l``; required for a tensor
            input. Without it, dict / list inputs hold one block per degree.

    Returns:
        ``(tensor, irreps)``.

    Raises:
        ValueError: inconsistent shapes or a description that does not match.
    """
    if isinstance(features, torch.Tensor):
        if irreps is None:
            raise ValueError("irreps are required to interpret a concatenated tensor")
        irreps = normalize_irreps(irreps)
        return features, irreps
    if isinstance(features, dict):
        items = [(l, features[l]) for l in sorted(features)]
    elif isinstance(features, (list, tuple)):
        items = [(l, t) for l, t in enumerate(features) if t is not None]
    else:
        raise TypeError(f"features must be a tensor, a dict {{l: tensor}} or a list indexed by l, "
                        f"got {type(features).__name__}")
    if not items:
        raise ValueError("no features given")
    found = [_check_int(l, "l") for l, _ in items]
    parts = [t for _, t in items]
    for l, t in zip(found, parts):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"features for l={l} must be a tensor, got {type(t).__name__}")
        if t.dim() < 2 or t.shape[-1] != 2 * l + 1:
            raise ValueError(f"features for l={l} must end with a dimension of size {2 * l + 1}, "
                             f"got shape {tuple(t.shape)}")
    if irreps is None:
        counts = [1] * len(found)
    else:
        irreps = normalize_irreps(irreps)
        if [l for _, l in irreps] != found:
            raise ValueError(f"features have degrees {found} but irreps {irreps} were expected "
                             f"(dict / list inputs need one entry per degree, in increasing l)")
        counts = [n for n, _ in irreps]
    # Degrees with several blocks are [..., C, n, 2l+1] and fix the leading shape [..., C]; a single block
    # is [..., C, 2l+1], or [..., C, 1, 2l+1] (as split returns it) when the leading shape tells them apart.
    lead = next((t.shape[:-2] for t, n in zip(parts, counts) if n > 1 and t.dim() >= 3), None)
    flat = []
    for l, t, n in zip(found, parts, counts):
        if n == 1 and lead is not None and t.dim() >= 3 and t.shape[-2] == 1 and t.shape[:-2] == lead:
            t = t.squeeze(-2)
        if n == 1:
            t = t.unsqueeze(-2)
        elif t.dim() < 3 or t.shape[-2] != n:
            raise ValueError(f"features for l={l} must be [..., channels, {n}, {2 * l + 1}] ({n} blocks), "
                             f"got shape {tuple(t.shape)}")
        if lead is None:
            lead = t.shape[:-2]
        elif t.shape[:-2] != lead:
            raise ValueError(f"features for l={l} have leading shape {tuple(t.shape[:-2])}, expected "
                             f"{tuple(lead)} (the same [..., channels] for every degree)")
        flat.append(t.reshape(*lead, n * (2 * l + 1)))
    return torch.cat(flat, dim=-1), tuple(zip(counts, found))


def split(x: torch.Tensor, irreps: IrrepsLike) -> dict:
    """Views ``{l: [..., channels, n_l, 2l+1]}`` of a ``[..., channels, dim]`` tensor (no copy).

    Each degree must occur in a single ``(n, l)`` entry (true of every product output).

    Raises:
        ValueError: the last dimension does not match, or a degree occurs twice.
    """
    irreps = normalize_irreps(irreps)
    if x.shape[-1] != irreps_dim(irreps):
        raise ValueError(f"last dimension {x.shape[-1]} does not match irreps {irreps} "
                         f"(dim {irreps_dim(irreps)})")
    result, offset = {}, 0
    for n, l in irreps:
        if l in result:
            raise ValueError(f"degree {l} occurs in several irreps entries; split needs one entry per degree")
        size = n * (2 * l + 1)
        result[l] = x.narrow(-1, offset, size).unflatten(-1, (n, 2 * l + 1))
        offset += size
    return result


def to_e3nn_layout(x: torch.Tensor, irreps: IrrepsLike) -> torch.Tensor:
    """``[..., channels, dim]`` -> e3nn's ``[..., sum_b channels (2 l_b + 1)]``.

    Block ``b`` becomes the e3nn irrep ``channels x l_b`` (channel-major inside the block), blocks in order.
    """
    irreps = normalize_irreps(irreps)
    if x.shape[-1] != irreps_dim(irreps):
        raise ValueError(f"last dimension {x.shape[-1]} does not match irreps {irreps}")
    return torch.cat([x.narrow(-1, offset, 2 * l + 1).flatten(-2) for l, offset in _blocks(irreps)], dim=-1)


def from_e3nn_layout(y: torch.Tensor, irreps: IrrepsLike, channels: int) -> torch.Tensor:
    """Inverse of :func:`to_e3nn_layout`: ``[..., sum_b channels (2 l_b + 1)]`` -> ``[..., channels, dim]``."""
    irreps = normalize_irreps(irreps)
    sizes = [channels * (2 * l + 1) for l, _ in _blocks(irreps)]
    if y.shape[-1] != sum(sizes):
        raise ValueError(f"last dimension {y.shape[-1]} does not match {channels} channels of irreps {irreps}")
    parts = y.split(sizes, dim=-1)
    return torch.cat([p.unflatten(-1, (channels, -1)) for p in parts], dim=-1)


# --------------------------------------------------------------------------------------------------------
# the fused product


class Path(NamedTuple):
    """One coupling ``(block1 of X1, degree l1) x (block2 of X2, degree l2) -> L`` of a product.

    ``offset1``, ``offset2`` and ``offset_out`` are the first components of the blocks in X1, X2 and the
    output; ``index`` is the path's position (output order, and index into the learnable weights).
    """

    index: int
    block1: int
    l1: int
    block2: int
    l2: int
    L: int
    offset1: int
    offset2: int
    offset_out: int


def _normalization_factor(normalization, l1, l2, L, C: np.ndarray) -> float:
    if callable(normalization):
        return float(normalization(l1, l2, L))
    squares = float(np.sum(C * C))
    if normalization == "none":
        return 1.0
    if normalization == "component":
        return math.sqrt((2 * L + 1) / squares)
    return math.sqrt((2 * l1 + 1) * (2 * l2 + 1) / squares)  # "norm"


def _complex_rule(m1, m2, mu, C, path):
    """The rule on ``view_as_real`` data: ``(a + ib)(c + id) = (ac - bd) + i(ad + bc)``."""
    re1, im1, re2, im2, re, im = 2 * m1, 2 * m1 + 1, 2 * m2, 2 * m2 + 1, 2 * mu, 2 * mu + 1
    return (np.concatenate([re1, im1, re1, im1]), np.concatenate([re2, im2, im2, re2]),
            np.concatenate([re, re, im, im]), np.concatenate([C, -C, C, C]), np.concatenate([path] * 4))


class ClebschGordanProduct(ExactBuffers, torch.nn.Module):
    """All CG paths ``(l1, l2) -> L`` between two sets of features in one sparse accumulation.

    ``forward(X1, X2) -> [..., channels, dim_out]``: see the module documentation for the layouts (inputs
    ``[..., channels, dim1]`` / ``[..., channels, dim2]`` or dicts / lists by degree; output grouped by
    ``L``, then by path). Channels are paired element-wise ("uuu"); the leading dimensions broadcast.

    Args:
        irreps1, irreps2: descriptions of X1 and X2 (``int`` lmax or ``(n, l)`` pairs).
        lmax_out: largest output degree kept (default ``lmax1 + lmax2``).
        l_out: explicit collection of output degrees to keep (instead of ``lmax_out``).
        parity: ``"all"`` (every ``|l1 - l2| <= L <= l1 + l2``) or ``"even"`` (only ``l1 + l2 + L`` even: the
            paths that keep parity ``(-1)^l`` features of that parity).
        basis: ``"real"``, ``"complex"`` or ``"e3nn"`` (see :mod:`cg`).
        normalization: per-path factor folded into the coefficients: ``"none"``; ``"component"``
            (unit-variance input components give unit-variance output components:
            ``sqrt((2L+1) / sum_k C_k^2)``, which is 1 for CG coefficients); ``"norm"`` (inputs of
            expected unit norm per block give outputs of expected unit norm:
            ``sqrt((2l1+1)(2l2+1) / sum_k C_k^2)``); or a callable ``(l1, l2, L) -> float``. With
            ``basis="e3nn"``, ``"component"`` and ``"norm"`` equal e3nn's ``irrep_normalization`` of the same
            name, and ``lambda l1, l2, L: (2 * L + 1) ** -0.5`` equals e3nn's ``"none"``.
        weights: ``False`` (none); ``True``: learn one weight per path (initialized to 1), multiplied into the
            coefficients; ``"per_row"``: :meth:`forward` takes a third operand ``W[..., channels, n_paths]``
            whose ``W[..., p]`` multiplies path ``p`` (weights computed per edge and channel).
        dtype: dtype of the coefficients and weights (default: torch's default dtype). Inputs of another
            floating dtype use coefficients cast to theirs.
        implementation: passed to :func:`sparse_accumulation.accumulate`.

    Attributes:
        irreps1, irreps2, irreps_out: normalized descriptions; ``dim1``, ``dim2``, ``dim_out`` their sizes.
        paths: tuple of :class:`Path` in output order.
        weight: the ``[n_paths]`` parameter (``weights=True``), or ``None``.
        per_row: whether :meth:`forward` takes per-row weights ``W``.

    Complex inputs (both complex64 or both complex128) are supported in every basis (the coefficients are
    real); the ``"complex"`` basis is the one for complex spherical features. Per-row weights stay real with
    complex inputs (``W`` of the matching real dtype: float32 for complex64, float64 for complex128).

    The indices are held as :class:`~sparse_accumulation.Rule` objects (``rule``, ``rule_complex``) that
    no call reads; the coefficient buffers are constant and not in the state dict (under
    ``DistributedDataParallel``, ``broadcast_buffers=False`` saves re-sending them). The only parameters are
    the per-path weights.
    """

    def __init__(self, irreps1: IrrepsLike, irreps2: IrrepsLike, lmax_out: int | None = None, *,
                 l_out: Sequence[int] | None = None, parity: str = "all", basis: str = "real",
                 normalization: Union[str, Callable] = "none", weights: Union[bool, str] = False, dtype=None,
                 implementation=None):
        super().__init__()
        self.irreps1, self.irreps2 = normalize_irreps(irreps1), normalize_irreps(irreps2)
        if not self.irreps1 or not self.irreps2:
            raise ValueError("irreps1 and irreps2 must hold at least one block")
        if parity not in PARITIES:
            raise ValueError(f"parity must be one of {PARITIES}, got {parity!r}")
        if basis not in cg.BASES:
            raise ValueError(f"basis must be one of {tuple(cg.BASES)}, got {basis!r}")
        if not callable(normalization) and normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS} or a callable, got {normalization!r}")
        if isinstance(weights, str) and weights != "per_row":
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        self.per_row = weights == "per_row"
        blocks1, blocks2 = _blocks(self.irreps1), _blocks(self.irreps2)
        lmax1, lmax2 = max(l for l, _ in blocks1), max(l for l, _ in blocks2)
        if l_out is not None:
            if lmax_out is not None:
                raise ValueError("give lmax_out or l_out, not both")
            keep = sorted({_check_int(L, "l_out entry") for L in l_out})
        else:
            lmax_out = lmax1 + lmax2 if lmax_out is None else _check_int(lmax_out, "lmax_out")
            keep = list(range(lmax_out + 1))
        self.parity, self.basis, self.implementation = parity, basis, implementation
        self.normalization = normalization
        dtype = torch.get_default_dtype() if dtype is None else dtype

        paths, pieces, irreps_out, offset_out = [], [], [], 0
        for L in keep:
            count = 0
            for i1, (l1, o1) in enumerate(blocks1):
                for i2, (l2, o2) in enumerate(blocks2):
                    if not abs(l1 - l2) <= L <= l1 + l2 or (parity == "even" and (l1 + l2 + L) % 2):
                        continue
                    m1, m2, mu, C = cg.transformation_rule(l1, l2, L, basis=basis)
                    C = C * _normalization_factor(normalization, l1, l2, L, C)
                    index = len(paths)
                    paths.append(Path(index, i1, l1, i2, l2, L, o1, o2, offset_out))
                    pieces.append((m1 + o1, m2 + o2, mu + offset_out, C, np.full(len(C), index)))
                    offset_out += 2 * L + 1
                    count += 1
            if count:
                irreps_out.append((count, L))
        if not paths:
            raise ValueError(f"no CG path couples {self.irreps1} and {self.irreps2} to the requested degrees "
                             f"{keep} with parity={parity!r}")
        self.paths = tuple(paths)
        self.irreps_out = tuple(irreps_out)
        self.dim1, self.dim2, self.dim_out = irreps_dim(self.irreps1), irreps_dim(self.irreps2), offset_out

        rule = [np.concatenate(parts) for parts in zip(*pieces)]
        self.rule = self._register_rule("", rule, (self.dim1, self.dim2, self.dim_out), dtype)
        self.rule_complex = self._register_rule("_complex", _complex_rule(*rule),
                                                (2 * self.dim1, 2 * self.dim2, 2 * self.dim_out), dtype)
        # what a scripted call passes to the registered op
        self._rule_key, self._rule_complex_key = self.rule.key, self.rule_complex.key
        if weights and not self.per_row:
            self.weight = torch.nn.Parameter(torch.ones(len(paths), dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def _register_rule(self, suffix: str, rule, sizes, dtype) -> Rule:
        # The rule is fixed by the constructor's arguments: the indices as a Rule (no call reads them), the
        # coefficients and the path of each nonzero as buffers (they follow .to(device)) that are not saved in
        # the state dict.
        m1, m2, mu, C, path = rule
        self.register_buffer("path_index" + suffix, torch.as_tensor(path, dtype=torch.int64), persistent=False)
        self.register_exact("C" + suffix, C, dtype)
        if self.per_row:  # the path of each nonzero indexes the weight operand
            return Rule(m1, m2, mu, sizes[2], input_sizes=sizes[:2], w=path, weight_size=len(self.paths))
        return Rule(m1, m2, mu, sizes[2], input_sizes=sizes[:2])

    @property
    def n_paths(self) -> int:
        return len(self.paths)

    def coefficients(self, dtype: Optional[torch.dtype] = None, complex_rule: bool = False) -> torch.Tensor:
        """The coefficients the accumulation uses: normalized, times the path weights when learnable."""
        C = self.C_complex if complex_rule else self.C
        path = self.path_index_complex if complex_rule else self.path_index
        dtype = C.dtype if dtype is None else dtype
        C = C.to(dtype)
        if self.weight is not None:
            C = C * self.weight.to(dtype)[path]
        return C

    def _input(self, X, irreps, dim, name) -> torch.Tensor:
        if not isinstance(X, torch.Tensor):
            X, _ = concatenate(X, irreps)
        if X.dim() < 2 or X.shape[-1] != dim:
            raise ValueError(f"{name} must be [..., channels, {dim}] for irreps {irreps}, got shape {tuple(X.shape)}")
        return X

    def _row_weights(self, W, X1):
        """``W`` checked against the product's weights mode (``None`` without per-row weights)."""
        if not self.per_row:
            if W is not None:
                raise ValueError('W was given but the product has no per-row weights (make it with weights="per_row")')
            return None
        if W is None:
            raise ValueError('W [..., channels, n_paths] is required: the product was made with weights="per_row"')
        if not isinstance(W, torch.Tensor):
            raise TypeError(f"W must be a torch.Tensor, got {type(W).__name__}")
        if W.dim() < 1 or W.shape[-1] != self.n_paths:
            raise ValueError(f"W must be [..., channels, {self.n_paths}] (one weight per path), got shape {tuple(W.shape)}")
        if X1.is_complex():
            real = X1.real.dtype
            if W.dtype != real:
                raise TypeError(f"W must be real with dtype {real} for inputs of dtype {X1.dtype}, got {W.dtype} "
                                "(per-row weights stay real with complex features)")
        return W

    def forward(self, X1, X2, W: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The product ``[..., channels, dim_out]`` of ``X1 [..., channels, dim1]`` and ``X2 [..., channels, dim2]``.

        Args:
            X1, X2: the features (tensors in the concatenated layout, or dicts / lists by degree); leading
                dimensions broadcast (``X2`` as ``[..., 1, dim2]`` is shared by every channel, not copied).
            W: with ``weights="per_row"`` only (and required then): ``[..., channels, n_paths]``, leading
                dimensions broadcasting with the inputs'; path ``p`` is multiplied by ``W[..., p]``. Same
                floating dtype and device as the inputs (their real dtype for complex inputs).

        Raises:
            ValueError: shapes that do not fit or broadcast, ``W`` missing or unexpected.
            TypeError: dtypes that differ, complex ``W``.

        Under ``torch.jit.script`` the inputs must be tensors in the concatenated layout, and the call runs the
        registered op ``torch.ops.sparse_accumulation.accumulate`` (``implementation=None`` meaning ``"auto"``).
        """
        if torch.jit.is_scripting():
            return self._scripted(X1, X2, W)
        X1 = self._input(X1, self.irreps1, self.dim1, "X1")
        X2 = self._input(X2, self.irreps2, self.dim2, "X2")
        W = self._row_weights(W, X1)
        if X1.is_complex() or X2.is_complex():
            if X1.dtype != X2.dtype:
                raise TypeError(f"complex inputs must have the same dtype, got {X1.dtype} and {X2.dtype}")
            x1 = torch.view_as_real(X1.resolve_conj()).flatten(-2)
            x2 = torch.view_as_real(X2.resolve_conj()).flatten(-2)
            out = accumulate_rule(x1, x2, self.rule_complex, self.coefficients(x1.dtype, complex_rule=True), W,
                                  implementation=self.implementation)
            return torch.view_as_complex(out.unflatten(-1, (self.dim_out, 2)))
        return accumulate_rule(X1, X2, self.rule, self.coefficients(X1.dtype), W, implementation=self.implementation)

    def _scripted(self, X1: torch.Tensor, X2: torch.Tensor, W: Optional[torch.Tensor]) -> torch.Tensor:
        """:meth:`forward` under TorchScript."""
        check_width("X1", X1, self.dim1, f"[..., channels, {self.dim1}]")
        check_width("X2", X2, self.dim2, f"[..., channels, {self.dim2}]")
        check_like("X2", X2, "X1", X1)
        if self.C.device != X1.device:
            raise ValueError(f"the product's coefficients are on {self.C.device} but X1 is on {X1.device}")
        if self.per_row != (W is not None):
            raise ValueError("W [..., channels, n_paths] is given exactly when the product was made with "
                             "weights=\"per_row\"")
        if W is not None:
            check_width("W", W, len(self.paths), f"[..., channels, {len(self.paths)}]")
            check_like("W", W, "X1", X1, X1.real.dtype if X1.is_complex() else X1.dtype)
        implementation = "auto" if self.implementation is None else self.implementation
        if X1.is_complex() or X2.is_complex():
            if X1.dtype != X2.dtype:
                raise TypeError(f"complex inputs must have the same dtype, got {X1.dtype} and {X2.dtype}")
            x1 = torch.view_as_real(X1.resolve_conj()).flatten(-2)
            x2 = torch.view_as_real(X2.resolve_conj()).flatten(-2)
            out = torch.ops.sparse_accumulation.accumulate(x1, x2, W, self.coefficients(x1.dtype, True),
                                                           self._rule_complex_key, implementation)
            return torch.view_as_complex(out.unflatten(-1, [self.dim_out, 2]))
        return torch.ops.sparse_accumulation.accumulate(X1, X2, W, self.coefficients(X1.dtype), self._rule_key,
                                                        implementation)

    def split(self, out: torch.Tensor) -> dict:
        """Views ``{L: [..., channels, n_L, 2L+1]}`` of an output (path ``j`` of ``L`` at index ``j``)."""
        return split(out, self.irreps_out)

    def extra_repr(self) -> str:
        return (f"irreps1={self.irreps1}, irreps2={self.irreps2}, irreps_out={self.irreps_out}, "
                f"paths={self.n_paths}, nnz={self.C.shape[0]}, basis={self.basis!r}, parity={self.parity!r}, "
                f"weights={'per_row' if self.per_row else self.weight is not None}")


class ClebschGordanIteration(torch.nn.Module):
    """CG iterations ``X^(nu+1) = CG(X^nu, X^1)`` up to body order ``nu_max``, one fused product per step.

    Step ``nu`` is a :class:`ClebschGordanProduct` from the irreps of ``X^nu`` (grouped by ``L``: its
    blocks are the paths of the previous step) and those of ``X^1``, so each ``(block of X^nu, l of X^1)``
    pair and ``L`` is a path, and the number of blocks per degree grows with the number of paths.

    ``forward(X) -> [X^1, X^2, ..., X^nu_max]``, every entry in the ``[..., channels, dim]`` layout with
    the irreps ``irreps[nu - 1]`` (``irreps[0]`` is that of X^1, whose last dimension is ``dim``);
    ``products[nu - 1]`` computes ``X^(nu+1)``.

    Args:
        irreps: description of ``X^1``.
        nu_max: highest body order (``>= 1``; ``1`` returns ``[X]``).
        lmax_out: largest degree kept at every step (default: the largest degree of ``X^1``).
        parity, basis, normalization, weights, dtype, implementation: as :class:`ClebschGordanProduct`,
            for every step (each step has its own weights; ``weights="per_row"`` raises ``ValueError``, since
            ``forward`` takes no ``W``).
    """

    def __init__(self, irreps: IrrepsLike, nu_max: int, lmax_out: int | None = None, **options):
        super().__init__()
        first = normalize_irreps(irreps)
        if not first:
            raise ValueError("irreps must hold at least one block")
        nu_max = _check_int(nu_max, "nu_max")
        if nu_max < 1:
            raise ValueError("nu_max must be at least 1")
        lmax_out = max(l for _, l in first) if lmax_out is None else _check_int(lmax_out, "lmax_out")
        if options.get("weights") == "per_row":
            raise ValueError('ClebschGordanIteration takes no per-row weights (its forward has no W); call '
                             'ClebschGordanProduct(..., weights="per_row") for each step instead')
        self.products = torch.nn.ModuleList()
        irreps_all = [first]
        for _ in range(nu_max - 1):
            product = ClebschGordanProduct(irreps_all[-1], first, lmax_out, **options)
            self.products.append(product)
            irreps_all.append(product.irreps_out)
        self.irreps = tuple(irreps_all)
        self.nu_max = nu_max
        self.dim = irreps_dim(first)

    def forward(self, X) -> List[torch.Tensor]:
        """``[X^1, ..., X^nu_max]`` of ``X`` (a tensor in the concatenated layout, or a dict / list by degree;
        a tensor under ``torch.jit.script``)."""
        if torch.jit.is_scripting():
            check_width("X", X, self.dim, f"[..., channels, {self.dim}]")
            found = [X]
            for product in self.products:
                found.append(product(found[-1], X))
            return found
        X1, _ = concatenate(X, self.irreps[0])
        if X1.dim() < 2 or X1.shape[-1] != self.dim:
            raise ValueError(f"X must be [..., channels, {self.dim}] for irreps {self.irreps[0]}, "
                             f"got shape {tuple(X1.shape)}")
        result = [X1]
        for product in self.products:
            result.append(product(result[-1], X1))
        return result
