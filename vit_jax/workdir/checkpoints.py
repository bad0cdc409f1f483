"""A run's checkpoints, `workdir/checkpoints/<step>`, on Orbax's documented surface.

Saving: Orbax's asynchronous CheckpointManager in its commit-file mode, on a disk and on
an object store alike (a store has no rename): it writes `<step>/` in place and marks it
complete with a commit file; a `<step>` without it is an interrupted save, which no
listing returns and which the next run deletes (after naming it). Between writing the
arrays and marking them complete, Orbax calls `post_finalization_callback`: process 0
writes the integrity record there (`record.py`), so a complete checkpoint has one. The
CRC-32 of every shard is taken as the save starts, from the arrays training holds;
processes hand theirs to process 0 with `multihost_utils.process_allgather`. Orbax keeps
the last `keep` checkpoints, deleting an older one only after a newer one is complete.

Restoring only what verifies (the record's files at their sizes, an Orbax restore, every
shard's checksum, finite values): a checkpoint that does not is set aside into
`workdir/damaged/<step>` (nothing is deleted: a person can look; Orbax never lists it)
and the run falls back to the one before. One without a record (Orbax alone, or an older
vit_jax, wrote it) is used when it restores whole and finite, and said to be unchecked.
A checkpoint of another shape is not damage: it stops the run (`does_not_fit`).

Every process takes part in each save and restore, each writing the slices its devices
hold; a restore lays the arrays out as the new run's mesh says.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from vit_jax.base import store
from vit_jax.base.text import first_few
from vit_jax.workdir import record as record_lib

COMMIT = ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)
DAMAGED = "DAMAGED"
SCRATCH_FIELD = "from_scratch_if_damaged"


@dataclasses.dataclass
class Verdict:
    """What checking one checkpoint found: `problems` empty means it verifies."""

    step: int
    problems: list[str]
    recorded: bool  # it has an integrity record (else: restored whole and finite)
    state: Any = None  # the restored state, when it verifies

    def line(self) -> str:
        if self.problems:
            return f"{DAMAGED}: " + "; ".join(self.problems)
        return "verifies" if self.recorded else "unchecked: no integrity record (restores, finite)"


class Checkpoints:
    """The checkpoints of one workdir: `save`, `wait`, `restore_newest`, `verify`.

    `directory` is `workdir/checkpoints` (local or gs://...); `keep` the number kept (0:
    all); `description` the state's, for the record. `read_only` opens without creating
    or deleting anything (`python -m vit_jax.checkpoints verify`).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 0,
        description: dict[str, Any] | None = None,
        read_only: bool = False,
    ):
        self.directory = store.absolute(directory)
        self.damaged = self.directory.parent / "damaged"
        self.description = description or {}
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._drop_incomplete()
        if read_only:  # lists and restores; creates and deletes nothing
            options = ocp.CheckpointManagerOptions(create=False, atomicity_options=COMMIT)
        else:
            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep or None,
                create=True,
                cleanup_tmp_directories=False,  # _drop_incomplete does it, naming them
                async_options=ocp.AsyncOptions(post_finalization_callback=self._write_record),
                atomicity_options=COMMIT,
            )
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=ocp.StandardCheckpointHandler()
        )
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(os.cpu_count(), "vit_jax-checksums")
        self._step: int | None = None  # the save in flight, until `wait`
        self._recording: tuple[int, dict[str, Any]] | None = None  # its step, checksums

    # ------------------------------------------------------------------ saving

    def save(self, step: int, state: Any) -> None:
        """Saves `state` as checkpoint `step` (written in the background after this
        returns). Every process calls it at the same step.

        Raises:
            OSError: this save or the one before failed (`failed`).
        """
        self.wait()  # a failure of the previous save is named with its own step
        mine = record_lib.checksums(state, self._pool)  # before the buffers are reused
        if jax.process_count() > 1:
            mine = record_lib.merge(_gather(mine))
        self._step = step
        self._recording = (step, mine)
        try:
            self.manager.save(step, args=ocp.args.StandardSave(state))
        except Exception as e:  # noqa: BLE001 (any failure of a save stops the run)
            self.failed(step, e)

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
            self.failed(step, e)

    def _write_record(self) -> None:
        """Orbax's post-finalization callback: the arrays of the save in flight are all
        written, not yet marked complete."""
        if jax.process_index() == 0 and self._recording is not None:
            (step, arrays), self._recording = self._recording, None
            record = {"step": step, "state": self.description, "arrays": arrays,
                      "process_count": jax.process_count()}  # fmt: skip
            record_lib.write(self.directory / str(step), record)

    def failed(self, step: int, error: BaseException) -> None:
        """Removes what the failed save of `step` left, then raises the run's one message.

        Raises:
            OSError: which step could not be saved and why, the newest intact checkpoint,
                and how to go on.
        """
        left = "Nothing of step {step} was left behind"
        try:  # the store may be what failed: then the listing fails too
            if jax.process_index() == 0 and step not in self.steps():
                store.remove_tree(self.directory / str(step))
            newest = self.newest_intact_sentence()
        except Exception:  # noqa: BLE001 (the next run deletes what is left, naming it)
            left = "What it wrote of step {step} is never resumed from (the next run deletes it)"
            newest = "A rerun resumes from the newest intact checkpoint"
        why = store.explain(error, self.directory)
        way_out = "free space there (or restore access to it) and run the same command again"
        if store.is_remote(self.directory):
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
        try:
            self.manager.close()
        except Exception:  # noqa: BLE001 (reported by wait(), or the run's error wins)
            pass
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ listing

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, ascending."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def incomplete(self) -> list[str]:
        """The names in the directory that interrupted (or running) saves left."""
        if not self.directory.exists():
            return []
        return sorted(
            p.name
            for p in self.directory.iterdir()
            if ocp.path.step.is_path_temporary(p)
            or (
                p.name.isdigit()
                and not ocp.path.step.is_path_finalized(p, atomicity_options=COMMIT)
            )
        )

    def _drop_incomplete(self) -> None:
        left = self.incomplete()
        if left and jax.process_index() == 0:
            print(f"ignoring incomplete checkpoint(s) {', '.join(left)} (a save was "
                  "interrupted)", flush=True)  # fmt: skip
            for name in left:
                store.remove_tree(self.directory / name)
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

    def _quick_problems(self, step: int) -> list[str]:
        try:
            found = record_lib.read(self.directory / str(step))
        except ValueError as e:
            return [str(e)]
        if found is None:
            return [f"it has no integrity record {record_lib.NAME}"]
        return record_lib.file_problems(self.directory / str(step), found)

    # ------------------------------------------------------------------ restoring

    def check(self, step: int, target: Any = None) -> Verdict:
        """Checks checkpoint `step`, restoring it laid out as `target` (ShapeDtypeStructs
        with shardings); None: as saved, on one device (`verify`).

        Raises:
            ValueError: with a target, the checkpoint was written by a state of another shape.
        """
        step_dir = self.directory / str(step)
        try:
            found = record_lib.read(step_dir)
        except ValueError as e:
            return Verdict(step, [str(e)], True)
        if found is not None:
            if target is not None and (misfit := record_lib.misfits(found, target)):
                saved = record_lib.summary(found.get("state"))
                detail = f"it holds {saved}; {first_few(misfit, '; ')}"
                raise does_not_fit(step_dir, detail, misfit)
            if problems := record_lib.file_problems(step_dir, found):
                return Verdict(step, [first_few(problems, "; ", unit="files")], True)
        try:
            layout = target if target is not None else self._as_saved(step)
            state = self.manager.restore(step, args=ocp.args.StandardRestore(layout))
        except Exception as e:  # noqa: BLE001 (whatever Orbax or TensorStore raise)
            misfit = self._metadata_misfits(step, target) if found is None and target else []
            if misfit:
                raise does_not_fit(step_dir, first_few(misfit, "; "), misfit) from e
            return Verdict(step, [f"it is unreadable ({_cause(e)})"], found is not None)
        problems = []
        if found is not None and (bad := record_lib.mismatches(state, found)):
            problems.append(f"{len(bad)} arrays fail their checksums ({first_few(bad)})")
        if not problems and not bool(record_lib.all_finite(state)):
            problems.append("it restores non-finite values")
        return Verdict(step, problems, found is not None, None if problems else state)

    def restore_newest(self, target: Any, from_scratch: bool = False) -> tuple[Any, int | None]:
        """(state, step) of the newest checkpoint that verifies, laid out as `target`;
        (None, None) when there is none. Every process must call it.

        Raises:
            ValueError: a checkpoint of another shape (`does_not_fit`).
            OSError: there are checkpoints, none verifies and not `from_scratch`.
        """
        lead, damaged = jax.process_index() == 0, []
        for step in reversed(self.steps()):
            verdict = self.check(step, target)
            if _everywhere(not verdict.problems):
                if lead:
                    if not verdict.recorded:
                        print(f"checkpoint {self.directory}/{step} has no integrity record "
                              "(an older vit_jax, or Orbax directly, wrote it): it restores "
                              "whole and finite; its checksums cannot be checked",
                              flush=True)  # fmt: skip
                    print(f"resuming from step {step} (checkpoint {self.directory}/{step})",
                          flush=True)  # fmt: skip
                return verdict.state, step
            why = "; ".join(verdict.problems) or "it fails on another process"
            aside = self.set_aside(step)
            if lead:
                print(f"checkpoint {self.directory}/{step} is damaged: {why}. Set aside as "
                      f"{aside} (nothing deleted); trying the one before", flush=True)  # fmt: skip
            damaged.append(f"step {step} ({why}; now {aside})")
        if damaged and not from_scratch:
            raise OSError(
                f"no checkpoint in {self.directory} verifies: {'; '.join(damaged)}. To start "
                f"again from step 0 in this workdir, rerun with {SCRATCH_FIELD}=True; the "
                "damaged ones stay set aside"
            )
        if damaged and lead:
            print(
                f"no checkpoint verifies; starting from step 0 ({SCRATCH_FIELD}=True)", flush=True
            )
        return None, None

    def set_aside(self, step: int) -> store.Path:
        """Moves checkpoint `step` to workdir/damaged/<step> (or <step>.2, ...); its path.
        Process 0 moves it; every process must call it."""
        aside, n = self.damaged / str(step), 1
        while aside.exists():
            n += 1
            aside = self.damaged / f"{step}.{n}"
        if jax.process_index() == 0:
            self.damaged.mkdir(parents=True, exist_ok=True)
            store.move(self.directory / str(step), aside)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"vit_jax: set aside {step}")
        self.manager.reload()  # Orbax's list of steps forgets it
        return aside

    def verify(self) -> list[tuple[str, str]]:
        """[(name, what it is)] of every checkpoint, incomplete save and set-aside one,
        each checkpoint restored on one device and checked; nothing is changed."""
        rows = [(name, "incomplete (an interrupted save; the next run deletes it)")
                for name in self.incomplete()]  # fmt: skip
        rows += [(str(step), self.check(step).line()) for step in self.steps()]
        if self.damaged.exists():
            rows += [(f"damaged/{p.name}", "set aside (found damaged by an earlier run)")
                     for p in self.damaged.iterdir()]  # fmt: skip
        return sorted(rows, key=lambda row: _order(row[0]))

    def _as_saved(self, step: int) -> Any:
        """A restore target from Orbax's metadata: every array as saved, on one device."""
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        metadata = self.manager.item_metadata(step)
        return jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata
        )

    def _metadata_misfits(self, step: int, target: Any) -> list[str]:
        try:
            saved = record_lib.named_leaves(self.manager.item_metadata(step))
        except Exception:  # noqa: BLE001 (unreadable metadata is damage, not another shape)
            return []
        arrays = {n: {"shape": list(m.shape), "dtype": str(m.dtype)} for n, m in saved}
        return record_lib.misfits({"arrays": arrays}, target)


def does_not_fit(path: Any, detail: str, misfit: list[str] = ()) -> ValueError:
    """The error of a checkpoint written by a state of another shape (not damage); one
    with the TrainState of a vit_jax before optax.apply_if_finite says so."""
    if any(m.startswith("skipped ") for m in misfit):  # the old TrainState.skipped
        return ValueError(
            f"checkpoint {path} was written by an older vit_jax, which counted skipped "
            "non-finite steps beside the optimizer state (this one counts them inside it, "
            "with optax.apply_if_finite), so it cannot be resumed here: finish that run "
            "with the vit_jax that wrote it, or start in another workdir"
        )
    return ValueError(
        f"checkpoint {path} does not fit this run's state (another model, optimizer or "
        f"image size?): {detail}. Resume with the config that wrote it, or start in "
        "another workdir"
    )


def _gather(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every process's checksums (JSON, padded to one length, all-gathered)."""
    data = np.frombuffer(json.dumps(mine).encode(), np.uint8)
    longest = int(np.max(multihost_utils.process_allgather(np.array([len(data)]))))
    padded = np.zeros(longest, np.uint8)
    padded[: len(data)] = data
    every = multihost_utils.process_allgather(padded)  # [processes, longest]
    return [json.loads(bytes(row).rstrip(b"\0")) for row in np.asarray(every)]


def _everywhere(ok: bool) -> bool:
    """Whether `ok` holds on every process (all of them decide alike)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.array(ok))))


def _cause(e: BaseException) -> str:
    """A TensorStore or Orbax error in a few words: 'DATA_LOSS reading params.cls'."""
    text = str(e).strip()
    code = re.match(r"([A-Z][A-Z_]{3,}): ", text)
    if not code:
        return (text.splitlines()[0] if text else type(e).__name__)[:300]
    words = [code[1]]
    if array := re.search(r'Error reading "([^"/]+)/', text):
        words.append(f"reading {array[1]}")
    return " ".join(words)


def _order(name: str) -> tuple[int, str]:
    digits = name.removeprefix("damaged/").split(".")[0]
    return (int(digits) if digits.isdigit() else -1, name)
