"""Saving the TrainState with its integrity record; a save that fails stops the run with
one message.

`Saver.save` starts hashing this process's shards (`integrity.start_checksums`) and the
Orbax save together, and collects the checksums before the next train step may reuse
the buffers. Once Orbax has written every array, its background thread calls
`_write_record` (on process 0) before it completes the checkpoint (renames
`<step>.orbax-checkpoint-tmp` to `<step>`, or writes `<step>/commit_success.txt`:
`manager.commit_mode`): the record comes first, so a complete checkpoint has one.
Orbax then applies `keep_checkpoints`: an older checkpoint is deleted only after a newer
one is complete with its record. Processes other than 0 hand their checksums over in
`checkpoints/.pending/<step>.process_<i>.json`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

from vit_jax.workdir import integrity
from vit_jax.workdir import manager as manager_lib

PENDING = ".pending"
HOLD_ENV = "VIT_JAX_HOLD_BEFORE_RECORD"  # tests: a step whose record waits (to be killed)
REASONS = (
    "No space left on device",
    "Disk quota exceeded",
    "Permission denied",
    "Read-only file system",
    "Input/output error",
    "RESOURCE_EXHAUSTED",
    "PERMISSION_DENIED",
    "NOT_FOUND",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
)
WAIT_SECONDS = 600  # for the checksums of the other processes


class Saver:
    """The run's checkpoints: `save(step, state)`, `wait()`, and `manager` for restores."""

    def __init__(self, workdir: str, keep: int, description: dict[str, Any]):
        quiet_reported_failures()
        self.description = description
        self.manager = manager_lib.open_manager(workdir, keep, on_commit=self._write_record)
        self.directory = str(self.manager.directory)
        self._pool: concurrent.futures.ThreadPoolExecutor | None
        self._pool = concurrent.futures.ThreadPoolExecutor(os.cpu_count(), "vit_jax-checksums")
        self._step: int | None = None  # the save in flight, until `wait`
        self._recording = 0  # the step whose record the callback writes
        self._mine: concurrent.futures.Future = concurrent.futures.Future()

    def save(self, step: int, state: Any) -> None:
        """Saves `state` as checkpoint `step` (in the background after this returns).

        Raises:
            OSError: this save or the one before failed (see `_fail`).
        """
        self.wait()  # a failure of the previous save is named with its own step
        started = integrity.start_checksums(state, self._pool)
        self._step = self._recording = step
        self._mine = concurrent.futures.Future()
        try:
            self.manager.save(step, args=ocp.args.StandardSave(state))
        except Exception as e:  # noqa: BLE001 (any failure of a save stops the run)
            self._mine.set_exception(e)
            integrity.collect(started)  # the buffers are hashed before they are reused
            self._fail(step, e)
        arrays = integrity.collect(started)
        if jax.process_index() == 0:
            self._mine.set_result(arrays)
        else:
            os.makedirs(os.path.join(self.directory, PENDING), exist_ok=True)
            integrity.write_json(self._pending(step, jax.process_index()), arrays)

    def wait(self) -> None:
        """Waits for the save in flight to end.

        Raises:
            OSError: it failed (see `_fail`).
        """
        if self._step is None:
            return
        step, self._step = self._step, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            self._fail(step, e)

    def close(self) -> None:
        """Waits for the save in flight, then ends Orbax's threads and the hashing pool.
        A failed save is not raised here (`wait` and `save` name it); idempotent."""
        if self._pool is None:
            return
        self._step = None
        try:
            self.manager.close()  # waits for the save in flight first
        except Exception:  # noqa: BLE001 (reported by wait(), or the run's error wins)
            pass
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def __enter__(self) -> Saver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pending(self, step: int, process: int) -> str:
        return os.path.join(self.directory, PENDING, f"{step}.process_{process}.json")

    def _write_record(self) -> None:
        """Orbax's post-finalization callback (process 0, background thread): the record
        of the checkpoint whose arrays are all written, into its temporary directory."""
        step = self._recording
        tmp = os.path.join(self.directory, f"{step}{manager_lib.TMP_MARK}")
        step_dir = tmp if os.path.isdir(tmp) else os.path.join(self.directory, str(step))
        if os.environ.get(HOLD_ENV) == str(step):
            print(f"step {step}: holding before its integrity record", flush=True)
            time.sleep(3600)
        parts = [self._mine.result(timeout=WAIT_SECONDS)]
        others = [self._pending(step, i) for i in range(1, jax.process_count())]
        for path in others:
            parts.append(_wait_for_json(path))
        record = {
            "format": integrity.FORMAT,
            "step": step,
            "state": self.description,
            "process_count": jax.process_count(),
            "arrays": integrity.merge(parts),
            "files": integrity.list_files(step_dir),
        }
        integrity.write_json(os.path.join(step_dir, integrity.RECORD), record)
        for path in others:
            os.remove(path)
        if others:  # leave the checkpoints directory as Orbax left it
            with contextlib.suppress(OSError):  # not empty: a part of a later save
                os.rmdir(os.path.join(self.directory, PENDING))

    def _fail(self, step: int, error: BaseException) -> None:
        """Removes what the failed save of `step` left, then raises the run's one message.

        Raises:
            OSError: which step could not be saved and why, the newest intact checkpoint,
                and how to go on.
        """
        if jax.process_index() == 0:
            for name in (f"{step}{manager_lib.TMP_MARK}", str(step), PENDING):
                path = os.path.join(self.directory, name)
                done = manager_lib.is_complete(path) and os.path.exists(
                    f"{path}/{integrity.RECORD}"
                )
                if name != str(step) or not done:
                    shutil.rmtree(path, ignore_errors=True)
        raise OSError(
            f"could not save checkpoint step {step} in {self.directory}: {reason(error)}. "
            f"Nothing of step {step} was left behind. "
            f"{integrity.newest_intact_sentence(self.directory)}: free space there (or restore "
            "access to it) and run the same command again"
        ) from error


def quiet_reported_failures() -> None:
    """Keeps a failed save or restore to the run's one message. Orbax logs the failures
    it raises (with their tracebacks), and after a failed TensorStore write its pending
    callbacks each print 'Event loop is closed' into a closed asyncio loop; both say
    nothing that message does not. Other logs and errors are left alone. Idempotent."""
    if getattr(sys.unraisablehook, "vit_jax_quiet", False):
        return
    previous = sys.unraisablehook

    def unraisable(u: Any) -> None:
        error = u.exc_value
        if not (isinstance(error, RuntimeError) and "Event loop is closed" in str(error)):
            previous(u)

    unraisable.vit_jax_quiet = True
    sys.unraisablehook = unraisable
    logging.getLogger("absl").addFilter(_orbax_raised)
    # asyncio's "Task exception was never retrieved" for the same failed Orbax write.
    logging.getLogger("asyncio").addFilter(_orbax_task_failed)


def _orbax_raised(record: logging.LogRecord) -> bool:
    """False for Orbax's error logs of an exception it hands on to the caller."""
    from_orbax = f"{os.sep}orbax{os.sep}checkpoint{os.sep}" in record.pathname
    return not (from_orbax and record.levelno >= logging.ERROR and record.exc_info)


def _orbax_task_failed(record: logging.LogRecord) -> bool:
    """False for asyncio's report of an Orbax write task whose error was handed on."""
    tb = record.exc_info[2] if record.exc_info else None
    while tb is not None:
        if f"{os.sep}orbax{os.sep}checkpoint{os.sep}" in tb.tb_frame.f_code.co_filename:
            return False
        tb = tb.tb_next
    return True


def reason(error: BaseException) -> str:
    """The cause of a failed write in a few words ('No space left on device')."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error)
    for cause in REASONS:
        if cause in text:
            return cause
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:200]


def _wait_for_json(path: str) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no checksums from another process in {path}")
        time.sleep(0.05)
    with open(path) as f:
        return json.load(f)
