"""One run per workdir: the lead process holds `workdir/run.lock` while it trains.

The lock is a JSON object created only where none is (`store.create_new`: O_EXCL on a
disk, the store's own precondition on gs:// and s3://), naming the holder: host, pid,
the process's own start time (to tell a reused pid apart), when the run started, and a
heartbeat time that a thread rewrites every HEARTBEAT_SECONDS. It is removed when the
run ends, whatever the end. A second run finds it and stops with one message naming
the holder, having touched nothing; a lock that names this very process (host, pid and
process start: `IDENTITY`) is its own, as when the store acted on its create but the
answer was lost. A lock is stale, and taken over with a note, when
its process is gone (same host: no such pid, or one started at another time) or its
heartbeat is older than `stale_after` (any host: a killed machine, another pod). A run
riding out a store's outage beats late by up to the retry window, so `stale_after` is
the window plus three beats (`stale_seconds`); a run that gave up on the store left a
lock it could not remove, and a requeue finding a heartbeat that has missed two beats
waits for it to go stale rather than be refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from vit_jax.base import store
from vit_jax.base.console import duration, every

NAME = "run.lock"
IDENTITY = ("host", "pid", "process_start")  # the same in a lock: this very process
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0  # ten missed heartbeats


def stale_seconds(retry_seconds: float) -> float:
    """How old a heartbeat is when its run is surely gone: the store's retry window (a
    live run may be riding out an outage that long) plus three beats."""
    return retry_seconds + 3 * HEARTBEAT_SECONDS


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
        "beat_at": now,
    }


def describe(holder: dict[str, Any]) -> str:
    """'host n1 pid 4242, started 2026-11-24 00:21:47 UTC'."""
    return f"host {holder.get('host')} pid {holder.get('pid')}, started {holder.get('started')}"


def stale_reason(holder: dict[str, Any], stale_after: float) -> str | None:
    """Why the lock of `holder` is stale; None if it is not."""
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int):
        start = _process_start(pid)
        gone = not _exists(pid) or holder.get("process_start") not in (None, start)
        if gone:
            return "its process no longer exists"
    age = time.time() - float(holder.get("beat_at", 0) or 0)
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


def ours(holder: dict[str, Any], mine: dict[str, Any]) -> bool:
    """Whether the lock of `holder` is this very process's (`IDENTITY`)."""
    return all(holder.get(k) == mine[k] for k in IDENTITY)


def _read(path: store.Path, via: store.Store) -> dict[str, Any] | None:
    """The holder, or None when there is no lock (one half-written reads as a holder of
    unknown name, just now)."""
    try:
        text = via.read_text(path)
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = None
    return holder if isinstance(holder, dict) else {"beat_at": time.time()}


def acquire(
    workdir: str | os.PathLike, stale_after: float = STALE_SECONDS, via: store.Store = store.PLAIN
) -> dict[str, Any]:
    """Takes the lock of `workdir` for this process; returns what it wrote. A stale lock
    is taken over, with a note on stdout; one of this very process (a create whose
    answer came late) is its own.

    Raises:
        WorkdirLocked: a live run holds it (nothing was written).
    """
    path = store.path(workdir) / NAME
    mine = holder_now()
    for _ in range(3):  # lost a race for a stale lock: look again
        if via.create_new(path, json.dumps(mine).encode()):
            return mine
        holder = _read(path, via)
        if holder is not None and ours(holder, mine):
            via.write_text(path, json.dumps(mine))
            return mine
        if holder is not None:
            holder = _wait_if_silent(path, holder, stale_after, via)
        if holder is None:
            continue  # released meanwhile
        why = stale_reason(holder, stale_after)
        if why is None:
            age = duration(time.time() - float(holder.get("beat_at", 0) or 0))
            raise WorkdirLocked(
                f"workdir {workdir} is in use by another run ({describe(holder)}; "
                f"lock {path}, heartbeat {age} ago). Wait for it to end, stop it, or "
                f"choose another workdir; if that run is gone, delete {path} (a lock "
                f"whose heartbeat has been silent for {duration(stale_after)} is taken over)"
            )
        if _read(path, via) == holder:  # not replaced meanwhile by another run taking it over
            via.remove(path)
            print(f"taking over the lock of {workdir} from {describe(holder)}: {why}", flush=True)
    raise WorkdirLocked(f"workdir {workdir}: could not take its lock {path}; try again")


def _wait_if_silent(
    path: store.Path, holder: dict[str, Any], stale_after: float, via: store.Store
) -> Any:
    """A holder whose heartbeat missed two beats (likely a run that gave up on the store)
    is watched until it beats again or goes stale; returns it as last read (None: the
    lock was removed meanwhile)."""
    age = time.time() - float(holder.get("beat_at", 0) or 0)
    if not 2 * HEARTBEAT_SECONDS < age < stale_after or stale_reason(holder, stale_after):
        return holder
    wait = duration(stale_after - age)
    print(
        f"the lock {path} ({describe(holder)}) missed its heartbeats for {duration(age)}: "
        f"waiting up to {wait} for it to beat again",
        flush=True,
    )
    while (now := _read(path, via)) == holder and stale_reason(holder, stale_after) is None:
        time.sleep(min(5.0, HEARTBEAT_SECONDS / 3))
    return now


def release(
    workdir: str | os.PathLike, mine: dict[str, Any], via: store.Store = store.PLAIN
) -> None:
    """Removes the lock if it is still this process's (not one that took it over)."""
    path = store.path(workdir) / NAME
    found = _read(path, via)
    if found is not None and ours(found, mine):
        via.remove(path)


@contextlib.contextmanager
def held(
    workdir: str | os.PathLike,
    lead: bool = True,
    stale_after: float = STALE_SECONDS,
    via: store.Store = store.PLAIN,
) -> Iterator[None]:
    """Holds the lock of `workdir` (on the lead process; others do nothing) and beats its
    heart until the block ends; `via`: the workdir's store (its retries).

    Raises:
        WorkdirLocked: a live run holds it.
    """
    refused: WorkdirLocked | None = None
    mine = None
    if lead:
        via.makedirs(workdir)
        try:
            mine = acquire(workdir, stale_after, via)
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
    path = store.path(workdir) / NAME

    def beat() -> None:
        with contextlib.suppress(Exception):  # the window stops the run if it must
            via.write_text(path, json.dumps({**mine, "beat_at": time.time()}))

    try:
        with every(HEARTBEAT_SECONDS, beat, "vit_jax-lock-heartbeat"):
            yield
    finally:
        release(workdir, mine, via)
