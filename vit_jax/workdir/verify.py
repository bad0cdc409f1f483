"""Restoring only what verifies: a checkpoint's files at their recorded sizes (so that
damage is named by file before Orbax reads it), an Orbax restore, every shard's
checksum against its integrity record (end to end: what training held is what came
back) and finite values.

A checkpoint that does not verify is set aside into `workdir/damaged/<step>` (nothing is
deleted: a person can look; Orbax never lists it) and the run falls back to the one
before. One without a record (Orbax alone, or an older vit_jax, wrote it) is used when
it restores whole and finite, and said to be unchecked. A checkpoint of another shape is
not damage: it stops the run (`does_not_fit`). A restore lays the arrays out as the new
run's mesh says, whatever mesh wrote them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from vit_jax.base import failures, store
from vit_jax.base.console import first_few
from vit_jax.workdir.checkpoints import DAMAGED, Checkpoints
from vit_jax.workdir.record import file_problems, read_record
from vit_jax.workdir.shards import checksums, crc, named_leaves, slices

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


def check(checkpoints: Checkpoints, step: int, target: Any = None) -> Verdict:
    """Checks checkpoint `step`, restoring it laid out as `target` (ShapeDtypeStructs
    with shardings); None: as saved, on one device (`verify`).

    Raises:
        ValueError: with a target, the checkpoint was written by a state of another shape.
        the store's own error where a bucket did not answer the restore (a run rides such
            an outage out first: store.retry_seconds).
    """
    step_dir = checkpoints.directory / str(step)
    try:
        found = read_record(step_dir, checkpoints.store)
    except ValueError as e:
        return Verdict(step, [str(e)], True)
    if found is not None:
        if target is not None and (why := base_changed(found, checkpoints.description)):
            raise ValueError(f"checkpoint {step_dir} {why}")
        if target is not None and (misfit := misfits(found, target)):
            detail = f"it holds {summary(found.get('state'))}; {first_few(misfit, '; ')}"
            raise does_not_fit(step_dir, detail, misfit)
        if problems := file_problems(step_dir, found, checkpoints.store):
            return Verdict(step, [first_few(problems, "; ", unit="files")], True)
    try:
        layout = target if target is not None else _as_saved(checkpoints, step)
        restore = lambda: checkpoints.manager.restore(step, args=ocp.args.StandardRestore(layout))
        state = checkpoints.store.retried(restore, f"restoring {step_dir}")  # an outage: not damage
    except Exception as e:  # noqa: BLE001 (whatever Orbax or TensorStore raise)
        if store.is_remote(step_dir) and failures.transient(e):  # outside a run's window
            raise  # the store did not answer: not damage
        misfit = _metadata_misfits(checkpoints, step, target) if found is None and target else []
        if misfit:
            raise does_not_fit(step_dir, first_few(misfit, "; "), misfit) from e
        return Verdict(step, [f"it is unreadable ({_cause(e)})"], found is not None)
    problems = []
    if found is not None and (bad := mismatches(state, found)):
        problems.append(f"{len(bad)} arrays fail their checksums ({first_few(bad)})")
    if not problems and not bool(all_finite(state)):
        problems.append("it restores non-finite values")
    return Verdict(step, problems, found is not None, None if problems else state)


def restore_newest(
    checkpoints: Checkpoints, target: Any, from_scratch: bool = False
) -> tuple[Any, int | None]:
    """(state, step) of the newest checkpoint that verifies, laid out as `target`;
    (None, None) when there is none. Every process must call it.

    Raises:
        ValueError: a checkpoint of another shape (`does_not_fit`).
        OSError: there are checkpoints, none verifies and not `from_scratch`.
    """
    lead, damaged = jax.process_index() == 0, []
    for step in reversed(checkpoints.steps()):
        verdict, where = check(checkpoints, step, target), f"{checkpoints.directory}/{step}"
        if _everywhere(not verdict.problems):
            if lead and not verdict.recorded:
                print(
                    f"checkpoint {where} has no integrity record (an older vit_jax, or Orbax "
                    "directly, wrote it): it restores whole and finite; its checksums cannot "
                    "be checked",
                    flush=True,
                )
            if lead:
                print(f"resuming from step {step} (checkpoint {where})", flush=True)
            return verdict.state, step
        why = "; ".join(verdict.problems) or "it fails on another process"
        aside = checkpoints.set_aside(step)
        if lead:
            print(
                f"checkpoint {where} is damaged: {why}. Set aside as {aside} (nothing "
                "deleted); trying the one before",
                flush=True,
            )
        damaged.append(f"step {step} ({why}; now {aside})")
    if damaged and not from_scratch:
        raise OSError(
            f"no checkpoint in {checkpoints.directory} verifies: {'; '.join(damaged)}. To start "
            f"again from step 0 in this workdir, rerun with {SCRATCH_FIELD}=True; the "
            "damaged ones stay set aside"
        )
    if damaged and lead:
        print(f"no checkpoint verifies; starting from step 0 ({SCRATCH_FIELD}=True)", flush=True)
    return None, None


def verify(checkpoints: Checkpoints) -> list[tuple[str, str]]:
    """[(name, what it is)] of every checkpoint, incomplete save and set-aside one,
    each checkpoint restored on one device and checked; nothing is changed."""
    rows = [
        (name, "incomplete (an interrupted save; the next run deletes it)")
        for name in checkpoints.incomplete()
    ]
    rows += [(str(step), check(checkpoints, step).line()) for step in checkpoints.steps()]
    if checkpoints.damaged.exists():
        rows += [
            (f"damaged/{p.name}", "set aside (found damaged by an earlier run)")
            for p in checkpoints.damaged.iterdir()
        ]
    return sorted(rows, key=lambda row: _order(row[0]))


def _as_saved(checkpoints: Checkpoints, step: int) -> Any:
    """A restore target from Orbax's metadata: every array as saved, on one device."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    metadata = checkpoints.manager.item_metadata(step)
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)


def _metadata_misfits(checkpoints: Checkpoints, step: int, target: Any) -> list[str]:
    try:
        saved = named_leaves(checkpoints.manager.item_metadata(step))
    except Exception:  # noqa: BLE001 (unreadable metadata is damage, not another shape)
        return []
    arrays = {n: {"shape": list(m.shape), "dtype": str(m.dtype)} for n, m in saved}
    return misfits({"arrays": arrays}, target)


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


def summary(description: dict[str, Any] | None) -> str:
    """'Ti/4 (width 32, depth 2), adam, 28 px' from a record's 'state'."""
    if not description:
        return "an unknown state"
    m = description.get("model", {})
    shape = ", ".join(f"{k} {m[k]}" for k in ("width", "depth", "patch_size") if m.get(k))
    opt = description.get("optimizer", {}).get("name", "?")
    return f"{m.get('name', '?')} ({shape}), {opt}, {description.get('image_size')} px"


def base_changed(record: dict[str, Any], description: dict[str, Any]) -> str | None:
    """How a LoRA checkpoint's base (init_from, by its SHA-256) differs from this run's."""
    was, now = record.get("state", {}).get("lora"), description.get("lora")
    if not was or not now or was.get("sha256") == now.get("sha256"):
        return None
    return (
        f"holds LoRA adapters of init_from {was['init_from']} (sha256 {was['sha256'][:12]}), "
        f"and {now['init_from']} is another file now (sha256 {now['sha256'][:12]}): put "
        "the file it was trained from back, or start in another workdir"
    )


def misfits(record: dict[str, Any], target: Any) -> list[str]:
    """How the arrays of `record` differ from `target`'s (names, shapes, dtypes)."""
    want = {n: (list(x.shape), str(x.dtype)) for n, x in named_leaves(target)}
    have = {n: (a["shape"], a["dtype"]) for n, a in record["arrays"].items()}
    out = [
        f"{n}: {tuple(have[n][0])} {have[n][1]} saved, {tuple(w[0])} {w[1]} here"
        for n, w in want.items()
        if n in have and have[n] != w
    ]
    out += [f"{n} is not in the checkpoint" for n in want if n not in have]
    out += [f"{n} is not in this run's state" for n in have if n not in want]
    return out


def mismatches(tree: Any, record: dict[str, Any]) -> list[str]:
    """The names of the arrays of `tree` whose bytes differ from the record (in any
    layout: slices another layout saved are cut from the whole array where this process
    holds it)."""
    bad = []
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        got = checksums(tree, pool)
    for name, x in named_leaves(tree):
        if name not in record["arrays"]:
            bad.append(name)
            continue
        want, mine = record["arrays"][name]["shards"], got[name]["shards"]
        if set(mine) <= set(want):  # the layout that saved it (on this process)
            wrong = any(mine[k] != want[k] for k in mine)
        elif getattr(x, "is_fully_addressable", True):
            host = np.asarray(x)
            wrong = any(crc(host[slices(k)]) != c for k, c in want.items())
        else:  # another layout over several processes: the values are checked finite
            wrong = False
        if wrong:
            bad.append(name)
    return bad


@jax.jit
def all_finite(tree: Any) -> jax.Array:
    """bool[]: whether every floating-point value of `tree` is finite."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))
