"""The integrity record of a checkpoint: what was saved, so that a restore can tell.

Each checkpoint `checkpoints/<step>` holds `integrity.json`, written by process 0 after
Orbax has written every array and before Orbax completes the checkpoint (renames it into
place, or writes its `commit_success.txt`: `manager.commit_mode`), so a complete
checkpoint has a record. It holds:

    step      the step saved
    state     what the state is: model, optimizer and image size (config fields)
    arrays    {name: {'shape', 'dtype', 'shards': {'0:32,0:64': crc32}}}: a CRC-32 of
              the bytes of every shard that some process saved (each process hashes its
              own addressable shards, on the host, one copy of each replicated slice)
    files     {path inside the checkpoint: [bytes, CRC-32]} of every file Orbax wrote for
              the state (read back once Orbax has written them)

Names are Orbax's own ('opt_state.1.mu.head.kernel'). A checkpoint verifies when every
file is there with its size and bytes (so that damage is named by file before Orbax
reads it), it restores without error, every slice of every array hashes as recorded
(end to end: what training held is what came back) and every value is finite.
`quick_check` looks at the record and the file sizes only.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from vit_jax.base import files
from vit_jax.workdir import manager

RECORD = "integrity.json"
SET_ASIDE = ".damaged"  # checkpoints/20 -> checkpoints/20.damaged; Orbax never lists it
FORMAT = 1


def leaf_name(path: tuple) -> str:
    """A tree path -> Orbax's name of the array ('opt_state.1.mu.head.kernel')."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    return ".".join(parts)


def named_leaves(tree: Any) -> list[tuple[str, Any]]:
    """[(name, leaf)] of a TrainState, or of the dict tree Orbax's metadata has."""
    return [(leaf_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def slice_key(index: tuple, shape: tuple) -> str:
    """A shard's index (tuple of slices) -> '0:32,0:64' ('' for a scalar)."""
    bounds = (s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
    return ",".join(f"{start}:{stop}" for start, stop in bounds)


def _slices(key: str) -> tuple:
    return tuple(slice(*map(int, part.split(":"))) for part in key.split(",") if part)


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def start_checksums(tree: Any, pool: concurrent.futures.Executor) -> dict[str, Any]:
    """Starts hashing this process's shards of `tree` (CRC-32 drops the GIL, so the
    pool runs beside an Orbax save). Collect with `collect` before the buffers change
    (the next, donating, train step)."""
    out = {}
    for name, x in named_leaves(tree):
        shards = {}
        for s in getattr(x, "addressable_shards", ()):
            if s.replica_id == 0:  # one copy of each slice over all processes
                shards[slice_key(s.index, x.shape)] = pool.submit(_crc, np.asarray(s.data))
        if not hasattr(x, "addressable_shards"):
            shards[slice_key((slice(None),) * np.ndim(x), np.shape(x))] = pool.submit(_crc, x)
        out[name] = {"shape": list(np.shape(x)), "dtype": str(x.dtype), "shards": shards}
    return out


def collect(started: dict[str, Any]) -> dict[str, Any]:
    """`start_checksums`'s futures -> the 'arrays' of a record (this process's part)."""
    return {
        name: {**a, "shards": {k: f.result() for k, f in a["shards"].items()}}
        for name, a in started.items()
    }


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The 'arrays' of every process -> one, with every process's slices."""
    out: dict[str, Any] = {}
    for part in parts:
        for name, a in part.items():
            out.setdefault(name, {**a, "shards": {}})["shards"].update(a["shards"])
    return out


def file_crc(path: str) -> int:
    """CRC-32 of a file's bytes, read in 16 MiB pieces."""
    crc = 0
    with open(path, "rb") as f:
        while piece := f.read(16 * 2**20):
            crc = zlib.crc32(piece, crc)
    return crc


def list_files(step_dir: str) -> dict[str, list[int]]:
    """{relative path: [bytes, CRC-32]} of the files of the items under `step_dir`
    ('default/...'), not the step's own files, which Orbax rewrites as it completes the
    checkpoint."""
    out = {}
    for root, _, names in os.walk(step_dir):
        if os.path.samefile(root, step_dir):
            continue
        for f in names:
            path = os.path.join(root, f)
            out[os.path.relpath(path, step_dir)] = [os.path.getsize(path), file_crc(path)]
    return out


def write_json(path: str, value: Any) -> None:
    """Writes `value` to `path` whole or not at all (temporary name, fsync, rename)."""
    with files.atomic_write(path, "w", sync=True) as f:
        json.dump(value, f)


def read_record(step_dir: str) -> dict[str, Any] | None:
    """The record of `step_dir`, or None when it has none.

    Raises:
        ValueError: the record is there but unreadable (damaged).
    """
    path = os.path.join(step_dir, RECORD)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        if record.get("format") != FORMAT or not {"step", "arrays", "files"} <= set(record):
            raise ValueError("fields missing")
        return record
    except (OSError, ValueError) as e:
        raise ValueError(f"its integrity record {RECORD} is unreadable ({e})") from None


def check_files(step_dir: str, record: dict[str, Any], contents: bool = True) -> list[str]:
    """What is wrong with the files of `step_dir`: missing, another size, or (with
    `contents`) other bytes; [] if nothing."""
    problems = []
    for rel, (size, crc) in sorted(record["files"].items()):
        path = os.path.join(step_dir, rel)
        if not os.path.isfile(path):
            problems.append(f"file {rel} is missing")
        elif (now := os.path.getsize(path)) != size:
            problems.append(f"file {rel} has {now} bytes, {size} when written")
        elif contents and file_crc(path) != crc:
            problems.append(f"file {rel} fails its checksum")
    return problems


def misfits(record: dict[str, Any], target: Any) -> list[str]:
    """How the arrays of `record` differ from `target`'s (names, shapes, dtypes)."""
    want = {n: (list(x.shape), str(x.dtype)) for n, x in named_leaves(target)}
    have = {n: (a["shape"], a["dtype"]) for n, a in record["arrays"].items()}
    out = [f"{n}: {tuple(have[n][0])} {have[n][1]} saved, {tuple(w[0])} {w[1]} here"
           for n, w in want.items() if n in have and have[n] != w]  # fmt: skip
    out += [f"{n} is not in the checkpoint" for n in want if n not in have]
    out += [f"{n} is not in this run's state" for n in have if n not in want]
    return out


def mismatches(tree: Any, record: dict[str, Any]) -> tuple[list[str], int]:
    """(names of the arrays of `tree` whose bytes differ from the record, number of
    recorded slices this process could not check: another layout over processes)."""
    bad, unchecked = [], 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        got = collect(start_checksums(tree, pool))
    for name, x in named_leaves(tree):
        if name not in record["arrays"]:
            bad.append(name)
            continue
        want, mine = record["arrays"][name]["shards"], got[name]["shards"]
        if set(mine) <= set(want):  # the layout that saved it (on this process)
            wrong = any(mine[k] != want[k] for k in mine)
        elif getattr(x, "is_fully_addressable", True):  # another layout: slice the whole
            host = np.asarray(x)
            wrong = any(_crc(host[_slices(k)]) != c for k, c in want.items())
        else:
            wrong, unchecked = False, unchecked + len(want)
        if wrong:
            bad.append(name)
    return bad, unchecked


def describe(model: dict[str, Any], optimizer: dict[str, Any], image_size: int) -> dict[str, Any]:
    """What the state is, for the record: the model's and optimizer's fields (plain dicts,
    as the config holds them) and the image size."""
    return {"model": model, "optimizer": optimizer, "image_size": image_size}


def summary(description: dict[str, Any] | None) -> str:
    """'ViT Ti/4 (width 32, depth 2), adam, 28 px' from a record's 'state'."""
    if not description:
        return "an unknown state"
    m = description.get("model", {})
    shape = ", ".join(f"{k} {m[k]}" for k in ("width", "depth", "patch_size") if m.get(k))
    opt = description.get("optimizer", {}).get("name", "?")
    return f"{m.get('name', '?')} ({shape}), {opt}, {description.get('image_size')} px"


def step_dirs(directory: str) -> list[int]:
    """The steps of the complete checkpoints in `directory`, ascending.

    Orbax's own listing (the names its CheckpointManager writes): '<step>.damaged',
    Orbax's temporary directories, `.pending` and plain files are not steps, nor (in the
    commit-file mode, `manager.commit_mode`) a `<step>` without Orbax's marker.
    """
    found = ocp.path.step.standard_name_format().find_all(directory)
    return sorted(
        m.step for m in found if manager.is_complete(os.path.join(directory, str(m.step)))
    )


def quick_check(step_dir: str) -> list[str]:
    """What the record and the file sizes say is wrong with `step_dir` ([] if nothing),
    without reading the files."""
    try:
        record = read_record(step_dir)
    except ValueError as e:
        return [str(e)]
    if record is None:
        return [f"it has no integrity record {RECORD}"]
    return check_files(step_dir, record, contents=False)


def newest_intact(directory: str) -> int | None:
    """The newest checkpoint in `directory` whose record and files check, or None."""
    for step in reversed(step_dirs(directory)):
        if not quick_check(os.path.join(directory, str(step))):
            return step
    return None


def newest_intact_sentence(directory: str) -> str:
    """Where a rerun goes on, as every message of a stopped run says it: 'The newest
    intact checkpoint is step 30 (DIR/30); a rerun resumes there', or 'There is no
    intact checkpoint yet; a rerun starts from step 0'."""
    good = newest_intact(directory)
    if good is None:
        return "There is no intact checkpoint yet; a rerun starts from step 0"
    return (
        f"The newest intact checkpoint is step {good} ({directory}/{good}); a rerun resumes there"
    )


@jax.jit
def all_finite(tree: Any) -> jax.Array:
    """bool[]: whether every floating-point value of `tree` is finite."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def set_aside(directory: str, step: int) -> str:
    """Renames checkpoint `step` to '<step>.damaged' (or '.damaged.2', ...); its name."""
    name, n = f"{step}{SET_ASIDE}", 1
    while os.path.exists(os.path.join(directory, name)):
        n += 1
        name = f"{step}{SET_ASIDE}.{n}"
    os.replace(os.path.join(directory, str(step)), os.path.join(directory, name))
    return name
