"""Restoring only what verifies: damaged checkpoints are named, set aside, and skipped.

A checkpoint verifies when its integrity record is readable, every file it lists is
there with its size and CRC-32, Orbax restores it without error, every slice of every
array hashes as recorded and every value is finite (`integrity.py`). One that does not
is renamed `<step>.damaged` (nothing is deleted: a person can look) and the run falls
back to the next older one.
A checkpoint without a record (an older vit_jax, or Orbax directly, wrote it; a save
killed before its record never gets its final name) is used when it restores whole and
finite, and said to be unchecked. A checkpoint of another shape is not damage: it stops
the run with `manager.does_not_fit`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from vit_jax.base.text import first_few
from vit_jax.parallel import distributed
from vit_jax.workdir import integrity, saver
from vit_jax.workdir import manager as manager_lib

SCRATCH_FLAG = "--config.from_scratch_if_damaged=True"
DAMAGED = "DAMAGED"


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


def check(manager: ocp.CheckpointManager, step: int, target: Any = None) -> Verdict:
    """Checks checkpoint `step`, restoring it laid out as `target` (ShapeDtypeStructs
    with shardings); None: as saved, on one device (`verify`).

    Raises:
        ValueError: with a target, the checkpoint was written by a state of another shape.
    """
    step_dir = os.path.join(str(manager.directory), str(step))
    try:
        record = integrity.read_record(step_dir)
    except ValueError as e:
        return Verdict(step, [str(e)], True)
    if record is not None:
        if target is not None and (misfit := integrity.misfits(record, target)):
            raise manager_lib.misfit_error(step_dir, misfit, _misfit_text(record, misfit))
        if problems := integrity.check_files(step_dir, record):
            return Verdict(step, [first_few(problems, "; ", unit="files")], True)
    try:
        layout = target if target is not None else _as_saved(manager, step)
        state = manager.restore(step, args=ocp.args.StandardRestore(layout))
    except Exception as e:  # noqa: BLE001 (whatever Orbax or TensorStore raise: unreadable)
        unknown = record is None and target is not None  # damage, or another shape?
        misfit = _metadata_misfits(manager, step, target) if unknown else []
        if misfit:
            raise manager_lib.misfit_error(step_dir, misfit, first_few(misfit, "; ")) from e
        return Verdict(step, [f"it is unreadable ({_cause(e, step_dir)})"], record is not None)
    problems = []
    if record is not None:
        bad, _ = integrity.mismatches(state, record)
        if bad:
            problems.append(f"{len(bad)} arrays fail their checksums ({first_few(bad)})")
    if not problems and not bool(integrity.all_finite(state)):
        problems.append("it restores non-finite values")
    return Verdict(step, problems, record is not None, None if problems else state)


def restore_newest(
    manager: ocp.CheckpointManager, target: Any, from_scratch: bool = False
) -> tuple[Any, int | None]:
    """(state, step) of the newest checkpoint that verifies, laid out as `target`;
    (None, None) when there is none. Every process must call it.

    Raises:
        ValueError: a checkpoint of another shape (`manager.does_not_fit`).
        OSError: there are checkpoints, none verifies and not `from_scratch`: lists them.
    """
    directory, lead = str(manager.directory), distributed.is_lead()
    saver.quiet_reported_failures()
    damaged = []
    for step in reversed(integrity.step_dirs(directory)):
        verdict = check(manager, step, target)
        if _everywhere(not verdict.problems):
            if not verdict.recorded and lead:
                print(
                    f"checkpoint {directory}/{step} has no integrity record (an older "
                    "vit_jax, or Orbax directly, wrote it): it restores whole and finite; "
                    "its checksums cannot be checked",
                    flush=True,
                )
            _reload(manager, damaged)
            return verdict.state, step
        name = integrity.set_aside(directory, step) if lead else f"{step}{integrity.SET_ASIDE}"
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"set aside {step}")
        why = "; ".join(verdict.problems) or "it fails on another process"
        if lead:
            print(
                f"checkpoint {directory}/{step} is damaged: {why}. Set aside as "
                f"{directory}/{name} (nothing deleted); trying the one before",
                flush=True,
            )
        damaged.append(f"step {step} ({why}; now {name})")
    _reload(manager, damaged)
    if damaged and not from_scratch:
        raise OSError(
            f"no checkpoint in {directory} verifies: {'; '.join(damaged)}. To start again "
            f"from step 0 in this workdir, rerun with {SCRATCH_FLAG}; the damaged ones stay "
            "set aside"
        )
    if damaged and lead:
        print(f"no checkpoint verifies; starting from step 0 ({SCRATCH_FLAG})", flush=True)
    return None, None


def restore(
    manager: ocp.CheckpointManager, abstract: Any, shardings: Any, from_scratch: bool = False
) -> Any:
    """The newest checkpoint that verifies, laid out as `shardings` say (whatever mesh
    wrote it), its shapes and dtypes those of `abstract`; None when there is none (or,
    with `from_scratch`, none verifies). Every process must call it.

    Raises:
        ValueError: a checkpoint of another shape (`manager.does_not_fit`).
        OSError: there are checkpoints, none verifies and not `from_scratch`.
    """
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    state, step = restore_newest(manager, target, from_scratch)
    if state is not None and distributed.is_lead():
        print(f"resuming from step {step} (checkpoint {manager.directory}/{step})", flush=True)
    return state


def verify_workdir(workdir: str) -> list[tuple[str, str]]:
    """[(checkpoint name, what it is)] for everything under `workdir/checkpoints`, each
    checkpoint restored on one device and checked; nothing is changed."""
    directory = os.path.join(workdir, "checkpoints")
    saver.quiet_reported_failures()
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory} does not exist: is {workdir} a training workdir?")
    manager = manager_lib.open_reader(directory)
    rows = []
    for name in sorted(os.listdir(directory), key=_name_order):
        incomplete = manager_lib.TMP_MARK in name or (
            name.isdigit() and not manager_lib.is_complete(os.path.join(directory, name))
        )
        if incomplete:
            rows.append((name, "incomplete (an interrupted save; the next run deletes it)"))
        elif name.isdigit():
            rows.append((name, check(manager, int(name)).line()))
        elif integrity.SET_ASIDE in name:
            rows.append((name, "set aside (found damaged by an earlier run)"))
    return rows


def run_workdirs(path: str, depth: int = 2) -> list[str]:
    """The training workdirs (directories holding `checkpoints/`) at or under `path`:
    [path] for a run's workdir, else those found up to `depth` levels below it, sorted
    (the recipe's workdir holds pretrain/, finetune/ and scratch/). Hidden directories
    and a workdir's own contents are not searched."""
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return [path]
    if depth == 0 or not os.path.isdir(path):
        return []
    found = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir() and not entry.name.startswith("."):
            found += run_workdirs(os.path.join(path, entry.name), depth - 1)
    return found


def _as_saved(manager: ocp.CheckpointManager, step: int) -> Any:
    """A restore target from Orbax's metadata: every array as saved, on one device."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    metadata = manager.item_metadata(step)
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)


def _metadata_misfits(manager: ocp.CheckpointManager, step: int, target: Any) -> list[str]:
    """How Orbax's metadata of `step` differs from `target`; [] if it is unreadable."""
    try:
        saved = {n: m for n, m in integrity.named_leaves(manager.item_metadata(step))}
    except Exception:  # noqa: BLE001 (unreadable metadata is damage, not another shape)
        return []
    arrays = {n: {"shape": list(m.shape), "dtype": str(m.dtype)} for n, m in saved.items()}
    return integrity.misfits({"arrays": arrays}, target)


def _misfit_text(record: dict[str, Any], misfit: list[str]) -> str:
    saved = integrity.summary(record.get("state"))
    return f"it holds {saved}; {first_few(misfit, '; ')}"


def _everywhere(ok: bool) -> bool:
    """Whether `ok` holds on every process (all of them decide alike)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.array(ok))))


def _reload(manager: ocp.CheckpointManager, changed: list) -> None:
    if changed:
        manager.reload()  # Orbax's list of steps forgets the ones set aside


def _cause(e: BaseException, step_dir: str) -> str:
    """A TensorStore or Orbax error in a few words: 'DATA_LOSS reading params.cls from
    default/ocdbt.process_0/d/0e2f...' (the first line of anything else)."""
    text = str(e).strip()
    code = re.match(r"([A-Z][A-Z_]{3,}): ", text)
    if not code:
        return (text.splitlines()[0] if text else type(e).__name__)[:300]
    words = [code[1]]
    if array := re.search(r'Error reading "([^"/]+)/', text):
        words.append(f"reading {array[1]}")
    if files := re.findall(r'local file "([^"]+)"', text):
        words.append(f"from {os.path.relpath(files[-1], step_dir)}")
    return " ".join(words)


def _name_order(name: str) -> tuple[int, str]:
    digits = name.split(".")[0]
    return (int(digits) if digits.isdigit() else -1, name)
