"""Short lists in messages."""

from __future__ import annotations

from collections.abc import Sequence


def first_few(items: Sequence[str], sep: str = ", ", n: int = 3, unit: str = "") -> str:
    """The first `n` of `items` joined by `sep`, and how many more: 'a, b, c and 2 more'
    ('... and 2 more files' with `unit` 'files')."""
    more = f" and {len(items) - n} more{' ' + unit if unit else ''}" if len(items) > n else ""
    return sep.join(items[:n]) + more
