"""Files written whole or not at all."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", sync: bool = False) -> Iterator[IO]:
    """Opens `path`.tmp for the block, then renames it to `path`: a crash never leaves
    a half-written `path`, and a block that raises (a full disk) removes the temporary
    file. `sync` flushes it to the disk before the rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, mode) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
