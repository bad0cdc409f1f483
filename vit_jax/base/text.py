"""Short lists and sizes in messages."""

from __future__ import annotations

from collections.abc import Sequence


def first_few(items: Sequence[str], sep: str = ", ", n: int = 3, unit: str = "") -> str:
    """The first `n` of `items` joined by `sep`, and how many more: 'a, b, c and 2 more'
    ('... and 2 more files' with `unit` 'files')."""
    more = f" and {len(items) - n} more{' ' + unit if unit else ''}" if len(items) > n else ""
    return sep.join(items[:n]) + more


def size(n: float) -> str:
    """Bytes in the unit that reads best: 1536 -> '1.5 KiB', 3 * 2**30 -> '3.00 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"
