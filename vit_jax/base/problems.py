"""Config values that cannot make sense, all named at once.

A check appends one `Problem` per bad field (the field, its value, what is allowed) and
raises one `ConfigError` for all of them, so a user fixes every field in one go instead
of meeting them one run at a time. The library names fields ('optimizer.lr'); a command
says how to set them (`ConfigError.lines(prefix='--config.')`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Problem:
    """One field that cannot make sense: 'optimizer.lr=-1.0: expected a number > 0'."""

    field: str
    value: Any
    allowed: str
    fix: str = ""  # a value that fits: 'N with N <= 300' (said as '; set FIELD=N with ...')

    def line(self, prefix: str = "") -> str:
        fix = f"; set {prefix}{self.field}={self.fix}" if self.fix else ""
        return f"{prefix}{self.field}={self.value!r}: {self.allowed}{fix}"


class ConfigError(ValueError):
    """A config with fields that cannot make sense; str() names every one, a line each
    (one bad field: one line). `prefix` goes before each field name: a command that
    takes the fields as flags passes its flag prefix ('--config.')."""

    def __init__(self, problems: Sequence[Problem], what: str = "config", prefix: str = ""):
        self.problems, self.what, self.prefix = list(problems), what, prefix
        super().__init__(self.message())

    def message(self) -> str:
        lines = [p.line(self.prefix) for p in self.problems]
        if len(lines) == 1:
            return lines[0] if self.what == "config" else f"the {self.what}: {lines[0]}"
        head = f"{len(lines)} fields of the {self.what} cannot make sense:"
        return "\n".join([head, *(f"  {line}" for line in lines)])

    def with_prefix(self, prefix: str) -> ConfigError:
        return ConfigError(self.problems, self.what, prefix)


def raise_if_any(problems: Iterable[Problem], what: str = "config") -> None:
    if problems := list(problems):
        raise ConfigError(problems, what)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite real number (an int or a float, not a bool, not NaN or infinite)."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


Rule = Callable[[Any], "str | None"]  # a value -> what was expected, or None where it fits


def integer(low: int, note: str = "") -> Rule:
    """An int >= low."""
    return lambda v: None if is_int(v) and v >= low else f"expected an integer >= {low}{note}"


def number(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    note: str = "",
) -> Rule:
    """A finite number in the interval [low, high] (or open at either end)."""

    def rule(v: Any) -> str | None:
        ok = is_number(v) and (low is None or (v > low if low_open else v >= low))
        ok = ok and (high is None or (v < high if high_open else v <= high))
        interval = _interval(low, high, low_open, high_open)
        return None if ok else f"expected a finite number {interval}{note}"

    return rule


def one_of(choices: Sequence[Any]) -> Rule:
    return lambda v: None if v in choices else f"expected one of {', '.join(map(repr, choices))}"


def optional(rule: Rule) -> Rule:
    """`rule`, or None (the field unset)."""
    return lambda v: None if v is None else rule(v)


def table_problems(section: Any, table: dict[str, Rule], prefix: str = "") -> list[Problem]:
    """A Problem for each field of `section` (a ConfigDict or dict) that its rule in
    `table` refuses; a field the section does not have is not checked."""
    return [
        Problem(prefix + field, section[field], why)
        for field, rule in table.items()
        if field in section and (why := rule(section[field]))
    ]


def _interval(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return ""
