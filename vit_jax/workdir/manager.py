"""The Orbax checkpoint manager of a workdir, in one place.

Checkpoints live in `workdir/checkpoints/<step>`. Orbax writes each save in the
background to `<step>.orbax-checkpoint-tmp*` and renames it to `<step>` only once it
is complete, so a run killed mid-save leaves a temporary directory that
`latest_step()` never returns and that the next run deletes (and names in its log).
Every process takes part in each save and restore; each writes the slices of the
arrays its devices hold, and a restore lays the arrays out as the new run's mesh says,
which need not be the mesh that wrote them.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import orbax.checkpoint as ocp

TMP_MARK = ".orbax-checkpoint-tmp"


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
    return ocp.CheckpointManager(
        os.path.abspath(directory), item_handlers=ocp.StandardCheckpointHandler()
    )
