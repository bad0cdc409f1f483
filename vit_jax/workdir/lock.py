"""One run per workdir: the lead process holds `workdir/run.lock` while it trains.

The lock is a lease with an owner: a JSON object created only where none is
(`store.create_new`: O_EXCL on a disk, the store's own precondition on gs:// and s3://),
naming the holder: host, pid, the process's own start time (to tell a reused pid apart),
when the run started, and a heartbeat time that a thread rewrites every
HEARTBEAT_SECONDS. It is removed when the run ends, whatever the end. A second run finds
it and stops with one message naming the holder, having touched nothing; a lock that
names this very process (host, pid and process start: `IDENTITY`) is its own, as when
the store acted on its create but the answer was lost. A lock is stale, and taken over
with a note, when its process is gone (same host: no such pid, or one started at another
time) or its heartbeat is older than `stale_after` (any host: a killed machine, another
pod); an empty or half-written one ages by the store's own clock (the object's `updated`
time, the file's mtime). A run riding out a store's outage beats late by up to the retry
window, so `stale_after` is the window plus three beats (`stale_seconds`); a requeue
finding a heartbeat that has missed two beats (a run that gave up on the store) waits
for it to go stale rather than be refused.

Each change is conditional on the version last read (`_look`: the object's generation
on gs://, the file's inode, mtime and bytes on a disk). A takeover removes that version
only (`_take`: a delete with ifGenerationMatch; on a disk a rename to a name of its own,
a lock taken over meanwhile put back with a link that replaces nothing): of the runs
racing for one stale lock one takes it, the others are refused. A heartbeat rewrites
only this run's lock (`beat`); a run whose lock was taken over stops at once with one
`error:` line and status `exits.LOCK_LOST`, saving nothing more.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from vit_jax.base import exits, outage, store
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


class LockLost(WorkdirLocked):
    """This run's lock was taken over by another run (`beat`); str() names it."""


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
        if not _exists(pid) or holder.get("process_start") not in (None, start):
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


def _stat(path: store.Path) -> tuple[bytes, Any, float]:
    """The bytes of the lock, its version and when the store last wrote it (its clock)."""
    if not store.is_remote(path):
        with open(path, "rb") as f:
            st, data = os.fstat(f.fileno()), f.read()
        return data, (st.st_ino, st.st_mtime_ns, data), st.st_mtime
    fs = store.filesystem(path)
    fs.invalidate_cache(os.fspath(path))
    meta = fs.info(os.fspath(path))
    written = datetime.datetime.fromisoformat(meta["updated"]).timestamp()
    return fs.cat_file(os.fspath(path)), meta["generation"], written


def _if_generation(path: store.Path, version: Any, data: bytes | None, via: store.Store) -> bool:
    """Deletes the object `path` (`data` None) or writes `data` there if its generation
    is still `version` (GCS's ifGenerationMatch); False if it is another (412) or gone."""
    from fsspec.asyn import sync

    fs = store.filesystem(path)
    bucket, key, _ = fs.split_path(os.fspath(path))
    url = f"{fs._location}/upload/storage/v1/b/{bucket}/o"
    call = ("DELETE", "b/{}/o/{}", bucket, key) if data is None else ("POST", url)
    kw = {} if data is None else {"uploadType": "media", "name": key, "data": data}
    try:
        call_it = lambda: sync(fs.loop, fs._call, *call, ifGenerationMatch=version, **kw)  # noqa: E731
        via.retried(call_it, f"writing {path}")
    except (FileNotFoundError, FileExistsError):
        return False
    finally:
        fs.invalidate_cache(os.fspath(path))
    return True


def _look(path: store.Path, via: store.Store) -> tuple[dict[str, Any], Any] | None:
    """The holder and the lock's version, or None when there is no lock (an empty or
    half-written one: a holder of unknown name that beat when the store last wrote it)."""
    try:
        data, version, written = via.retried(lambda: _stat(path), f"reading {path}")
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(data)
    except ValueError:
        holder = None
    return (holder if isinstance(holder, dict) else {"beat_at": written}), version


def _take(path: store.Path, version: Any, via: store.Store) -> bool:
    """Removes the lock at `path` if it is still `version`, in one atomic step; False if
    it is not (another run took it over first, or it beat meanwhile)."""
    if store.is_remote(path):
        return _if_generation(path, version, None, via)
    aside = path.with_name(f"{NAME}.{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)  # of any number of runs, one moves this file
    except FileNotFoundError:
        return False
    try:
        if _stat(aside)[1] == version:
            return True
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)  # another version (a run's live lock): put back
        return False
    finally:
        os.unlink(aside)


def _rewrite(path: store.Path, version: Any, text: str, via: store.Store) -> bool:
    """Writes `text` into the lock if it is still `version`; False if it is not."""
    if store.is_remote(path):
        return _if_generation(path, version, text.encode(), via)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        st, data = os.fstat(fd), os.read(fd, 1 << 20)
        if (st.st_ino, st.st_mtime_ns, data) != version:
            return False
        os.ftruncate(fd, os.pwrite(fd, text.encode(), 0))  # the file verified, whatever its name
        with contextlib.suppress(FileNotFoundError):
            return os.stat(path).st_ino == st.st_ino  # not moved aside meanwhile
        return False
    finally:
        os.close(fd)


def beat(path: store.Path, mine: dict[str, Any], via: store.Store = store.PLAIN) -> None:
    """Rewrites this run's lock with the time now, never another run's (LockLost)."""
    text, holder = json.dumps({**mine, "beat_at": time.time()}), None
    for _ in range(3):  # a version changed under the rewrite: look again
        found = _look(path, via)
        if found is None:  # moved aside a moment, or removed as stale: make it again
            if via.create_new(path, text.encode()):
                return
            continue
        holder = found[0]
        if not ours(holder, mine):
            break
        if _rewrite(path, found[1], text, via):
            return
    raise LockLost(
        f"the lock {path} was taken over by another run ({describe(holder or {})}): this "
        f"run stopped and saved nothing more; its last complete checkpoint stands"
    )


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
        found = _look(path, via)
        if found is not None and ours(found[0], mine):
            _rewrite(path, found[1], json.dumps(mine), via)
            return mine
        if found is not None:
            found = _wait_if_silent(path, found, stale_after, via)
        if found is None:
            continue  # released meanwhile
        holder, version = found
        why = stale_reason(holder, stale_after)
        if why is None:
            age = duration(time.time() - float(holder.get("beat_at", 0) or 0))
            raise WorkdirLocked(
                f"workdir {workdir} is in use by another run ({describe(holder)}; "
                f"lock {path}, heartbeat {age} ago). Wait for it to end, stop it, or "
                f"choose another workdir; if that run is gone, delete {path} (a lock "
                f"whose heartbeat has been silent for {duration(stale_after)} is taken over)"
            )
        if _take(path, version, via) and via.create_new(path, json.dumps(mine).encode()):
            print(f"taking over the lock of {workdir} from {describe(holder)}: {why}", flush=True)
            return mine
    raise WorkdirLocked(f"workdir {workdir}: could not take its lock {path}; try again")


def _wait_if_silent(path: store.Path, found: tuple, stale_after: float, via: store.Store) -> Any:
    """A holder whose heartbeat missed two beats (likely a run that gave up on the store)
    is watched until it beats again or goes stale; returns the lock as last read (`_look`;
    None: removed meanwhile)."""
    holder = found[0]
    age = time.time() - float(holder.get("beat_at", 0) or 0)
    if not 2 * HEARTBEAT_SECONDS < age < stale_after or stale_reason(holder, stale_after):
        return found
    print(
        f"the lock {path} ({describe(holder)}) missed its heartbeats for {duration(age)}: "
        f"waiting up to {duration(stale_after - age)} for it to beat again",
        flush=True,
    )
    while (now := _look(path, via)) == found and stale_reason(holder, stale_after) is None:
        time.sleep(min(5.0, HEARTBEAT_SECONDS / 3))
    return now


def release(
    workdir: str | os.PathLike, mine: dict[str, Any], via: store.Store = store.PLAIN
) -> None:
    """Removes the lock if it is still this process's (not one that took it over)."""
    path = store.path(workdir) / NAME
    found = _look(path, via)
    if found is not None and ours(found[0], mine):
        _take(path, found[1], via)


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

    def heartbeat() -> None:
        try:
            beat(path, mine, via)
        except Exception as e:  # noqa: BLE001 (the store's: the window stops the run if it must)
            if isinstance(e, LockLost):  # another run holds the workdir: save nothing more
                outage.give_up(str(e), status=exits.LOCK_LOST)  # the other processes too

    try:
        with every(HEARTBEAT_SECONDS, heartbeat, "vit_jax-lock-heartbeat"):
            yield
    finally:
        release(workdir, mine, via)
