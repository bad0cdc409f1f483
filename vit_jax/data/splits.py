"""Split strings with TFDS slicing syntax, resolved to absolute ranges for every source.

'train', 'train[:10%]', 'train[90%:]', 'train[100:200]', 'train[-500:]' mean what they
mean in TFDS: percent boundaries round to the closest example (``round(p * n / 100)``),
negative boundaries count from the end. The idx and folder sources use this module
directly; the TFDS source resolves the slice here too, so that per-process ranges and
class subsets are computed the same way for all sources.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

_SPLIT_RE = re.compile(r"^(?P<name>[\w-]+)(\[(?P<start>[^:\]]*):(?P<stop>[^:\]]*)\])?$")
_BOUND_RE = re.compile(r"^(?P<value>-?\d+(\.\d*)?)(?P<percent>%?)$")


class SplitError(ValueError):
    """A split spec that is malformed, or whose boundaries do not fit its split."""


@dataclasses.dataclass(frozen=True)
class Split:
    """A split name with an absolute example range [start, stop) of that split."""

    name: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def split_name(spec: str) -> str:
    """The split name of a spec: 'train[:10%]' -> 'train'."""
    return _parse(spec)[0]


def spec_rule(spec: Any) -> str | None:
    """A config rule (`base.problems`): what is wrong with a malformed spec, or None
    (nothing is read: sizes are not checked)."""
    try:
        _parse(spec)
    except ValueError as e:
        return str(e)
    return None


def resolve(spec: str, num_examples: int) -> Split:
    """Resolves a split spec against the size of the named split.

    Args:
        spec: 'name' or 'name[start:stop]' with absolute or percent boundaries.
        num_examples: Number of examples in the named split.

    Returns:
        The absolute range, 0 <= start <= stop <= num_examples.

    Raises:
        SplitError: For malformed specs and boundaries beyond the split.
    """
    name, start, stop = _parse(spec)
    bounds = []
    for bound, default in ((start, 0), (stop, num_examples)):
        if bound is None:
            bounds.append(default)
            continue
        value, percent = bound
        if percent:
            value = int(round(value * num_examples / 100.0))
        if abs(value) > num_examples:
            raise SplitError(
                f"split {spec!r}: boundary {value} is beyond the {num_examples} examples "
                f"of split {name!r}."
            )
        bounds.append(value + num_examples if value < 0 else value)
    return Split(name, bounds[0], max(bounds[0], bounds[1]))


def _parse(spec: str) -> tuple[str, tuple[float, bool] | None, tuple[float, bool] | None]:
    match = _SPLIT_RE.match(spec.replace(" ", "")) if isinstance(spec, str) else None
    if not match:
        raise SplitError(
            f"split {spec!r}: expected 'name' or 'name[start:stop]' with absolute or percent "
            "boundaries, e.g. 'train', 'train[:10%]', 'train[90%:]', 'train[100:-100]'."
        )
    bounds = []
    for key in ("start", "stop"):
        text = match.group(key)
        if not text:
            bounds.append(None)
            continue
        bound = _BOUND_RE.match(text)
        if not bound or (not bound.group("percent") and "." in text):
            raise SplitError(
                f"split {spec!r}: boundary {text!r} is not an integer or a percentage like '10%'."
            )
        value = float(bound.group("value")) if bound.group("percent") else int(text)
        bounds.append((value, bool(bound.group("percent"))))
    return match.group("name"), bounds[0], bounds[1]


def process_range(num_examples: int, process_index: int, process_count: int) -> tuple[int, int]:
    """Contiguous share [lo, hi) of process_index; shares differ in size by at most 1."""
    lo = num_examples * process_index // process_count
    hi = num_examples * (process_index + 1) // process_count
    return lo, hi
