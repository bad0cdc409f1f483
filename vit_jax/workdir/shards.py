"""The integrity record's CRC-32s of array shards: computed by each process as a save
starts (`checksums`, gathered over processes by `merge_gathered`), compared when a
checkpoint is restored (verify.py).

  named_leaves              a state's arrays under Orbax's names ('opt_state.1.mu.head.kernel')
  slices                    '0:32,0:64' -> a shard's index
  crc                       CRC-32 of an array's bytes, any dtype
"""

from __future__ import annotations

import concurrent.futures
import json
import zlib
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


def named_leaves(tree: Any) -> list[tuple[str, Any]]:
    """[(name, leaf)] of a TrainState, or of the dict tree Orbax's metadata has; a name is
    Orbax's, the path's keys, attribute names and indices joined by dots."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [(jax.tree_util.keystr(p, simple=True, separator="."), x) for p, x in flat]


def _slice_key(index: tuple, shape: tuple) -> str:
    """A shard's index (tuple of slices) -> '0:32,0:64' ('' for a scalar)."""
    bounds = (s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
    return ",".join(f"{start}:{stop}" for start, stop in bounds)


def slices(key: str) -> tuple:
    """'0:32,0:64' -> the shard's index (a tuple of slices)."""
    return tuple(slice(*map(int, part.split(":"))) for part in key.split(",") if part)


def crc(a: np.ndarray) -> int:
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
                shards[_slice_key(s.index, x.shape)] = pool.submit(crc, np.asarray(s.data))
        if not hasattr(x, "addressable_shards"):
            shards[_slice_key((slice(None),) * np.ndim(x), np.shape(x))] = pool.submit(crc, x)
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


def merge_gathered(mine: dict[str, Any]) -> dict[str, Any]:
    """Every process's checksums in one (JSON, padded to one length, all-gathered)."""
    data = np.frombuffer(json.dumps(mine).encode(), np.uint8)
    longest = int(np.max(multihost_utils.process_allgather(np.array([len(data)]))))
    padded = np.zeros(longest, np.uint8)
    padded[: len(data)] = data
    every = multihost_utils.process_allgather(padded)  # [processes, longest]
    return merge([json.loads(bytes(row).rstrip(b"\0")) for row in np.asarray(every)])
