"""What the package prints: durations, sizes and short lists in messages, progress bars
that read well in a terminal and in a log file alike, and native libraries silenced; and
`every`, the thread behind the periodic lines of a run's life (heartbeats, probes)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO, TypeVar

T = TypeVar("T")


def duration(seconds: float) -> str:
    """3725 -> '1h02m05s'."""
    s = int(round(seconds))
    h, m, s = s // 3600, s % 3600 // 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def size(n: float) -> str:
    """Bytes in the unit that reads best: 1536 -> '1.5 KiB', 3 * 2**30 -> '3.00 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def first_few(items: Sequence[str], sep: str = ", ", n: int = 3, unit: str = "") -> str:
    """The first `n` of `items` joined by `sep`, and how many more: 'a, b, c and 2 more'
    ('... and 2 more files' with `unit` 'files')."""
    more = f" and {len(items) - n} more{' ' + unit if unit else ''}" if len(items) > n else ""
    return sep.join(items[:n]) + more


def bar(
    items: Iterable[T],
    total: int | None,
    desc: str,
    enabled: bool = True,
    stream: TextIO | None = None,
    tty: bool | None = None,
    every_seconds: float = 60.0,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[T]:
    """A progress bar on `stream` (stderr) for long loops (evaluation passes).

    On a terminal, one line redrawn in place ('\r'). Otherwise (a log file, a pipe)
    plain lines, so that the log reads line by line: one every `every_seconds` while
    the loop runs and one at the end, 'eval test: 12/40 (30%) 1m00s'.
    """
    out = stream if stream is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)()) if tty is None else tty
    start = last_line = clock()
    i, width = 0, 30
    for i, item in enumerate(items, 1):
        yield item
        if not (enabled and total):
            continue
        now = clock()
        if tty:
            fill = "#" * int(width * min(i / total, 1.0))
            out.write(f"\r{desc} [{fill:<{width}}] {i}/{total} {duration(now - start)}")
        elif i < total and now - last_line >= every_seconds:
            out.write(f"{desc}: {i}/{total} ({100 * i // total}%) {duration(now - start)}\n")
            last_line = now
        out.flush()
    if enabled and total:
        out.write("\n" if tty else f"{desc}: {i}/{total} done in {duration(clock() - start)}\n")
        out.flush()


@contextlib.contextmanager
def absl_warnings_off() -> Iterator[None]:
    """absl's INFO and WARNING logs off for the block: for library calls whose warnings
    the caller turns into its own message (or deliberately tolerates)."""
    from absl import logging

    level = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)
    try:
        yield
    finally:
        logging.set_verbosity(level)


@contextlib.contextmanager
def silenced_stderr() -> Iterator[None]:
    """File descriptor 2 discarded for the block: for native libraries that write start-up
    warnings about a host they are not on (libtpu's, when the planner compiles)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def every(seconds: float, fn: Callable[[], Any], name: str) -> Iterator[None]:
    """Calls fn() every `seconds` on a thread of its own while the block runs."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(seconds):
            fn()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
