"""The workdir lock is a lease with an owner (issue 62): of the runs racing for one stale
lock exactly one takes it, a heartbeat never overwrites another run's lock (the run
whose lock was taken over stops with its own status), and an empty lock goes stale by
the store's clock. On a local disk; tests/test_object_store.py has the same on GCS."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from vit_jax.base import exits
from vit_jax.workdir import lock

GONE = {"host": "elsewhere", "pid": 1, "process_start": "1", "started": "then"}


def race(workdir: str, runs: int, monkeypatch, hook) -> list:
    """`runs` runs (threads, each a host of its own: racer-i) take the stale lock of
    `workdir` in the bad interleaving: every one has judged it stale and reached the step
    that removes it before any removes it; then they go on one at a time, in order.
    `hook(at_removal)` patches the calls that can remove the lock to call `at_removal()`
    first. Returns what each acquire returned or raised."""
    barrier, turns = threading.Barrier(runs), [threading.Event() for _ in range(runs)]
    reached, results = set(), [None] * runs
    real_holder = lock.holder_now

    def at_removal() -> None:
        me = threading.current_thread().name
        if me.startswith("racer-") and me not in reached:
            reached.add(me)
            barrier.wait(timeout=30)
            turns[int(me.split("-")[1])].wait(timeout=30)

    hook(at_removal)
    monkeypatch.setattr(
        lock, "holder_now", lambda: dict(real_holder(), host=threading.current_thread().name)
    )

    def run(i: int) -> None:
        try:
            results[i] = lock.acquire(workdir)
        except lock.WorkdirLocked as e:
            results[i] = e
        finally:
            turns[(i + 1) % runs].set()

    threads = [threading.Thread(target=run, args=(i,), name=f"racer-{i}") for i in range(runs)]
    for t in threads:
        t.start()
    turns[0].set()  # racer-0 goes first, once every run is at the removal (the barrier)
    for t in threads:
        t.join(timeout=60)
    return results


@pytest.mark.parametrize("runs", [2, 3])
def test_runs_racing_for_one_stale_lock_on_a_disk_exactly_one_holds_it(
    tmp_path, monkeypatch, capsys, runs
):
    workdir = str(tmp_path)
    path = tmp_path / lock.NAME
    path.write_text(json.dumps(dict(GONE, beat_at=time.time() - 2 * lock.STALE_SECONDS)))

    def hook(at_removal) -> None:
        for name in ("rename", "unlink", "remove"):  # a rename aside, or a removal
            real = getattr(os, name)

            def hooked(p, *args, real=real, **kwargs):
                if os.fspath(p) == str(path):
                    at_removal()
                return real(p, *args, **kwargs)

            monkeypatch.setattr(os, name, hooked)

    results = race(workdir, runs, monkeypatch, hook)
    monkeypatch.undo()
    assert_one_holds(results, json.loads(path.read_text()), capsys)
    assert os.listdir(workdir) == [lock.NAME]  # nothing moved aside is left


def assert_one_holds(results: list, found: dict, capsys) -> None:
    """racer-0 holds the lock (it is `found`); every other run was refused, naming it."""
    holders = [r for r in results if isinstance(r, dict)]
    assert [r["host"] for r in holders] == ["racer-0"], results
    assert found == holders[0]
    refused = [str(r) for r in results[1:]]
    assert all(f"is in use by another run (host racer-0 pid {os.getpid()}" in r for r in refused)
    assert capsys.readouterr().out.count("taking over the lock") == 1


def test_a_heartbeat_never_overwrites_a_lock_taken_over_it_says_so(tmp_path):
    mine = lock.acquire(tmp_path)
    path = tmp_path / lock.NAME
    lock.beat(path, mine)  # its own: rewritten with the time now
    assert json.loads(path.read_text())["beat_at"] > mine["beat_at"]
    other = json.dumps(dict(GONE, host="other", beat_at=time.time())).encode()
    path.unlink()
    path.write_bytes(other)  # another run took it over
    with pytest.raises(lock.LockLost, match=f"the lock {path} was taken over by another run"):
        lock.beat(path, mine)
    assert path.read_bytes() == other
    lock.release(tmp_path, mine)
    assert path.read_bytes() == other  # not this run's to remove


def test_a_run_whose_lock_is_taken_over_stops_with_its_own_status(tmp_path):
    """The heartbeat finds another run's lock: one `error:` line, exit LOCK_LOST (not
    75), and that run's lock stays as it wrote it."""
    child = textwrap.dedent(f"""
        import time
        from vit_jax.workdir import lock
        lock.HEARTBEAT_SECONDS = 0.1
        with lock.held({str(tmp_path)!r}):
            print("holding", flush=True)
            time.sleep(30)
        """)
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "holding\n"
    path = tmp_path / lock.NAME
    other = json.dumps(dict(GONE, host="other", beat_at=time.time())).encode()
    path.unlink()
    path.write_bytes(other)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == exits.LOCK_LOST != 75
    assert err.startswith(f"error: the lock {path} was taken over by another run (host other")
    assert err.count("\n") == 1
    assert path.read_bytes() == other


def test_an_empty_lock_ages_by_the_files_modification_time(tmp_path, capsys):
    path = tmp_path / lock.NAME
    path.write_bytes(b"")  # a run died between the exclusive create and the write
    with pytest.raises(lock.WorkdirLocked, match="heartbeat 0s ago"):
        lock.acquire(tmp_path, stale_after=60.0)  # just written: it may be a run starting
    then = time.time() - 120
    os.utime(path, (then, then))
    mine = lock.acquire(tmp_path, stale_after=60.0)
    assert json.loads(path.read_text()) == mine
    out = capsys.readouterr().out
    assert "taking over the lock" in out and "its heartbeat stopped 2m0" in out


PAIR = """
import sys, time
import jax
from ml_collections import ConfigDict
from vit_jax.parallel import distributed
from vit_jax.workdir import lock
lock.HEARTBEAT_SECONDS = 0.2
me = int(sys.argv[1])
jax.distributed.initialize("{address}", 2, me, heartbeat_timeout_seconds=60)
with lock.held({workdir!r}, lead=me == 0):
    with distributed.peers_watched(ConfigDict(dict(peer_timeout_seconds=8.0))):
        print("holding", flush=True)
        time.sleep(60)
"""


@pytest.mark.slow
def test_a_lock_taken_over_stops_every_process_of_a_run_with_its_status(tmp_path):
    """Process 0 holds the lock for a two-process run; another run takes it over. Both
    processes stop with LOCK_LOST, not 75 (a rerun would be refused), each with one line:
    process 0 the lock's, process 1 that process 0 found it taken over."""
    from test_multihost import free_port

    code = PAIR.format(address=f"127.0.0.1:{free_port()}", workdir=str(tmp_path))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        for r in runs:  # after Gloo's own lines
            assert "holding\n" in iter(r.stdout.readline, ""), r.communicate(timeout=60)
        path = tmp_path / lock.NAME
        other = json.dumps(dict(GONE, host="other", beat_at=time.time())).encode()
        path.unlink()
        path.write_bytes(other)
        start = time.monotonic()
        errs = [r.communicate(timeout=90)[1] for r in runs]
    finally:
        for r in runs:
            r.kill()
    lines = [[line for line in err.splitlines() if line.startswith("error:")] for err in errs]
    assert [r.returncode for r in runs] == [exits.LOCK_LOST] * 2, errs
    assert len(lines[0]) == 1 and lines[0][0].startswith(f"error: the lock {path} was taken over")
    assert lines[1] == [
        "error: process 0 of 2 found the workdir's lock taken over by another run: this run "
        "stopped and saved nothing more; its last complete checkpoint stands"
    ], errs
    assert time.monotonic() - start < 30, errs  # one beat of process 1's watcher (2 s)
    assert path.read_bytes() == other
