"""The Orbax checkpoint manager of a workdir, in one place.

Checkpoints live in `workdir/checkpoints/<step>`. Orbax completes a save in one of two
ways (its `AtomicityOptions`, 0.12.3 and later; `commit_mode()` says which this run uses):

  rename  (local disk, the default) it writes `<step>.orbax-checkpoint-tmp*` and renames
          it to `<step>` once complete: a checkpoint is complete under its final name
          (Orbax 0.12.3 and later also write `commit_success.txt` into it first)
  file    (object stores; VIT_JAX_CHECKPOINT_COMMIT=file forces it) it writes `<step>` in
          place and marks it complete with `commit_success.txt`: a `<step>` without the
          marker is a save in progress or an interrupted one

Either way the integrity record is written before the rename or the marker, and a run
killed mid-save leaves an incomplete checkpoint that no listing returns and that the next
run deletes (naming it). Orbax's own clean-up is off: in the file mode it deletes every
directory without the marker, the checkpoints set aside as damaged included.
Every process takes part in each save and restore; each writes the slices of the
arrays its devices hold, and a restore lays the arrays out as the new run's mesh says,
which need not be the mesh that wrote them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

TMP_MARK = ".orbax-checkpoint-tmp"
COMMIT_FILE = "commit_success.txt"  # Orbax's marker of a complete checkpoint
MODE_ENV = "VIT_JAX_CHECKPOINT_COMMIT"  # 'rename' or 'file'; unset: rename (local disk)
MODES = ("rename", "file")


def commit_mode() -> str:
    """'rename' or 'file': how Orbax completes this run's saves (see above).

    Raises:
        ValueError: VIT_JAX_CHECKPOINT_COMMIT holds something else.
    """
    mode = os.environ.get(MODE_ENV, "") or "rename"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode}: use 'rename' (local disk) or 'file' (object stores)")
    return mode


def _atomicity_options() -> dict:
    """The CheckpointManagerOptions fields that choose `commit_mode()`."""
    file = commit_mode() == "file"
    if hasattr(ocp.options, "AtomicityOptions"):  # Orbax 0.12.3 and later
        mode = (
            ocp.options.AtomicityMode.COMMIT_FILE
            if file
            else ocp.options.AtomicityMode.ATOMIC_RENAME
        )
        return {"atomicity_options": ocp.options.AtomicityOptions(mode=mode)}
    from orbax.checkpoint.path import atomicity  # older: the class that does it

    cls = atomicity.CommitFileTemporaryPath if file else atomicity.AtomicRenameTemporaryPath
    return {"temporary_path_class": cls}


def is_complete(step_dir: str) -> bool:
    """Whether the directory `step_dir` (`<step>`, a final name) holds a complete save."""
    if commit_mode() == "file":
        return os.path.isfile(os.path.join(step_dir, COMMIT_FILE))
    return os.path.isdir(step_dir)


def incomplete(directory: str) -> list[str]:
    """The names in `directory` that interrupted (or running) saves left: Orbax's temporary
    directories, and in the file mode the `<step>` directories without the marker."""
    if not os.path.isdir(directory):
        return []
    return sorted(
        name
        for name in os.listdir(directory)
        if TMP_MARK in name or (name.isdigit() and not is_complete(os.path.join(directory, name)))
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
    left = incomplete(directory)
    if left and jax.process_index() == 0:
        print(
            f"ignoring incomplete checkpoint(s) {', '.join(left)} (a save was interrupted)",
            flush=True,
        )
        for name in left:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("incomplete checkpoints removed")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep or None,
        create=True,
        cleanup_tmp_directories=False,  # done above: Orbax's would delete set-aside ones
        async_options=ocp.AsyncOptions(post_finalization_callback=on_commit),
        **_atomicity_options(),
    )
    return ocp.CheckpointManager(
        directory, options=options, item_handlers=ocp.StandardCheckpointHandler()
    )


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


def open_reader(directory: str) -> ocp.CheckpointManager:
    """A manager of the checkpoints in `directory` that only restores: it neither
    creates nor deletes anything (`python -m vit_jax.checkpoints verify`)."""
    options = ocp.CheckpointManagerOptions(**_atomicity_options())
    return ocp.CheckpointManager(
        os.path.abspath(directory), options=options, item_handlers=ocp.StandardCheckpointHandler()
    )
