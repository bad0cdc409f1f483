"""Checks before training starts: a writable workdir, room for the run's checkpoints, a
run already finished; and what a run that failed early created, removed again."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
from typing import Any

import jax
import numpy as np

from vit_jax.base.text import size
from vit_jax.workdir import integrity

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the checks need to know of a run: how long, how often it saves, how many
    checkpoints it keeps, whether it exports final.npz, and what its state is (the
    integrity record's description, `integrity.describe`)."""

    total_steps: int
    checkpoint_every: int
    keep_checkpoints: int
    export_npz: bool
    state: dict[str, Any]


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


def finished_summary(workdir: str, plan: Plan) -> dict[str, Any] | None:
    """The stored summary.json when `plan` already ran to its end in `workdir`, else
    None: the summary is at total_steps (or beyond), final.npz is there (when the run
    exports it) and the checkpoint of that step was written for the same model,
    optimizer and image size (its integrity record). A rerun then has nothing to do."""
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    step = summary.get("steps") if isinstance(summary, dict) else None
    if not isinstance(step, int) or step < plan.total_steps:
        return None
    if plan.export_npz and not os.path.isfile(os.path.join(workdir, "final.npz")):
        return None
    try:
        record = integrity.read_record(os.path.join(workdir, "checkpoints", str(step)))
    except ValueError:
        return None
    wrote = json.loads(json.dumps(plan.state))  # as the record stores it
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


def disk_needed(plan: Plan, state_bytes: int, params_bytes: int, existing: int) -> int:
    """Bytes the run will still write at its peak: the checkpoints kept at once (one
    more while a new save replaces the oldest), less those already there, plus the
    float32 `final.npz` export."""
    every, total = plan.checkpoint_every, plan.total_steps
    saves = (total // every + (total % every > 0)) if every > 0 else 1
    kept = min(plan.keep_checkpoints + 1, saves) if plan.keep_checkpoints else saves
    need = kept * state_bytes - existing
    return max(need, 0) + (params_bytes if plan.export_npz else 0)


def check_free_space(workdir: str, plan: Plan, state_bytes: int, params_bytes: int) -> None:
    """Fails before training when the workdir's disk cannot hold the run's checkpoints.

    Raises:
        OSError: naming the workdir, the free and the needed space, and the way out.
    """
    directory = os.path.join(workdir, "checkpoints")  # set-aside ones stay: not counted
    existing = sum(_dir_bytes(f"{directory}/{s}") for s in integrity.step_dirs(directory))
    need = disk_needed(plan, state_bytes, params_bytes, existing)
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise OSError(
            f"workdir {workdir} has {size(free)} free; this run needs about "
            f"{size(need)} (checkpoints of {size(state_bytes)} each, "
            f"keep_checkpoints={plan.keep_checkpoints}, one more while a save replaces "
            f"the oldest, and final.npz): free space there, choose another --workdir, "
            "or lower --config.keep_checkpoints"
        )
