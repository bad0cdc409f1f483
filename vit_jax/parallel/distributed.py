"""Multi-host runs on JAX's distributed runtime, and host copies of global arrays.

One process per host (or per accelerator group) runs the same program. Process 0
also hosts the coordinator that the others connect to. `initialize` joins them from
`config.distributed`:

    coordinator_address  'host:port' of process 0 ('' = not set)
    num_processes        number of processes (0 = not set)
    process_id           this process, 0 .. num_processes - 1 (-1 = not set)
    auto                 let JAX detect what is not set (Slurm, Open MPI, Cloud TPU,
                         Kubernetes, or the JAX_COORDINATOR_ADDRESS variable)
    timeout_seconds      how long to wait for every process to join
    peer_timeout_seconds how long a process may go without a heartbeat before the
                         others count it lost and stop with exit status 75 (`peers_watched`)

Nothing set and `auto` off: a single process. After `initialize`, `jax.devices()` is
every process's devices and `jax.local_devices()` this process's; each process feeds
its share of every batch (`vit_jax.data.train_iterator` with process_index /
process_count) and all of them take part in each Orbax save and restore.
On CPU the processes exchange data with Gloo (JAX's default CPU collectives).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax._src import distributed as jax_distributed  # its client, as Orbax reaches it
from jax.experimental import multihost_utils

from vit_jax.base import exits, outage
from vit_jax.base.outage import EX_TEMPFAIL

try:
    from vit_jax.parallel import _abort  # SIGABRT judged without Python (_abort.c)
except ImportError:  # not compiled (no C compiler at install): JAX's abort as it is
    _abort = None


def wanted(cfg: Any) -> bool:
    """Whether `cfg` (config.distributed) asks for a multi-process run."""
    return bool(cfg.coordinator_address or cfg.auto or cfg.num_processes > 1)


def initialize(cfg: Any) -> None:
    """Joins this process to the others of the run, as `cfg` (config.distributed) says.

    Call it before anything else uses jax (before any device or array exists). Does
    nothing for a single-process run.

    Raises:
        ValueError: explicit settings that cannot work (a process count without a
            coordinator, a process id outside [0, num_processes)).
        RuntimeError: the processes did not all join within cfg.timeout_seconds.
    """
    if not wanted(cfg):
        return
    if not cfg.auto and not (cfg.coordinator_address and cfg.num_processes and cfg.process_id >= 0):
        raise ValueError(
            "config.distributed: set all of coordinator_address ('host:port' of process 0), "
            "num_processes and process_id, or set auto=True to detect them (Slurm, Open MPI, "
            f"Cloud TPU, Kubernetes); got {dict(cfg)}"
        )
    if cfg.process_id < -1 or (cfg.num_processes and cfg.process_id >= cfg.num_processes):
        raise ValueError(
            f"config.distributed.process_id={cfg.process_id} is not in "
            f"[0, num_processes={cfg.num_processes}): number the processes 0, 1, ..."
        )
    try:
        jax.distributed.initialize(
            coordinator_address=cfg.coordinator_address or None,
            num_processes=cfg.num_processes or None,
            process_id=cfg.process_id if cfg.process_id >= 0 else None,
            initialization_timeout=cfg.timeout_seconds,
            # JAX's own verdict (an abort, a crash dump) comes later than `peers_watched`'s.
            heartbeat_timeout_seconds=math.ceil(cfg.peer_timeout_seconds) + 30,
        )
    except (ValueError, RuntimeError) as e:
        raise RuntimeError(
            f"joining the run failed with config.distributed={dict(cfg)}: {e}. Start every "
            "process with the same coordinator_address (process 0's host:port, reachable from "
            "the others) and num_processes, and a different process_id"
        ) from e
    print(
        f"process {jax.process_index()} of {jax.process_count()}: "
        f"{jax.local_device_count()} of {jax.device_count()} devices",
        flush=True,
    )


@contextlib.contextmanager
def peers_watched(cfg: Any) -> Iterator[None]:
    """While the block runs, each process bumps its key in JAX's coordination service every
    few seconds and reads the others'. A process whose key stood still for
    cfg.peer_timeout_seconds (killed, frozen, its host gone) ends this one at once with one
    `error:` line and status 75, before JAX's own heartbeat timeout would abort it with a
    crash dump; so does one that gave up on the store (`outage.give_up`). A collective that
    failed on a lost peer (Gloo's 'Connection closed by peer') waits for that verdict.

    A SIGABRT meanwhile is judged by `_judge` (in C, _abort.c, no Python in the abort):
    JAX aborts at once when the coordinator stops answering or reports a peer lost (75),
    and so do XLA's CHECKs, a corrupt heap or std::terminate (a crash: the abort's own
    status). Without the compiled module JAX's abort is left as it is."""
    n, me, client = jax.process_count(), jax.process_index(), jax_distributed.global_state.client
    if n == 1 or client is None:
        yield
        return
    done, beat = threading.Event(), min(5.0, cfg.peer_timeout_seconds / 4)
    judging = 3 * beat + 5  # at most: a 2 s probe and 2.5 beats, in a thread of its own
    waits = judging * (2 if me == 0 else 1)  # process 0 then serves the others' judging
    if _abort is not None:
        client.key_value_set(f"vit_jax/beat/{me}", "0", allow_overwrite=True)  # `_judge` reads
        crash = f"error: process {me} of {n} crashed (SIGABRT), {CRASH}\n"
        unjudged = f"error: process {me} of {n} aborted (SIGABRT), {UNJUDGED}\n"
        _abort.install(crash.encode(), unjudged.encode(), waits)
        args = (client, n, me, beat, judging, done)
        threading.Thread(target=_judging, args=args, name="vit_jax-abort", daemon=True).start()
    args = (client, n, me, cfg.peer_timeout_seconds, beat, done)
    threading.Thread(target=_watch, args=args, name="vit_jax-peers", daemon=True).start()
    try:
        yield
    except Exception as e:
        if isinstance(e, jax.errors.JaxRuntimeError) or "Gloo" in str(e):
            done.wait(cfg.peer_timeout_seconds + 30)  # `_watch` ends the process meanwhile
        raise
    finally:
        if _abort is not None and _abort.pending():  # the abort ends the process
            time.sleep(waits + 1)
        done.set()
        if _abort is not None:
            _abort.uninstall()
        with contextlib.suppress(Exception):  # ended: not lost when it leaves before the others
            client.key_value_set(f"vit_jax/beat/{me}", "ended", allow_overwrite=True)


RERUN = "run the same command on every host: it resumes from the newest complete checkpoint"
CRASH = (
    "not a lost process or a preemption: a rerun would crash again; the details are above "
    "(run with python -u to be sure to see them all)"
)
LOCK_LOST = (
    "found the workdir's lock taken over by another run: this run stopped and saved nothing "
    "more; its last complete checkpoint stands"
)
UNJUDGED = (
    "and the coordination service did not answer in time to tell a crash (above) from a "
    f"lost process 0; if it was lost, {RERUN}"
)


def _left(key: str, value: str) -> bool:
    """A key left still on purpose, not a lost process: one that ended, or process 0's
    while it waits for the others to judge (any other process that judged is gone)."""
    return value == "ended" or (value == "judged" and key == "vit_jax/beat/0")


def _judging(client: Any, n: int, me: int, beat: float, judging: float, done: Any) -> None:
    while not done.wait(0.1):
        if _abort.pending():  # the process ends in the abort
            return _judge(client, n, me, beat, judging)


def _judge(client: Any, n: int, me: int, beat: float, judging: float) -> None:
    """An abort waits (`_abort.pending`): a lost peer if the coordination service does not
    answer a bounded read (process 0 gone or frozen) or another process's key stands still
    for 2.5 beats, while this one goes on beating (a crash on every process at once is
    each one's own); else a crash. JAX's client offers no Python hook for its own verdict
    (missed_heartbeat_callback cannot take one: std::bad_cast), nor a reason for its abort."""
    line = "error: lost {}: JAX's distributed runtime stopped this process; "
    line += f"{RERUN} (exit status 75)\n"
    try:
        client.blocking_key_value_get(f"vit_jax/beat/{me}", 2000)  # set in peers_watched
        before = dict(client.key_value_dir_get("vit_jax/beat/"))
        for t in range(5):
            client.key_value_set(f"vit_jax/beat/{me}", f"judging {t}", allow_overwrite=True)
            time.sleep(beat / 2)
        after = dict(client.key_value_dir_get("vit_jax/beat/"))
    except Exception:  # noqa: BLE001 (the service, process 0's, is gone)
        lost = f"process 0 of {n} (the coordinator)" if me else "the coordination service"
    else:
        keys = [f"vit_jax/beat/{i}" for i in range(n) if i != me]
        still = [k for k in keys if before.get(k, 0) == after.get(k) and not _left(k, after[k])]
        lost = f"process {still[0].rsplit('/', 1)[1]} of {n}" if still else None
        _judged(client, me, judging)
    # the main thread says nothing more, and waits for the abort to end the process
    if lost is None:
        exits.leaving.set(128 + signal.SIGABRT)
        _abort.crashed()
    else:
        exits.leaving.set(EX_TEMPFAIL)
        _abort.lost(line.format(lost).encode())
    threading.Event().wait()


def _judged(client: Any, me: int, judging: float) -> None:
    """Says this process has judged. Process 0 holds the coordination service that the
    others' judges read: it waits (`judging` s at most) for each to judge or end, so that
    one crashing with it, or in that time, is a crash there too, not a lost process 0."""
    with contextlib.suppress(Exception):
        client.key_value_set(f"vit_jax/beat/{me}", "judged", allow_overwrite=True)
        end = time.monotonic() + judging
        while me == 0 and time.monotonic() < end:
            if all(v in ("ended", "judged") for _, v in client.key_value_dir_get("vit_jax/beat/")):
                return
            time.sleep(0.1)


def _watch(client: Any, n: int, me: int, seconds: float, beat: float, done: Any) -> None:
    seen, since, count = {}, dict.fromkeys(range(n), time.monotonic()), 0
    while not done.wait(beat):
        if exits.leaving.is_set():  # another thread ends the process, with its own line
            return
        if _abort is not None and _abort.pending():
            continue  # `_judge` has this process's key, and the verdict
        count += 1
        try:
            client.key_value_set(f"vit_jax/beat/{me}", str(count), allow_overwrite=True)
            keys = dict(client.key_value_dir_get("vit_jax/"))  # and outage.py's gave_up/
        except Exception:  # noqa: BLE001 (the service, process 0's, is gone: nothing moves)
            keys = {f"vit_jax/beat/{i}": seen.get(i) for i in range(n)}
        if done.is_set():
            return
        if gave_up := [i for i in range(n) if i != me and f"vit_jax/gave_up/{i}" in keys]:
            if keys[f"vit_jax/gave_up/{gave_up[0]}"] == str(exits.LOCK_LOST):
                outage.give_up(f"process {gave_up[0]} of {n} {LOCK_LOST}", status=exits.LOCK_LOST)
            else:
                outage.give_up(
                    f"process {gave_up[0]} of {n} gave up on the store; once it answers, {RERUN}"
                )
        now = time.monotonic()
        for i in range(n):
            if keys.get(f"vit_jax/beat/{i}") != seen.get(i):
                seen[i], since[i] = keys.get(f"vit_jax/beat/{i}"), now
        told = [int(v) for k, v in keys.items() if k.startswith("vit_jax/lost/") and v != f"{me}"]
        if lost := told or [
            i for i in range(n) if i != me and now - since[i] >= seconds and seen[i] != "ended"
        ]:
            _lost(client, n, me, lost[0], beat)
            name = f"process {lost[0]} of {n}" + (" (the coordinator)" if lost[0] == 0 else "")
            outage.give_up(
                f"lost {name}: no heartbeat for {seconds:g} s (distributed.peer_timeout_seconds); "
                f"{RERUN} (exit status 75)",
                together=False,
            )


def _lost(client: Any, n: int, me: int, lost: int, beat: float) -> None:
    """Tells the others which process this one lost, and that this one leaves (a judge
    reading the keys then names the lost one, not it). Process 0 holds the coordination
    service: it waits (two beats at most) until every other survivor has said so too,
    so that each names the lost process, not process 0, which leaves first."""
    with contextlib.suppress(Exception):
        client.key_value_set(f"vit_jax/lost/{me}", str(lost), allow_overwrite=True)
        client.key_value_set(f"vit_jax/beat/{me}", "ended", allow_overwrite=True)
        end = time.monotonic() + 2 * beat
        while me == 0 and time.monotonic() < end:
            said = dict(client.key_value_dir_get("vit_jax/lost/"))
            if len(said) >= n - len(set(said.values())):
                return
            time.sleep(0.1)


def is_lead() -> bool:
    """Whether this process writes what is written once (logs, summaries, exports)."""
    return jax.process_index() == 0


def to_host(tree: Any) -> Any:
    """Numpy copies of a tree of global arrays, whole on every process.

    Arrays split over several processes (FSDP across hosts) are gathered; every
    process must call this together. Arrays this process holds whole are just copied.
    """
    if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree)):
        return jax.tree.map(np.asarray, jax.device_get(tree))
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))
