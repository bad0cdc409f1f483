"""How a command ends on the terminal: a user error as one `error: ...` line and exit 1,
Ctrl-C as one line and exit 130 (a run stopped by SIGTERM: 143), and nothing after that
last word. While the command runs, libraries' error reports are held back (`HeldErrors`),
so a failing background write does not speak before the command's own line.
VIT_JAX_DEBUG=1 (`debug`) shows everything: tracebacks, and what libraries say afterwards.

vit_jax/cli.py's `run` ends every command through these.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from typing import NoReturn

DEBUG_ENV = "VIT_JAX_DEBUG"
# A run whose workdir lock another run took over (workdir/lock.py) stops at once with one
# `error:` line and this status, saving nothing more: not 75 (run it again), as a rerun
# would be refused while the other run holds the workdir.
LOCK_LOST = 73
LEAVE_SECONDS = 180.0  # the longest a leaver takes: outage.give_up waits 60 s for the others


class _Mute:
    """A stream whose write and flush never fail (a broken pipe, a closed or absent
    stderr): what a process that is leaving says cannot stop it from leaving."""

    def __init__(self, stream) -> None:
        self.stream = stream.stream if isinstance(stream, _Mute) else stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except Exception:  # noqa: BLE001 (nobody is left to tell)
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


class _Leaving(threading.Event):
    """Set when a thread ends the process with its own line and `status` (outage.give_up's
    75): what the main thread fails with meanwhile (the distributed runtime shut under it)
    is not said (`_last_word`). From then on stdout and stderr cannot fail (`_Mute`), and
    if the leaver fails anyway, the main thread's last word ends the process for it."""

    status, by = 75, None

    def set(self, status: int = 75) -> None:
        self.status, self.by = status, threading.current_thread()
        sys.stdout, sys.stderr = _Mute(sys.stdout), _Mute(sys.stderr)
        super().set()


leaving = _Leaving()


def unless_leaving() -> None:
    """Another thread ends the process (`leaving`: a lock taken over, a store given up):
    the caller, about to write, writes nothing more and waits for that end."""
    if leaving.is_set() and leaving.by is not threading.current_thread():
        leaving.by.join(LEAVE_SECONDS)  # it ends the process; if it failed, this one does
        sys.stdout.flush()
        os._exit(leaving.status)


def debug() -> bool:
    """Whether VIT_JAX_DEBUG asks for tracebacks of user errors."""
    return os.environ.get(DEBUG_ENV, "").lower() not in ("", "0", "false", "no")


class HeldErrors:
    """Libraries' error reports (other loggers' errors, unraisable exceptions), held back
    while a command runs: a failing background write (Orbax's thread, TensorStore's
    callbacks, asyncio) reports itself before the command's own `error:` line. Shown if
    the command succeeds (`release`), dropped when it fails with its one line."""

    def __init__(self) -> None:
        self.records: list = []
        self.unraisable: list = []
        self._handlers, self._hook = [], None

    def filter(self, record) -> bool:  # a logging filter on the root logger's handlers
        if record.levelno >= 40 and not record.name.startswith("vit_jax") and not debug():
            self.records.append(record)
            return False
        return True

    def _hold(self, unraisable) -> None:
        if debug():
            self._hook(unraisable)
        else:
            self.unraisable.append((unraisable.exc_type, unraisable.exc_value, unraisable.err_msg))

    def __enter__(self) -> HeldErrors:
        import logging

        self._handlers = list(logging.getLogger().handlers)
        for handler in self._handlers:
            handler.addFilter(self)
        self._hook, sys.unraisablehook = sys.unraisablehook, self._hold
        return self

    def __exit__(self, *exc: object) -> None:
        for handler in self._handlers:
            handler.removeFilter(self)
        if sys.unraisablehook == self._hold:
            sys.unraisablehook = self._hook

    def release(self) -> None:
        """Shows what was held, as it would have been shown."""
        import logging
        import traceback

        for record in self.records:
            logging.getLogger(record.name).handle(record)
        for kind, value, message in self.unraisable:
            sys.stderr.write(f"{message or 'Exception ignored'}:\n")
            traceback.print_exception(kind, value, value.__traceback__ if value else None)
        self.records, self.unraisable = [], []


def interrupted(message: str, status: int = 130) -> NoReturn:
    """Ctrl-C: exit 130 (SIGINT's; a run stopped by SIGTERM: 143) with one line on stderr,
    the command's own (a run says where it stopped and how to resume) or 'interrupted'."""
    after_echo = "\n" if sys.stderr.isatty() else ""  # the terminal's ^C ends no line
    _last_word(f"{after_echo}{message or 'interrupted'}\n")
    sys.exit(status)


def fail(message: str) -> NoReturn:
    """Exit 1 with `error: message` on stderr, naming how to get the traceback; nothing
    is printed after it (`_last_word`)."""
    _last_word(f"error: {message}\n(for the Python traceback, set {DEBUG_ENV}=1)\n")
    sys.exit(1)


def _last_word(text: str) -> None:
    """Writes `text` to stderr as the command's last output. What libraries would report
    afterwards about the failure just named (Orbax's and asyncio's logs of a failed
    background write, 'Future exception was never retrieved' at exit, errors in
    finalizers, unawaited coroutines) says nothing the line does not, so logging, warnings
    and unraisable reports are silenced first; VIT_JAX_DEBUG=1 keeps them (and the traceback)."""
    import logging

    if leaving.is_set():  # the thread that set it exits the process, unless it failed
        unless_leaving()
        sys.stdout.flush()
        os._exit(leaving.status)
    sys.stdout.flush()
    logging.disable(logging.CRITICAL)  # absl's logs go through the standard logging
    warnings.simplefilter("ignore")  # at exit: 'coroutine ... was never awaited' (Orbax's)
    sys.unraisablehook = lambda unraisable: None
    sys.stderr.write(text)
    sys.stderr.flush()
