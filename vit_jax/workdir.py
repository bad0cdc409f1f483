"""The workdir: checks before training starts, Orbax checkpoints, non-finite guards.

Checkpoints live in `workdir/checkpoints/<step>`. Orbax writes each save in the
background to `<step>.orbax-checkpoint-tmp*` and renames it to `<step>` only once it
is complete, so a run killed mid-save leaves a temporary directory that
`latest_step()` never returns and that the next run deletes (and names in its log).
A complete checkpoint also holds its integrity record (`integrity.py`, written by
`saver.Saver`); restores verify it (`recovery.py`) and set aside what fails.
Every process takes part in each save and restore; each writes the slices of the
arrays its devices hold, and a restore lays the arrays out as the new run's mesh says,
which need not be the mesh that wrote them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from vit_jax import integrity

TMP_MARK = ".orbax-checkpoint-tmp"
GIB = 2**30
SKIPPED_IN_A_ROW = 10  # with skip_nonfinite: more non-finite steps in a row stop the run


def check_writable(workdir: str) -> None:
    """Fails before training, not after hours, when `workdir` cannot be written."""
    try:
        os.makedirs(workdir, exist_ok=True)
        # One probe per process: several processes may share the workdir.
        probe = os.path.join(workdir, f".write_probe.{socket.gethostname()}.{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
        os.remove(probe)
    except OSError as e:
        raise OSError(
            f"workdir {workdir} is not writable ({e.strerror}): choose another "
            "--workdir or free space there"
        ) from e


def finished_summary(workdir: str, config: Any) -> dict[str, Any] | None:
    """The stored summary.json when `config` already ran to its end in `workdir`, else
    None: the summary is at total_steps (or beyond), final.npz is there (when the config
    exports it) and the checkpoint of that step was written for the same model,
    optimizer and image size (its integrity record). A rerun then has nothing to do."""
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    step = summary.get("steps") if isinstance(summary, dict) else None
    if not isinstance(step, int) or step < config.total_steps:
        return None
    if config.export_npz and not os.path.isfile(os.path.join(workdir, "final.npz")):
        return None
    try:
        record = integrity.read_record(os.path.join(workdir, "checkpoints", str(step)))
    except ValueError:
        return None
    wrote = json.loads(json.dumps(integrity.describe(config)))  # as the record stores it
    if record is None or record.get("step") != step or record.get("state") != wrote:
        return None
    return summary


def missing_dirs(workdir: str) -> list[str]:
    """`workdir/checkpoints`, `workdir` and its ancestors that do not exist yet, deepest
    first: the directories a run creates (see `remove_empty`)."""
    out, path = [], os.path.abspath(workdir)
    for d in (os.path.join(path, "checkpoints"), path):
        if not os.path.exists(d):
            out.append(d)
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.exists(parent):
        out.append(parent)
        parent = os.path.dirname(parent)
    return out


def remove_empty(dirs: list[str]) -> None:
    """Removes those of `dirs` (deepest first) that are empty directories: what a run
    that failed before writing anything created. Never a file, never a directory that
    holds anything (os.rmdir refuses those)."""
    if jax.process_index() != 0:
        return
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:
            pass


def tree_bytes(tree: Any) -> int:
    """Bytes of a tree of arrays or ShapeDtypeStructs, all shards together."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def disk_needed(config: Any, state_bytes: int, params_bytes: int, existing: int) -> int:
    """Bytes the run will still write at its peak: the checkpoints kept at once (one
    more while a new save replaces the oldest), less those already there, plus the
    float32 `final.npz` export."""
    every, total = config.checkpoint_every, config.total_steps
    saves = (total // every + (total % every > 0)) if every > 0 else 1
    kept = min(config.keep_checkpoints + 1, saves) if config.keep_checkpoints else saves
    need = kept * state_bytes - existing
    return max(need, 0) + (params_bytes if config.export_npz else 0)


def check_free_space(workdir: str, config: Any, state_bytes: int, params_bytes: int) -> None:
    """Fails before training when the workdir's disk cannot hold the run's checkpoints.

    Raises:
        OSError: naming the workdir, the free and the needed space, and the way out.
    """
    directory = os.path.join(workdir, "checkpoints")  # set-aside ones stay: not counted
    existing = sum(_dir_bytes(f"{directory}/{s}") for s in integrity.step_dirs(directory))
    need = disk_needed(config, state_bytes, params_bytes, existing)
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise OSError(
            f"workdir {workdir} has {free / GIB:.2f} GiB free; this run needs about "
            f"{need / GIB:.2f} GiB (checkpoints of {state_bytes / GIB:.2f} GiB each, "
            f"keep_checkpoints={config.keep_checkpoints}, one more while a save replaces "
            f"the oldest, and final.npz): free space there, choose another --workdir, "
            "or lower --config.keep_checkpoints"
        )


def open_manager(
    workdir: str, keep: int, on_commit: Callable[[], None] | None = None
) -> ocp.CheckpointManager:
    """The Orbax manager of `workdir/checkpoints` (asynchronous saves, the last `keep`
    kept); it deletes what interrupted saves left, after naming it. `on_commit` runs on
    process 0 once a save's arrays are all written, before the rename that completes it;
    an older checkpoint is deleted only after that."""
    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    os.makedirs(directory, exist_ok=True)
    left = [n for n in sorted(os.listdir(directory)) if TMP_MARK in n]
    if left and jax.process_index() == 0:
        print(
            f"ignoring incomplete checkpoint(s) {', '.join(left)} (a save was interrupted)",
            flush=True,
        )
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep or None,
        create=True,
        cleanup_tmp_directories=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=on_commit),
    )
    return ocp.CheckpointManager(
        directory, options=options, item_handlers=ocp.StandardCheckpointHandler()
    )


def restore(manager: ocp.CheckpointManager, step: int, target: Any) -> Any:
    """Checkpoint `step` laid out as `target` (ShapeDtypeStructs with shardings) says.

    Raises:
        ValueError: the checkpoint does not fit `target`, naming both and the way out.
    """
    try:
        return manager.restore(step, args=ocp.args.StandardRestore(target))
    except (ValueError, KeyError, TypeError) as e:
        raise does_not_fit(f"{manager.directory}/{step}", str(e)) from e


def misfit_error(path: str, misfit: list[str], detail: str) -> ValueError:
    """`does_not_fit`, or where `misfit` (`integrity.misfits`) shows the state of a vit_jax
    from before optax.apply_if_finite, a message that says so (its config cannot help)."""
    if any(m.startswith("skipped ") for m in misfit):  # the old TrainState.skipped
        return ValueError(
            f"checkpoint {path} was written by an older vit_jax, which counted skipped "
            "non-finite steps beside the optimizer state (this one counts them inside it, "
            "with optax.apply_if_finite), so it cannot be resumed here: finish that run "
            "with the vit_jax that wrote it, or start in another --workdir"
        )
    return does_not_fit(path, detail)


def does_not_fit(path: str, detail: str) -> ValueError:
    """The error of a checkpoint written by a state of another shape (not damage)."""
    return ValueError(
        f"checkpoint {path} does not fit this run's state (another model, optimizer or "
        f"image size?): {detail}. Resume with the config that wrote it, or start in "
        "another --workdir"
    )


@dataclasses.dataclass
class FiniteGuard:
    """Stops the run on non-finite values; checked at every log and save step, before
    the save, so nothing non-finite is ever written over a good checkpoint.

    Without `skip`, a step whose loss, gradient norm or new state is non-finite
    ('finite' metric 0) stops the run. With `skip` (config.skip_nonfinite) such steps
    left the state unchanged inside the jitted step; the run stops only when at least
    SKIPPED_IN_A_ROW steps in a row were skipped (as far as the checks can tell: a
    window between two checks with one good step in it breaks the row). The "last good
    checkpoint" it names is the newest with a complete integrity record whose files are
    all there at their sizes (`integrity.newest_intact`), never a damaged one.
    """

    manager: ocp.CheckpointManager
    skip: bool
    last_step: int = 0  # the step of the last check, and the skipped count then
    last_skipped: int = 0

    def __post_init__(self):
        self.row_from = self.last_step  # every step after this one was skipped

    def check(self, metrics: dict[str, float], step: int) -> None:
        skipped = int(metrics["skipped"])
        if self.skip:
            if skipped - self.last_skipped < step - self.last_step:
                self.row_from = step  # a good step since the last check
            if step - self.row_from >= SKIPPED_IN_A_ROW:
                self._stop(
                    f"steps {self.row_from + 1} to {step} all had a non-finite loss or "
                    f"gradient and were skipped (loss {metrics['loss']})"
                )
        elif not metrics["finite"]:
            since = "" if step == self.last_step + 1 else f" (it began after step {self.last_step})"
            self._stop(
                f"non-finite loss {metrics['loss']}, gradient norm {metrics['grad_norm']} or "
                f"new state at step {step}{since}; nothing non-finite was saved"
            )
        self.last_step, self.last_skipped = step, skipped

    def _stop(self, what: str) -> None:
        try:
            self.manager.wait_until_finished()  # a save in flight holds a checked state
        except Exception:  # noqa: BLE001 (a failed save is not the checkpoint named)
            pass
        good = integrity.newest_intact(str(self.manager.directory))  # whole, with its record
        where = f"step {good} in {self.manager.directory}" if good is not None else "none yet"
        raise FloatingPointError(
            f"{what}. The last good checkpoint is {where} (a restart resumes there): "
            "lower the learning rate, clip gradients (--config.optimizer.grad_clip) or set "
            "--config.skip_nonfinite=True, and restart"
        )
