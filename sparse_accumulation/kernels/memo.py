"""Host-side call plans remembered per key, so that a repeated call skips its layout analysis."""
from __future__ import annotations

from typing import Callable


class Memo:
    """A dictionary of plans built on first use, emptied when it holds ``limit`` of them.

    Keys are tuples of the call's static description (rule key, row space, strides, dtype, options); a key
    that cannot be hashed (symbolic sizes while ``torch.compile`` traces) builds its plan without keeping it.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.plans: dict = {}

    def get(self, key, build: Callable):
        """The plan of ``key``, from ``build()`` the first time."""
        try:
            plan = self.plans.get(key)
        except TypeError:
            return build()
        if plan is None:
            if len(self.plans) >= self.limit:
                self.plans.clear()
            plan = self.plans[key] = build()
        return plan

    def clear(self) -> None:
        self.plans.clear()
