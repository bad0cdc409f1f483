"""A store that stops answering: one retry window for the whole run.

Buckets have bad minutes: refused or reset connections, timeouts, 408, 429, 5xx. A run
on gs:// or s3:// rides them out for `store.retry_seconds` (default 120) counted from
the first failure, one window for the run rather than one per call. The run's workdir
(`Workdir.open`) creates its Window and hands it to its store (`store.Store`), whose
every operation retries through it and says what success on a retry means; while the
run holds the workdir, `watching` probes the store every PROBE_SECONDS (one small read
by TensorStore, Orbax's own client, allowed one retry), so that the waits the run cannot
retry itself (Orbax's saves, TensorStore's reads, which retry by count for ~15 minutes)
are bounded by the window too.

The first failure prints one notice, the store's return another. When the window has
passed the run stops at once, from whichever thread saw it (`give_up`): one `error:`
line naming the URL, how long the store did not answer and its last words, and exit
status 75 (EX_TEMPFAIL: run it again). Nothing waits on the way out: the save in flight
is never resumed from (it has no commit marker) and the lock goes stale (lock.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from vit_jax.base import exits, failures
from vit_jax.base.console import every

EX_TEMPFAIL = 75
PROBE_SECONDS = 5.0


def give_up(message: str, together: bool = True, status: int = EX_TEMPFAIL) -> None:
    """Ends the process at once with `error: message` and `status` (75; a workdir's lock
    taken over: exits.LOCK_LOST): Orbax's and TensorStore's threads may be waiting on the
    store, and nothing may wait for them. The other processes follow with that status.
    `together=False`: a process is lost (parallel/distributed.py), nobody to wait for."""
    exits.leaving.set(status)
    try:  # whatever a write or the others do, the process ends
        sys.stdout.flush()
        print(f"error: {message}", file=sys.stderr, flush=True)
        if together:
            _with_the_others(status)
    finally:
        os._exit(status)


def _with_the_others(status: int, seconds: float = 60.0) -> None:
    """With several processes, waits (at most `seconds`) until every one has given up,
    then leaves JAX's coordination service together (its shutdown barrier), so that all
    end with `status`: the first to end would otherwise make the service abort the others
    (SIGABRT) before their own windows pass. The service is not the store: it answers."""
    try:
        from jax._src import distributed  # Orbax reaches the client the same way

        state = distributed.global_state
        if state.client is None or state.num_processes <= 1:
            return
        state.client.key_value_set(f"vit_jax/gave_up/{state.process_id}", str(status))
        deadline = time.monotonic() + seconds
        for i in range(state.num_processes):
            left = max(1, int(1000 * (deadline - time.monotonic())))
            state.client.blocking_key_value_get(f"vit_jax/gave_up/{i}", left)
        state.shutdown()  # every process is here: a clean leave, nobody aborted
    except Exception:  # noqa: BLE001 (whatever the service says, this process ends with 75)
        return


class Window:
    """The retry window of a run's store at `url`: `seconds` from the first failure of an
    outage; `stop` is called with the error line once it has passed (`give_up`, or a
    test's)."""

    def __init__(
        self, url: str | os.PathLike, seconds: float, stop: Callable[[str], Any] = give_up
    ):
        self.url, self.seconds, self.stop = os.fspath(url), float(seconds), stop
        self.since: float | None = None  # the first failure of the outage under way
        self.cause = ""
        self._lock = threading.Lock()
        self._kv: Any = None  # the probe's store, opened once

    def failed(self, error: BaseException | str) -> None:
        """A transient failure: notes the outage, and stops the run once it has lasted."""
        with self._lock:
            now = time.monotonic()
            self.cause = " ".join(str(error).split())[:200] or type(error).__name__
            if self.since is None:
                self.since = now
                silent = f"the store at {self.url} did not answer ({self.cause})"
                print(f"{silent}; retrying for up to {self.seconds:g} s", flush=True)
            lasted = now - self.since
        if lasted >= self.seconds:
            self.stop(
                f"the store at {self.url} did not answer for {lasted:.0f} s (store.retry_"
                f"seconds={self.seconds:g}); last: {self.cause}. Once it answers, run the same "
                f"command: it resumes from the newest complete checkpoint (exit status 75)"
            )

    def answered(self) -> None:
        """An operation (any thread's) or the probe got an answer: the outage, if any, is
        over, and the next failure opens a new window."""
        with self._lock:
            if self.since is not None:
                lasted = time.monotonic() - self.since
                print(f"the store answers again, after {lasted:.0f} s", flush=True)
            self.since = None

    def probe(self) -> None:
        """One small read of the store; a transient failure counts towards the window."""
        try:
            self._kv = self._kv or _kvstore(self.url)
            self._kv.read(".vit_jax_probe").result()  # a key that is not there
        except Exception as e:  # noqa: BLE001 (permanent ones are the operations' to name)
            if failures.transient(e):
                self.failed(e)
            return
        self.answered()


@contextlib.contextmanager
def watching(window: Window) -> Iterator[None]:
    """Probes the store of `window` every PROBE_SECONDS while the block runs. An error out
    of the block while an outage is under way (one that escaped the retries: Orbax's,
    TensorStore's) stops the run as the window's end does."""
    with every(PROBE_SECONDS, window.probe, "vit_jax-store-probe"):
        try:
            yield
        except BaseException as e:
            if window.since is not None and failures.transient(e):
                window.stop(
                    f"the store at {window.url} did not answer: {window.cause or e}. Once it "
                    "answers, run the same command (exit status 75)"
                )
            raise


def _kvstore(url: str) -> Any:
    """TensorStore's key-value store at `url` (gs://, s3://), allowed one retry a read."""
    import tensorstore as ts

    scheme = url.split("://", 1)[0]
    retries = {"max_retries": 1, "initial_delay": "0.5s", "max_delay": "1s"}
    context = ts.Context({f"{'gcs' if scheme == 'gs' else scheme}_request_retries": retries})
    return ts.KvStore.open(url.rstrip("/") + "/", context=context).result()
