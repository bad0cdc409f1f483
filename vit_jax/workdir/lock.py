"""One run per workdir: the lead process holds `workdir/run.lock` while it trains.

The lock is a JSON file created whole or not at all (O_EXCL) naming the holder: host,
pid, the process's own start time (to tell a reused pid apart) and when the run started.
A thread touches it every HEARTBEAT_SECONDS (its mtime is the heartbeat); it is removed
when the run ends, whatever the end. A second run finds it and stops with one message
naming the holder, having touched nothing. A lock is stale, and taken over with a note,
when its process is gone (same host: no such pid, or one started at another time) or
its heartbeat is older than STALE_SECONDS (any host: a killed machine, another pod).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from vit_jax.base.console import duration

NAME = "run.lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0  # ten missed heartbeats


class WorkdirLocked(OSError):
    """Another live run holds the workdir; str() names it and the way out."""


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (Linux), None elsewhere
    or when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def holder_now() -> dict[str, Any]:
    """What this process writes into the lock."""
    now = time.time()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": _process_start(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)),
        "started_at": now,
    }


def describe(holder: dict[str, Any]) -> str:
    """'host n1 pid 4242, started 2026-11-24 00:21:47 UTC'."""
    return f"host {holder.get('host')} pid {holder.get('pid')}, started {holder.get('started')}"


def stale_reason(holder: dict[str, Any], age: float, stale_after: float) -> str | None:
    """Why the lock of `holder`, last touched `age` seconds ago, is stale; None if not."""
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        start = _process_start(holder["pid"])
        gone = not _exists(holder["pid"]) or (
            start is not None and holder.get("process_start") not in (None, start)
        )
        if gone:
            return "its process no longer exists"
    if age > stale_after:
        return f"its heartbeat stopped {duration(age)} ago"
    return None


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _read(path: str) -> tuple[dict[str, Any], float] | None:
    """(holder, seconds since its heartbeat), or None when there is no lock. A lock being
    written (empty, half a JSON) reads as a holder of unknown name, just touched."""
    try:
        age = time.time() - os.stat(path).st_mtime
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = {}
    return (holder if isinstance(holder, dict) else {}), age


def acquire(workdir: str, stale_after: float = STALE_SECONDS) -> dict[str, Any]:
    """Takes the lock of `workdir` (created if missing) for this process; returns what
    it wrote. A stale lock is taken over, with a note on stdout.

    Raises:
        WorkdirLocked: a live run holds it (nothing was written).
    """
    path = os.path.join(workdir, NAME)
    mine = holder_now()
    for _ in range(3):  # lost a race for a stale lock: look again
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            found = _read(path)
            if found is None:
                continue  # released meanwhile
            holder, age = found
            why = stale_reason(holder, age, stale_after)
            if why is None:
                raise WorkdirLocked(
                    f"workdir {workdir} is in use by another run ({describe(holder)}; "
                    f"lock {path}, heartbeat {duration(age)} ago). Wait for it to end, "
                    "stop it, or choose another --workdir; if that run is gone, delete "
                    f"{path} (a lock whose heartbeat stopped {duration(stale_after)} ago "
                    "is taken over)"
                ) from None
            if _take_over(path, holder):
                print(
                    f"taking over the lock of {workdir} from {describe(holder)}: {why}",
                    flush=True,
                )
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(mine, f)
            f.flush()
            os.fsync(f.fileno())
        return mine
    raise WorkdirLocked(f"workdir {workdir}: could not take its lock {path}; try again")


def _take_over(path: str, holder: dict[str, Any]) -> bool:
    """Removes the stale lock of `holder` unless another run replaced it meanwhile:
    renamed aside first, so that only one of two runs taking it over removes it."""
    aside = f"{path}.stale.{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    moved = _read(aside)
    if moved is not None and moved[0] != holder:  # a fresh lock: put it back
        with contextlib.suppress(OSError):
            os.link(aside, path)
        os.remove(aside)
        return False
    os.remove(aside)
    return True


def release(workdir: str, mine: dict[str, Any]) -> None:
    """Removes the lock if it is still this process's (not one that took it over)."""
    path = os.path.join(workdir, NAME)
    found = _read(path)
    if found is not None and found[0] == json.loads(json.dumps(mine)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


@contextlib.contextmanager
def held(workdir: str, lead: bool = True, stale_after: float = STALE_SECONDS) -> Iterator[None]:
    """Holds the lock of `workdir` (on the lead process; others do nothing) and beats its
    heart until the block ends.

    Raises:
        WorkdirLocked: a live run holds it.
    """
    refused: WorkdirLocked | None = None
    mine = None
    if lead:
        os.makedirs(workdir, exist_ok=True)
        try:
            mine = acquire(workdir, stale_after)
        except WorkdirLocked as e:
            refused = e
    if jax.process_count() > 1:  # every process stops when the lead was refused
        ok = multihost_utils.broadcast_one_to_all(np.int32(refused is None))
        if not ok and refused is None:
            refused = WorkdirLocked(f"workdir {workdir} is in use by another run (see process 0)")
    if refused is not None:
        raise refused
    if mine is None:
        yield
        return
    stop = threading.Event()
    path = os.path.join(workdir, NAME)

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):
                os.utime(path)

    thread = threading.Thread(target=beat, name="workdir-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        release(workdir, mine)
