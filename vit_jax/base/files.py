"""Files and directories written whole or not at all: built under a temporary name beside
the output, renamed when complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", sync: bool = False) -> Iterator[IO]:
    """Opens `path`.tmp for the block, then renames it to `path`: a crash never leaves
    a half-written `path`, and a block that raises (a full disk) removes the temporary
    file. `sync` flushes it to the disk before the rename.

    Raises:
        FileNotFoundError: `path`'s directory does not exist (named, not the `.tmp` file).
    """
    path = Path(path)
    _check_parent(path)
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


def check_new(path: str | os.PathLike) -> None:
    """The one rule for an output built as a directory (a Hugging Face directory, a
    SavedModel, an ONNX graph with its data): `path` must not exist, or be an empty
    directory.

    Raises:
        FileExistsError: naming `path` and the way out.
    """
    path = Path(path)
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise FileExistsError(f"{path} exists and is not an empty directory: choose another --out")


@contextlib.contextmanager
def scratch_dir(path: str | os.PathLike) -> Iterator[Path]:
    """A new directory beside `path` (same file system, so a rename moves what is built
    in it to `path` at once), removed with whatever is left in it when the block ends."""
    path = Path(path)
    _check_parent(path)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp", dir=path.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary directory for the block to fill, then renames it to `path`: a
    crash never leaves a half-built `path`, and a block that raises leaves nothing.

    Raises:
        FileExistsError: `path` exists and is not an empty directory (`check_new`).
    """
    path = Path(path)
    check_new(path)
    with scratch_dir(path) as tmp:
        yield tmp
        if path.exists():
            path.rmdir()  # empty (check_new)
        os.replace(tmp, path)


def _check_parent(path: Path) -> None:
    """The error of an output whose directory does not exist, naming that directory (the
    temporary file or directory beside `path` would otherwise be what the OS names)."""
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: its directory {path.parent} does not exist")
