"""A run's workdir, local or on an object store (gs://bucket/path): where its files are,
and the checks before training: writable, room for the checkpoints, already finished.

    WORKDIR/checkpoints/<step>/   Orbax checkpoints with their records (checkpoints.py)
    WORKDIR/damaged/<step>/       checkpoints found damaged, set aside
    WORKDIR/run.lock              the lock of the run in progress (lock.py)
    WORKDIR/events.out.tfevents.* TensorBoard scalars
    WORKDIR/summary.json          the final metrics
    WORKDIR/final.npz             the parameters in the published layout
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from vit_jax.base import outage, store
from vit_jax.base.console import size
from vit_jax.models import ORIGINAL_NUMERICS
from vit_jax.weights.load import read_fields
from vit_jax.weights.read import read_meta
from vit_jax.weights.remote import resolve
from vit_jax.workdir.record import read_record


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the checks need to know of a run: how long, how often it saves, how many
    checkpoints it keeps, whether it exports final.npz, and what its state is (the
    integrity record's description: model, optimizer and image size)."""

    total_steps: int
    checkpoint_every: int
    keep_checkpoints: int
    export_npz: bool
    state: dict[str, Any]

    @classmethod
    def of(cls, config: Any) -> Plan:
        """A run config's plan. Its state's description also says what a checkpoint needs
        to be loaded as a model (`outputs.load_run`): the numerics init_from gives where they
        are not the original's, with an empty model name its whole architecture
        (`read_fields`), the resize where it is not the default, LoRA's base. What is unset
        or the default is left out (layer_decay 0 too), so that a workdir finished before
        those fields existed still matches."""
        c = config
        model = {
            k: v
            for k, v in c.model.to_dict().items()
            if not (k in ("gelu", "layer_norm_eps") and v is None)
        }
        if c.init_from:  # numerics that the file's source gives, as the run computes
            found = read_meta(c.init_from).numerics
            if found != ORIGINAL_NUMERICS:
                model = {**found, **model}
        optimizer = {k: v for k, v in c.optimizer.to_dict().items() if k != "layer_decay" or v}
        state = {"model": model, "optimizer": optimizer, "image_size": c.image_size}
        if c.init_from and not c.model.name:  # its architecture: load_run needs no file
            told = read_fields(c.init_from).items()
            state["architecture"] = {k: v for k, v in told if v is not None}
        if c.dataset.preprocessing not in ("", "tf_bilinear"):
            state["preprocessing"] = c.dataset.preprocessing
        if c.lora.rank:  # the checkpoints hold the adapters; the base is init_from
            digest = content_hash(resolve(c.init_from))  # a published file: its copy
            state["lora"] = {**c.lora.to_dict(), "init_from": c.init_from, "sha256": digest}
        return cls(c.total_steps, c.checkpoint_every, c.keep_checkpoints, bool(c.export_npz), state)


def content_hash(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (of a directory's files, in order of their names)."""
    root, digest = store.path(path), hashlib.sha256()
    for name in sorted(store.PLAIN.walk_files(root)) if root.is_dir() else [""]:
        with (root / name if name else root).open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class Workdir:
    """The files of one run, under `root` (a local path or a gs:// URL; s3://: refused, see
    `store.absolute`), and the store that reads and writes them (a run's: retried through
    its outages)."""

    root: store.Path
    store: store.Store = store.PLAIN

    @classmethod
    def at(cls, path: str | os.PathLike) -> Workdir:
        """The workdir at `path` to read (no retry window: a run's is `open`'s)."""
        return cls(store.absolute(path))

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str | os.PathLike, retry_seconds: float) -> Iterator[Workdir]:
        """The workdir at `path` for the run of the block. On a store, the run's retry
        window (base/outage.py) is its store's: every operation retries through it, and a
        probe holds it open while the block runs."""
        root = store.absolute(path)
        if not store.is_remote(root):
            yield cls(root)
            return
        window = outage.Window(root, retry_seconds)
        with outage.watching(window):
            yield cls(root, store.Store(window))

    @property
    def remote(self) -> bool:
        return store.is_remote(self.root)

    @property
    def checkpoints(self) -> store.Path:
        return self.root / "checkpoints"

    @property
    def summary(self) -> store.Path:
        return self.root / "summary.json"

    @property
    def final_npz(self) -> store.Path:
        return self.root / "final.npz"

    def __str__(self) -> str:
        return str(self.root)

    def finished(self, plan: Plan) -> dict[str, Any] | None:
        """The stored summary.json when `plan` already ran to its end here, else None:
        the summary is at total_steps (or beyond), final.npz is there (when the run
        exports it) and the checkpoint of that step was written for the same model,
        optimizer and image size (its integrity record). A rerun has nothing to do."""
        try:
            summary = json.loads(self.store.read_text(self.summary))
        except (OSError, ValueError):
            return None
        step = summary.get("steps") if isinstance(summary, dict) else None
        if not isinstance(step, int) or step < plan.total_steps:
            return None
        if plan.export_npz and not self.store.exists(self.final_npz):
            return None
        try:
            found = read_record(self.checkpoints / str(step), self.store)
        except ValueError:
            return None
        wrote = json.loads(json.dumps(plan.state))  # as the record stores it
        if found is None or found.get("step") != step or found.get("state") != wrote:
            return None
        return summary

    def check_writable(self) -> None:
        """Fails before training, not after hours, when the workdir cannot be written."""
        probe = self.root / f".write_probe.{socket.gethostname()}.{os.getpid()}"
        try:
            self.store.makedirs(self.root)
            self.store.write_text(probe, "\0" * 4096)  # one probe per process: they may share it
            self.store.remove(probe)
        except Exception as e:  # noqa: BLE001 (OSError on a disk; a store raises its own)
            way_out = "choose another workdir" + ("" if self.remote else " or make room there")
            raise OSError(
                f"workdir {self} is not writable ({store.explain(e, self.root)}): {way_out}"
            ) from e

    def missing_dirs(self) -> list[store.Path]:
        """The workdir and its ancestors that do not exist yet, deepest first: what a run
        creates (see `remove_empty`); none on a store, which has no directories."""
        if self.remote:
            return []
        out, path = [], store.path(os.path.abspath(self.root))
        while path != path.parent and not path.exists():
            out.append(path)
            path = path.parent
        return out

    @staticmethod
    def remove_empty(dirs: list[store.Path]) -> None:
        """Removes those of `dirs` (deepest first) that are empty directories (with an
        empty checkpoints/ in them): what a run that failed before writing anything
        created. Never a file, nor a directory that holds anything."""
        if jax.process_index() != 0:
            return
        for d in dirs:
            for name in ("checkpoints", ""):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(d, name))

    def check_free_space(self, plan: Plan, state_bytes: int, params_bytes: int) -> None:
        """Fails before training when the workdir's disk cannot hold the run's checkpoints
        (an object store has no such limit).

        Raises:
            OSError: naming the workdir, the free and the needed space, and the way out.
        """
        if self.remote:
            return
        steps = self.checkpoints.iterdir() if self.checkpoints.exists() else []
        existing = sum(sum(store.PLAIN.walk_files(p).values()) for p in steps if p.name.isdigit())
        need = disk_needed(plan, state_bytes, params_bytes, existing)
        free = shutil.disk_usage(self.root).free
        if free < need:
            raise OSError(
                f"workdir {self} has {size(free)} free; this run needs about {size(need)} "
                f"(checkpoints of {size(state_bytes)} each, keep_checkpoints="
                f"{plan.keep_checkpoints}, one more while a save replaces the oldest, and "
                "final.npz): free space there, choose another workdir, or lower "
                "keep_checkpoints"
            )


def disk_needed(plan: Plan, state_bytes: int, params_bytes: int, existing: int) -> int:
    """Bytes the run will still write at its peak: the checkpoints kept at once (one
    more while a new save replaces the oldest), less those already there, plus the
    float32 `final.npz` export."""
    every, total = plan.checkpoint_every, plan.total_steps
    saves = (total // every + (total % every > 0)) if every > 0 else 1
    kept = min(plan.keep_checkpoints + 1, saves) if plan.keep_checkpoints else saves
    return max(kept * state_bytes - existing, 0) + (params_bytes if plan.export_npz else 0)


def tree_bytes(tree: Any) -> int:
    """Bytes of a tree of arrays or ShapeDtypeStructs, all shards together."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def run_workdirs(path: str | os.PathLike, depth: int = 2) -> list[store.Path]:
    """The training workdirs (directories holding `checkpoints/`) at or under `path`:
    [path] for a run's workdir, else those found up to `depth` levels below it, sorted
    (the recipe's workdir holds pretrain/, finetune/ and scratch/). Hidden directories
    and a workdir's own contents are not searched."""
    path = store.path(path)
    if (path / "checkpoints").is_dir():
        return [path]
    if depth == 0 or not path.is_dir():
        return []
    found = []
    for entry in sorted(path.iterdir(), key=lambda p: p.name):
        if entry.is_dir() and not entry.name.startswith("."):
            found += run_workdirs(entry, depth - 1)
    return found
