"""The integrity record of a checkpoint: what was saved, so that a restore can tell.

Each checkpoint `checkpoints/<step>` holds `integrity.json`, written by process 0 after
Orbax has written every array and before it marks the checkpoint complete
(`checkpoints.py`), so a complete checkpoint has a record. It holds:

    step      the step saved
    state     what the state is: model, optimizer and image size (config fields)
    arrays    {name: {'shape', 'dtype', 'shards': {'0:32,0:64': crc32}}}: a CRC-32 of the
              bytes of every shard that some process saved (each process hashes its own
              addressable shards, on the host, one copy of each replicated slice)
    files     {path inside the checkpoint: bytes} of every file Orbax wrote for the state

Names are Orbax's own ('opt_state.1.mu.head.kernel'). A checkpoint verifies when every
file is there at its size (so that damage is named by file before Orbax reads it), it
restores, every slice of every array hashes as recorded (end to end: what training held
is what came back) and every value is finite.
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

from vit_jax.base import files, store

NAME = "integrity.json"
FORMAT = 2  # 1: files as [bytes, crc32] (read too)


def describe(model: dict[str, Any], optimizer: dict[str, Any], image_size: int) -> dict[str, Any]:
    """What the state is, for the record: the model's and optimizer's fields (plain dicts,
    as the config holds them) and the image size."""
    return {"model": model, "optimizer": optimizer, "image_size": image_size}


def summary(description: dict[str, Any] | None) -> str:
    """'Ti/4 (width 32, depth 2), adam, 28 px' from a record's 'state'."""
    if not description:
        return "an unknown state"
    m = description.get("model", {})
    shape = ", ".join(f"{k} {m[k]}" for k in ("width", "depth", "patch_size") if m.get(k))
    opt = description.get("optimizer", {}).get("name", "?")
    return f"{m.get('name', '?')} ({shape}), {opt}, {description.get('image_size')} px"


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


def _slice_key(index: tuple, shape: tuple) -> str:
    """A shard's index (tuple of slices) -> '0:32,0:64' ('' for a scalar)."""
    bounds = (s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
    return ",".join(f"{start}:{stop}" for start, stop in bounds)


def _slices(key: str) -> tuple:
    return tuple(slice(*map(int, part.split(":"))) for part in key.split(",") if part)


def _crc(a: np.ndarray) -> int:
    """CRC-32 of the array's bytes, any dtype (bfloat16 has no buffer format of its own)."""
    return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def checksums(tree: Any, pool: concurrent.futures.Executor) -> dict[str, Any]:
    """This process's part of a record's 'arrays': a CRC-32 of each of its shards (one
    copy of each slice over all processes), hashed on `pool` (CRC-32 drops the GIL)."""
    started = {}
    for name, x in named_leaves(tree):
        shards = {}
        for s in getattr(x, "addressable_shards", ()):
            if s.replica_id == 0:
                shards[_slice_key(s.index, x.shape)] = pool.submit(_crc, np.asarray(s.data))
        if not hasattr(x, "addressable_shards"):
            shards[_slice_key((slice(None),) * np.ndim(x), np.shape(x))] = pool.submit(_crc, x)
        started[name] = {"shape": list(np.shape(x)), "dtype": str(x.dtype), "shards": shards}
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


def write(step_dir: store.Path, record: dict[str, Any]) -> None:
    """Writes the record of `step_dir`, with the sizes of every file Orbax wrote there."""
    found = store.walk_files(step_dir)
    record = {**record, "format": FORMAT, "files": {k: n for k, n in found.items() if "/" in k}}
    with files.atomic_write(step_dir / NAME, "w", sync=True) as f:
        json.dump(record, f)


def read(step_dir: store.Path) -> dict[str, Any] | None:
    """The record of `step_dir`, or None when it has none.

    Raises:
        ValueError: the record is there but unreadable (damaged).
    """
    path = step_dir / NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if record.get("format") not in (1, FORMAT) or not {"step", "arrays", "files"} <= set(
            record
        ):
            raise ValueError("fields missing")
        return record
    except (OSError, ValueError) as e:
        raise ValueError(f"its integrity record {NAME} is unreadable ({e})") from None


def file_problems(step_dir: store.Path, record: dict[str, Any]) -> list[str]:
    """What is wrong with the files of `step_dir`: missing, or of another size."""
    found = store.walk_files(step_dir)
    problems = []
    for rel, size in sorted(record["files"].items()):
        size = size[0] if isinstance(size, list) else size  # format 1: [bytes, crc]
        if rel not in found:
            problems.append(f"file {rel} is missing")
        elif found[rel] != size:
            problems.append(f"file {rel} has {found[rel]} bytes, {size} when written")
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
            wrong = any(_crc(host[_slices(k)]) != c for k, c in want.items())
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
