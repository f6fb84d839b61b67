"""Progress bars of ``bench`` and ``check``: tqdm, on stderr, hidden when it is not a terminal."""
from __future__ import annotations

import sys

__all__ = ["progress_bar"]


def progress_bar(total: int, description: str, progress=True):
    """A ``tqdm`` bar over ``total`` steps (use ``bar.update()``, ``bar.set_postfix_str(text)``, ``with``).

    Args:
        total: number of steps.
        description: the text before the bar.
        progress: ``True`` to draw on ``sys.stderr``, a text stream to draw on it, ``False`` or ``None`` for
            no bar. The bar is hidden as well when the stream is not a terminal (a pipe, a file, a test).
    """
    from tqdm import tqdm

    stream = progress if progress not in (True, False, None) else sys.stderr
    return tqdm(total=total, desc=description, file=stream, disable=None if progress else True,
                dynamic_ncols=True, unit="step")
