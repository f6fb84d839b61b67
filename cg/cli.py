"""Command line interface: ``python -m cg tables ...`` and ``python -m cg show ...``."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .bases import BASES

__all__ = ["main"]

PROG = "python -m cg"


class _UsageError(Exception):
    """A command-line usage problem, reported as one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and call sys.exit(2)
        raise _UsageError(message)


def _progress(stream, label: str, quiet: bool):
    """A ``progress(done, total)`` callback drawing a tqdm bar on ``stream``; hidden when ``quiet`` or when
    ``stream`` is not a terminal. Returns ``(callback, close)``."""
    from tqdm import tqdm

    bar = tqdm(total=0, desc=label, file=stream, disable=True if quiet else None, dynamic_ncols=True,
               unit="rule")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    return progress, bar.close


def _build_parser(prog: str = PROG) -> _Parser:
    parser = _Parser(prog=prog, description="Clebsch-Gordan coefficients and transformation rules.")
    sub = parser.add_subparsers(dest="command", metavar="{tables,show}", parser_class=_Parser)

    tables = sub.add_parser("tables", help="compute all rules up to lmax and save them as .npz")
    tables.add_argument("--lmax", type=int, required=True, help="largest l1, l2 and L")
    tables.add_argument("--basis", choices=BASES, default="real", help="coefficient basis (default: real)")
    tables.add_argument("--output", "-o", required=True, help="output .npz file")
    tables.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    show = sub.add_parser("show", help="print the transformation rule of one coupling l1 x l2 -> L")
    show.add_argument("l1", type=int)
    show.add_argument("l2", type=int)
    show.add_argument("L", type=int)
    show.add_argument("--basis", choices=BASES, default="real", help="coefficient basis (default: real)")
    show.add_argument("--exact", action="store_true", help="print exact values (sympy)")
    return parser


def _cmd_tables(args, out, err) -> int:
    from .tables import CoefficientTable

    progress, close = _progress(err, f"{args.basis} lmax={args.lmax}", args.quiet)
    try:
        table = CoefficientTable.build(args.lmax, basis=args.basis, progress=progress)
    finally:
        close()
    path = args.output if args.output.endswith(".npz") else args.output + ".npz"
    table.save(path)
    print(f"wrote {len(table)} rules ({args.basis}, lmax={args.lmax}) to {path}", file=out)
    return 0


def _cmd_show(args, out) -> int:
    from .coefficients import clebsch_gordan
    from .rules import transformation_rule

    l1, l2, L = args.l1, args.l2, args.L
    m1, m2, mu, coeff = transformation_rule(l1, l2, L, basis=args.basis)
    values = [f"{c:.12g}" for c in coeff]
    if args.exact:
        exact = clebsch_gordan(l1, l2, L, basis=args.basis, exact=True)
        values = [str(exact[a, b, c]) for a, b, c in zip(m1, m2, mu)]
    header = ["m1", "m2", "mu", "i1", "i2", "imu", "C"]
    rows = [
        [str(a - l1), str(b - l2), str(c - L), str(a), str(b), str(c), v]
        for a, b, c, v in zip(m1.tolist(), m2.tolist(), mu.tolist(), values)
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print(f"# {args.basis} rule l1={l1} l2={l2} L={L}: {len(rows)} non-zero coefficients", file=out)
    print("# m = magnetic numbers, i = offset indices (m + l)", file=out)
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)), file=out)
    for r in rows:
        print("  ".join(x.rjust(w) for x, w in zip(r, widths)), file=out)
    return 0


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    """Run the command line interface.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).
        prog: the program name that usage lines and error messages show; ``sparse-accumulation tables``
            passes ``"sparse-accumulation"``.

    Returns:
        The exit status, 0 on success or 2 on a usage or argument error (then one line on stderr,
        ``python -m cg: error: ...``, with no traceback).
    """
    out, err = sys.stdout, sys.stderr
    parser = _build_parser(prog)
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise _UsageError("a command is required: tables or show (see --help)")
        if args.command == "tables":
            return _cmd_tables(args, out, err)
        return _cmd_show(args, out)
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else 0
    except (_UsageError, ValueError, KeyError, OSError) as exc:
        msg = str(exc).replace("\n", " ")
        print(f"{prog}: error: {msg}", file=err)
        return 2
