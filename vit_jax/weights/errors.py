"""The one error of a parameter file: unreadable, or not fitting the model."""

from __future__ import annotations

import re
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or does not fit the model."""


def mismatches(
    got: dict[str, Any], want: dict[str, Any], expects: str, absent: str, key: str = ""
) -> list[str]:
    """Up to 12 lines, `key` before each name: each tensor `got` shapes otherwise than `want`
    ('has shape (..), `expects` (..)'), each it lacks, then each `want` lacks ('is
    `absent`'); a problem of several blocks is named once, with how many more have it."""
    shape = lambda d, k: tuple(d[k].shape)
    shaped = {k for k in want.keys() & got.keys() if shape(got, k) != shape(want, k)}
    problems = (
        (shaped, lambda k: f"has shape {shape(got, k)}, {expects} {shape(want, k)}"),
        (want.keys() - got.keys(), lambda k: f"is missing ({expects} {shape(want, k)})"),
        (got.keys() - want.keys(), lambda k: f"{shape(got, k)} is {absent}"),
    )
    lines = [
        f"{key}{k} {say(k)}{note}" for keys, say in problems for k, note in _grouped(keys).items()
    ]
    return lines[:12] + ([f"... and {len(lines) - 12} more"] if len(lines) > 12 else [])


def _grouped(keys: set[str]) -> dict[str, str]:
    """Keys in reading order (top level first), one representative per block pattern,
    mapped to a note of the other blocks with the same problem."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        groups.setdefault(re.sub(r"encoderblock_\d+", "encoderblock_*", k), []).append(k)
    out = {}
    for pattern in sorted(groups, key=lambda p: ("encoderblock_" in p, p)):
        ks = sorted(
            groups[pattern],
            key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)],
        )
        out[ks[0]] = f" (and in {len(ks) - 1} more blocks)" if len(ks) > 1 else ""
    return out
