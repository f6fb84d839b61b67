"""Tables of transformation rules for all couplings up to ``lmax``, with ``.npz`` storage."""
from __future__ import annotations

import functools
import os
import zipfile
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from ._validation import check_basis, check_l, check_triple
from .rules import transformation_rule

__all__ = ["CoefficientTable", "load_precomputed", "FORMAT_VERSION", "DATA_DIR", "PRECOMPUTED_LMAX"]

#: Version of the ``.npz`` layout written by :meth:`CoefficientTable.save`.
FORMAT_VERSION = 1
#: Folder of the tables shipped with the package.
DATA_DIR = Path(__file__).resolve().parent / "data"
#: ``lmax`` of the shipped tables.
PRECOMPUTED_LMAX = 8

_REQUIRED_KEYS = ("format_version", "basis", "lmax", "keys", "offsets", "m1", "m2", "mu", "C")


def _triples(lmax: int) -> list[tuple[int, int, int]]:
    """All valid ``(l1, l2, L)`` with every entry ``<= lmax``, in lexicographic order."""
    return [
        (l1, l2, L)
        for l1 in range(lmax + 1)
        for l2 in range(lmax + 1)
        for L in range(abs(l1 - l2), min(l1 + l2, lmax) + 1)
    ]


def _readonly(*arrays):
    for arr in arrays:
        arr.setflags(write=False)
    return arrays


class CoefficientTable:
    """All transformation rules ``(l1, l2, L)`` with ``l1, l2, L <= lmax`` of one basis.

    Behaves like a read-only mapping from ``(l1, l2, L)`` to rules: ``len(table)``,
    ``(1, 1, 2) in table``, ``for key in table`` (keys in lexicographic order) and
    :meth:`rule`.  Create one with :meth:`build` or :meth:`load`.

    Attributes:
        lmax (int): largest ``l`` in the table.
        basis (str): ``"real"``, ``"complex"`` or ``"e3nn"``.
    """

    def __init__(self, basis: str, lmax: int, rules: dict):
        """Wrap already computed rules (internal; use :meth:`build` or :meth:`load`).

        Args:
            basis: basis name.
            lmax: largest ``l``.
            rules: ``{(l1, l2, L): (m1, m2, mu, C)}`` holding exactly the valid triples
                up to ``lmax``; the arrays are made read-only.
        """
        self.basis = check_basis(basis)
        self.lmax = check_l(lmax, "lmax")
        expected = _triples(self.lmax)
        if set(rules) != set(expected):
            raise ValueError(f"rules do not cover exactly the triples with lmax={self.lmax}")
        self._rules = {}
        for key in expected:
            m1, m2, mu, c = rules[key]
            self._rules[key] = _readonly(
                np.array(m1, dtype=np.int64),
                np.array(m2, dtype=np.int64),
                np.array(mu, dtype=np.int64),
                np.array(c, dtype=np.float64),
            )

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        lmax,
        basis: str = "real",
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> "CoefficientTable":
        """Compute every rule with ``l1, l2, L <= lmax``.

        Args:
            lmax: non-negative integer.
            basis: ``"real"`` (default), ``"complex"`` or ``"e3nn"``.
            progress: optional ``callable(done, total)`` called after each rule (and once
                with ``done = 0`` before the first).

        Returns:
            A new :class:`CoefficientTable`.

        Raises:
            ValueError: for an invalid ``lmax`` or ``basis``.
        """
        lmax = check_l(lmax, "lmax")
        basis = check_basis(basis)
        triples = _triples(lmax)
        total = len(triples)
        if progress is not None:
            progress(0, total)
        rules = {}
        for done, key in enumerate(triples, start=1):
            rules[key] = transformation_rule(*key, basis=basis)
            if progress is not None:
                progress(done, total)
        return cls(basis, lmax, rules)

    def truncate(self, lmax) -> "CoefficientTable":
        """Return a new table holding only the rules with ``l1, l2, L <= lmax``.

        Raises:
            ValueError: if ``lmax`` is not an integer in ``0 .. self.lmax``.
        """
        lmax = check_l(lmax, "lmax")
        if lmax > self.lmax:
            raise ValueError(f"lmax={lmax} exceeds the table's lmax={self.lmax}")
        return CoefficientTable(self.basis, lmax, {k: self._rules[k] for k in _triples(lmax)})

    # ------------------------------------------------------------------ mapping
    def rule(self, l1, l2, L):
        """The rule ``(m1, m2, mu, C)`` of one triple.

        Returns:
            read-only int64 ``m1, m2, mu`` (offset indices) and float64 ``C``, as
            :func:`cg.transformation_rule`.

        Raises:
            ValueError: for an invalid triple (see :func:`cg.clebsch_gordan`).
            KeyError: if the triple exceeds this table's ``lmax``.
        """
        key = check_triple(l1, l2, L)
        try:
            return self._rules[key]
        except KeyError:
            raise KeyError(f"(l1, l2, L)={key} is not in this table (lmax={self.lmax})") from None

    def __contains__(self, key) -> bool:
        if not isinstance(key, (tuple, list)) or len(key) != 3:
            return False
        if not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in key):
            return False
        return tuple(int(k) for k in key) in self._rules

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return iter(self._rules)

    def keys(self):
        """The ``(l1, l2, L)`` keys in lexicographic order."""
        return list(self._rules)

    def __repr__(self) -> str:
        return f"CoefficientTable(basis={self.basis!r}, lmax={self.lmax}, rules={len(self)})"

    # ------------------------------------------------------------------ storage
    def save(self, path) -> None:
        """Write the table to one compressed ``.npz`` file (no pickled objects).

        The file holds ``format_version``, ``basis``, ``lmax``, the ``keys`` (n, 3),
        ``offsets`` (n + 1) into the concatenated ``m1, m2, mu`` (int16) and ``C``
        (float64) arrays.

        Args:
            path: file name or path; numpy appends ``.npz`` if it is missing.
        """
        keys = np.array(list(self._rules), dtype=np.int64).reshape(-1, 3)
        parts = list(self._rules.values())
        lengths = np.array([len(p[3]) for p in parts], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        idx_dtype = np.int16 if 2 * self.lmax < 2**15 else np.int32

        def cat(i, dtype):
            return np.concatenate([p[i] for p in parts]).astype(dtype) if parts else np.zeros(0, dtype)

        np.savez_compressed(
            path,
            format_version=np.array(FORMAT_VERSION, dtype=np.int64),
            basis=np.array(self.basis),
            lmax=np.array(self.lmax, dtype=np.int64),
            keys=keys,
            offsets=offsets,
            m1=cat(0, idx_dtype),
            m2=cat(1, idx_dtype),
            mu=cat(2, idx_dtype),
            C=cat(3, np.float64),
        )

    @classmethod
    def load(cls, path, basis: Optional[str] = None) -> "CoefficientTable":
        """Read a table written by :meth:`save`.

        Args:
            path: the ``.npz`` file.
            basis: if given, the basis the file must hold.

        Returns:
            A new :class:`CoefficientTable`.

        Raises:
            ValueError: if the file is not a readable table (corrupt, not ``.npz``,
                missing or malformed entries), was written with another format version,
                or holds another basis than ``basis``; the message names the problem.
            FileNotFoundError: if ``path`` does not exist.
        """
        if basis is not None:
            basis = check_basis(basis)
        name = os.fspath(path)
        if not os.path.exists(name):
            raise FileNotFoundError(f"coefficient table file not found: {name}")
        try:
            data = np.load(name, allow_pickle=False)
            try:
                if not isinstance(data, np.lib.npyio.NpzFile):
                    raise ValueError("it holds a single array, not an .npz archive")
                missing = [k for k in _REQUIRED_KEYS if k not in data.files]
                if missing:
                    raise ValueError(f"missing entries {', '.join(missing)}")
                arrays = {k: data[k] for k in _REQUIRED_KEYS}
            finally:
                if hasattr(data, "close"):
                    data.close()
        except ValueError as exc:
            raise ValueError(f"{name} is not a valid coefficient table: {exc}") from None
        except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
            raise ValueError(f"{name} is not a valid coefficient table (corrupt file: {exc})") from None

        def bad(msg):
            return ValueError(f"{name} is not a valid coefficient table: {msg}")

        try:
            version = int(arrays["format_version"])
        except (TypeError, ValueError):
            raise bad("format_version is not an integer") from None
        if version != FORMAT_VERSION:
            raise ValueError(
                f"{name} has coefficient table format version {version}, "
                f"this library reads version {FORMAT_VERSION}"
            )
        file_basis = arrays["basis"]
        if file_basis.shape != () or file_basis.dtype.kind != "U" or str(file_basis) not in ("real", "complex", "e3nn"):
            raise bad(f"unknown basis entry {file_basis!r}")
        file_basis = str(file_basis)
        if basis is not None and file_basis != basis:
            raise ValueError(f"{name} holds a {file_basis!r} table, but basis={basis!r} was requested")
        try:
            lmax = check_l(int(arrays["lmax"]), "lmax")
        except (TypeError, ValueError):
            raise bad("lmax is not a non-negative integer") from None
        keys, offsets = arrays["keys"], arrays["offsets"]
        m1, m2, mu, c = (arrays[k] for k in ("m1", "m2", "mu", "C"))
        expected = _triples(lmax)
        if keys.shape != (len(expected), 3) or keys.dtype.kind not in "iu":
            raise bad("the keys do not match lmax")
        if [tuple(k) for k in keys.tolist()] != expected:
            raise bad("the keys do not match lmax")
        n = len(c)
        if (
            offsets.shape != (len(expected) + 1,)
            or offsets.dtype.kind not in "iu"
            or offsets[0] != 0
            or offsets[-1] != n
            or np.any(np.diff(offsets) < 0)
            or any(a.shape != (n,) or a.dtype.kind not in "iu" for a in (m1, m2, mu))
            or c.dtype.kind != "f"
        ):
            raise bad("inconsistent rule arrays")
        rules = {}
        for i, (l1, l2, L) in enumerate(expected):
            s = slice(int(offsets[i]), int(offsets[i + 1]))
            r = (m1[s], m2[s], mu[s], c[s])
            if len(r[0]) and (
                r[0].min() < 0 or r[0].max() > 2 * l1
                or r[1].min() < 0 or r[1].max() > 2 * l2
                or r[2].min() < 0 or r[2].max() > 2 * L
            ):
                raise bad(f"index out of range in rule {(l1, l2, L)}")
            rules[(l1, l2, L)] = r
        return cls(file_basis, lmax, rules)


@functools.lru_cache(maxsize=None)
def _load_shipped(basis: str) -> CoefficientTable:
    return CoefficientTable.load(DATA_DIR / f"{basis}_lmax{PRECOMPUTED_LMAX}.npz", basis=basis)


def load_precomputed(basis: str = "real", lmax=PRECOMPUTED_LMAX) -> CoefficientTable:
    """Table of all rules up to ``lmax`` in ``basis``, from the files shipped in ``cg/data``.

    For ``lmax <= 8`` the stored table is loaded (once per process) and truncated; for a
    larger ``lmax`` the table is built fresh (and not cached).  If the shipped file is
    missing, the table is built as well.

    Args:
        basis: ``"real"`` (default), ``"complex"`` or ``"e3nn"``.
        lmax: non-negative integer (default 8).

    Returns:
        A :class:`CoefficientTable` (share its read-only arrays freely).

    Raises:
        ValueError: for an invalid ``basis`` or ``lmax``, or a damaged shipped file.
    """
    basis = check_basis(basis)
    lmax = check_l(lmax, "lmax")
    if lmax > PRECOMPUTED_LMAX or not (DATA_DIR / f"{basis}_lmax{PRECOMPUTED_LMAX}.npz").exists():
        return CoefficientTable.build(lmax, basis=basis)
    table = _load_shipped(basis)
    return table if lmax == table.lmax else table.truncate(lmax)
