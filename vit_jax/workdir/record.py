"""The integrity record of a checkpoint, `<step>/integrity.json`: written by process 0 as
a save completes (checkpoints.py), read before a restore (verify.py). It holds:

    step      the step saved
    state     what the state is: model, optimizer and image size (config fields)
    arrays    {name: {'shape', 'dtype', 'shards': {'0:32,0:64': crc32}}}: a CRC-32 of the
              bytes of every shard that some process saved (each process hashes its own
              addressable shards on the host, as the save starts, one copy of each
              replicated slice; process 0 gathers them with process_allgather: shards.py)
    files     {path inside the checkpoint: bytes} of every file Orbax wrote for the state

Names are Orbax's own ('opt_state.1.mu.head.kernel').
"""

from __future__ import annotations

import json
from typing import Any

from vit_jax.base import files, store

NAME = "integrity.json"  # the record, in each checkpoint
FORMAT = 2  # 1: files as [bytes, crc32] (read too)


def write_record(step_dir: store.Path, record: dict[str, Any], via: store.Store) -> None:
    """Writes the record of `step_dir`, with the sizes of every file Orbax wrote there."""
    found = via.walk_files(step_dir)
    record = {**record, "format": FORMAT, "files": {k: n for k, n in found.items() if "/" in k}}
    with files.atomic_write(step_dir / NAME, "w", sync=True, via=via) as f:
        json.dump(record, f)


def read_record(step_dir: store.Path, via: store.Store = store.PLAIN) -> dict[str, Any] | None:
    """The record of `step_dir`, or None when it has none.

    Raises:
        ValueError: the record is there but unreadable (damaged).
    """
    try:
        text = via.read_text(step_dir / NAME)
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if record.get("format") not in (1, FORMAT) or {"step", "arrays", "files"} - set(record):
            raise ValueError("fields missing")
        return record
    except (OSError, ValueError) as e:
        raise ValueError(f"its integrity record {NAME} is unreadable ({e})") from None


def file_problems(
    step_dir: store.Path, record: dict[str, Any], via: store.Store = store.PLAIN
) -> list[str]:
    """What is wrong with the files of `step_dir`: missing, or of another size."""
    found = via.walk_files(step_dir)
    problems = []
    for rel, size in sorted(record["files"].items()):
        size = size[0] if isinstance(size, list) else size  # format 1: [bytes, crc]
        if rel not in found:
            problems.append(f"file {rel} is missing")
        elif found[rel] != size:
            problems.append(f"file {rel} has {found[rel]} bytes, {size} when written")
    return problems
