"""A run's checkpoints, `workdir/checkpoints/<step>`: saving one, with its integrity
record (record.py), and listing them, on Orbax's documented surface (verifying and
restoring them: verify.py).

Saving: Orbax's asynchronous CheckpointManager in its commit-file mode, on a disk and on
an object store alike (a store has no rename): it writes `<step>/` in place and marks it
complete with a commit file; a `<step>` without it is an interrupted save, which no
listing returns and which the next run deletes (after naming it). Between writing the
arrays and marking them complete, Orbax calls `post_finalization_callback`: process 0
writes the integrity record there, so a complete checkpoint has one. Orbax keeps the
last `keep` checkpoints, deleting an older one only after a newer one is complete.
Every process takes part in each save, each writing the slices its devices hold.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from vit_jax.base import exits, failures, store
from vit_jax.workdir.record import NAME, file_problems, read_record, write_record
from vit_jax.workdir.shards import checksums, merge_gathered

COMMIT = ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)
DAMAGED = "DAMAGED"
WAY_OUT = "free space there (or restore access to it) and run the same command again"


class Checkpoints:
    """The checkpoints of one workdir: `save`, `wait`, `steps`, `newest_intact`, `set_aside`.

    `directory` is `workdir/checkpoints` (local or gs://...); `keep` the number kept (0:
    all); `description` the state's, for the record. `read_only` opens without creating
    or deleting anything (`python -m vit_jax.checkpoints verify`). `via` is the workdir's
    store: what this class reads, lists and removes, and Orbax's listings and restores,
    go through its retries (a failed save: `_outlive`).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 0,
        description: dict[str, Any] | None = None,
        read_only: bool = False,
        via: store.Store = store.PLAIN,
    ):
        self.directory, self.store = store.absolute(directory), via
        self.damaged = self.directory.parent / "damaged"
        self.description = description or {}
        options = ocp.CheckpointManagerOptions(create=False, atomicity_options=COMMIT)
        if not read_only:  # read-only: lists and restores; creates and deletes nothing
            via.makedirs(self.directory)
            self._drop_incomplete()
            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep or None,
                create=True,
                atomicity_options=COMMIT,
                cleanup_tmp_directories=False,  # _drop_incomplete does it, naming them
                async_options=ocp.AsyncOptions(post_finalization_callback=self._write_record),
            )
        handler = ocp.StandardCheckpointHandler()
        opened = functools.partial(
            ocp.CheckpointManager, self.directory, options=options, item_handlers=handler
        )
        self.manager = via.retried(opened, f"opening {self.directory}")
        self._pool: Any = concurrent.futures.ThreadPoolExecutor(os.cpu_count(), "vit_jax-checksums")
        self._step: int | None = None  # the save in flight, until `wait`
        self._state: Any = None  # its state (saved again if it failed and is still live)
        self._recording: tuple[int, dict[str, Any]] | None = None  # its step, checksums

    # ------------------------------------------------------------------ saving

    def save(self, step: int, state: Any) -> None:
        """Saves `state` as checkpoint `step` (written in the background after this
        returns). Every process calls it at the same step.

        Raises:
            OSError: this save or the one before failed (`failed`).
        """
        exits.unless_leaving()
        self.wait()  # a failure of the previous save is named with its own step
        mine = checksums(state, self._pool)  # before the buffers are reused
        if jax.process_count() > 1:
            mine = merge_gathered(mine)
        self._step, self._state = step, state
        self._recording = (step, mine)
        try:
            self.manager.save(step, args=ocp.args.StandardSave(state))
        except Exception as e:  # noqa: BLE001 (any failure of a save stops the run)
            self._step = None
            self._outlive(step, e) or self.failed(step, e)

    def wait(self) -> None:
        """Waits for the save in flight to end.

        Raises:
            OSError: it failed (`failed`).
        """
        if self._step is None:
            return
        step, self._step = self._step, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            self._outlive(step, e) or self.failed(step, e)

    def _outlive(self, step: int, error: BaseException) -> bool:
        """A save that failed because the store did not answer, inside the retry window:
        once it answers, what the save left is removed and, if its state is still in
        memory (the final save), it is saved again; otherwise the next save stands in
        for it. False: not such a failure (the caller raises)."""
        if not self.store.rides_out(error, f"saving {self.directory}/{step}"):
            return False
        state, self._state = self._state, None
        leaves = jax.tree.leaves(state)
        if step in self.steps():
            return True  # it completed after all
        self._drop_failed(step)
        if state is not None and not any(getattr(x, "is_deleted", bool)() for x in leaves):
            self.save(step, state)
            self.wait()
        elif jax.process_index() == 0:
            print(
                f"checkpoint {step} was not saved while the store did not answer; the next "
                "save stands in for it",
                flush=True,
            )
        return True

    def _drop_failed(self, step: int) -> None:
        """Removes what a failed save of `step` left (process 0), even when it lists as
        complete (a full disk can leave Orbax's commit marker created but empty), once the
        save's own threads ended (a minute each at most): one failed write ends Orbax's wait,
        not the other writes, which made the step's directory again after the removal."""
        for thread in [t for t in threading.enumerate() if type(t).__name__ == "_SignalingThread"]:
            threading.Thread.join(thread, 60)  # Orbax's commit threads (their own join raises)
        if jax.process_index() == 0:
            self.store.remove_tree(self.directory / str(step))

    def _write_record(self) -> None:
        """Orbax's post-finalization callback: the arrays of the save in flight are all
        written, not yet marked complete."""
        if jax.process_index() == 0 and self._recording is not None:
            (step, arrays), self._recording = self._recording, None
            record = {
                "step": step,
                "state": self.description,
                "arrays": arrays,
                "process_count": jax.process_count(),
            }
            write_record(self.directory / str(step), record, self.store)

    def failed(self, step: int, error: BaseException) -> None:
        """Removes what the failed save of `step` left, then raises the run's one message.

        Raises:
            OSError: which step could not be saved and why, the newest intact checkpoint,
                and how to go on.
        """
        left = "Nothing of step {step} was left behind"
        try:  # the store may be what failed: then the listing fails too
            self._drop_failed(step)
            newest = self.newest_intact_sentence()
        except Exception:  # noqa: BLE001 (the next run deletes what is left, naming it)
            left = "What it wrote of step {step} is never resumed from (the next run deletes it)"
            newest = "A rerun resumes from the newest intact checkpoint"
        why = store.explain(error, self.directory)
        way_out = WAY_OUT
        if not failures.stores_own(error):  # no waiting, access or room fixes it
            way_out = "what it names is not the store's failure: fix it, then run the same command"
        elif store.is_remote(self.directory):
            way_out = "once the store answers (and lets this account write), run the same command"
        raise OSError(
            f"could not save checkpoint step {step} in {self.directory}: {why}. "
            f"{left.format(step=step)}. {newest}: {way_out}"
        ) from error

    def close(self) -> None:
        """Waits for the save in flight, then ends Orbax's threads and the hashing pool.
        A failed save is not raised here (`wait` and `save` name it); idempotent."""
        if self._pool is None:
            return
        self._step = None
        with contextlib.suppress(Exception):  # reported by wait(), or the run's error wins
            self.manager.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ listing

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, ascending."""

        def listed() -> list[int]:
            self.manager.reload()  # what other processes and runs saved since
            return sorted(self.manager.all_steps())

        return self.store.retried(listed, f"listing {self.directory}")

    def incomplete(self) -> list[str]:
        """The names in the directory that interrupted (or running) saves left."""
        if not self.directory.exists():
            return []
        step = ocp.path.step
        return sorted(
            p.name
            for p in self.directory.iterdir()
            if step.is_path_temporary(p)
            or (p.name.isdigit() and not step.is_path_finalized(p, atomicity_options=COMMIT))
        )

    def _drop_incomplete(self) -> None:
        left = self.store.retried(self.incomplete, f"listing {self.directory}")
        if left and jax.process_index() == 0:
            print(
                f"ignoring incomplete checkpoint(s) {', '.join(left)} (a save was interrupted)",
                flush=True,
            )
            for name in left:
                self.store.remove_tree(self.directory / name)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("vit_jax: incomplete checkpoints removed")

    def newest_intact(self) -> int | None:
        """The newest checkpoint whose record and file sizes check (nothing read)."""
        for step in reversed(self.steps()):
            if not self._quick_problems(step):
                return step
        return None

    def newest_intact_sentence(self) -> str:
        """Where a rerun goes on, as every message of a stopped run says it: 'The newest
        intact checkpoint is step 30 (DIR/30); a rerun resumes there', or 'There is no
        intact checkpoint yet; a rerun starts from step 0'."""
        good = self.newest_intact()
        if good is None:
            return "There is no intact checkpoint yet; a rerun starts from step 0"
        where = f"{self.directory}/{good}"
        return f"The newest intact checkpoint is step {good} ({where}); a rerun resumes there"

    def rerun_sentence(self) -> str:
        """`newest_intact_sentence` and the way out, for a failed write beside the saves,
        once the save in flight ended (a failure of it, naming what it left, is raised)."""
        self.wait()
        return f"{self.newest_intact_sentence()}: {WAY_OUT}"

    def _quick_problems(self, step: int) -> list[str]:
        try:
            found = read_record(self.directory / str(step), self.store)
        except ValueError as e:
            return [str(e)]
        if found is None:
            return [f"it has no integrity record {NAME}"]
        return file_problems(self.directory / str(step), found, self.store)

    def set_aside(self, step: int) -> store.Path:
        """Moves checkpoint `step` to workdir/damaged/<step> (or <step>.2, ...); its path.
        Process 0 moves it; every process must call it."""
        aside, n = self.damaged / str(step), 1
        while self.store.exists(aside):
            n += 1
            aside = self.damaged / f"{step}.{n}"
        if jax.process_index() == 0:
            self.store.makedirs(self.damaged)
            self.store.move(self.directory / str(step), aside)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"vit_jax: set aside {step}")
        self.manager.reload()  # Orbax's list of steps forgets it
        return aside
