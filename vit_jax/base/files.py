"""Files and directories written whole or not at all, on a disk or in an object store.

On a disk, an output is built under a temporary name beside it and renamed when
complete. A store has no rename, and an object appears only once its upload is
complete: an output is built in a local temporary file or directory and uploaded when
complete (a directory's files one by one, then, on failure, removed again).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from vit_jax.base import store


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "wb", sync: bool = False, via: store.Store = store.PLAIN
) -> Iterator[IO]:
    """Opens a temporary file for the block, then puts it at `path`: a crash never leaves
    a half-written `path`, and a block that raises (a full disk) leaves nothing. `sync`
    flushes it to the disk before the rename; `via` uploads it to a store (a run's
    retries through its outages).

    Raises:
        FileNotFoundError: `path`'s directory does not exist (named, not the temporary).
    """
    path = store.path(path)
    if store.is_remote(path):
        with tempfile.TemporaryDirectory(prefix="vit_jax_upload_") as tmp:
            local = os.path.join(tmp, path.name)
            with open(local, mode) as f:
                yield f
            via.upload(local, path)
        return
    _existing_parent(path)
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
    """The one rule for an output built as a directory (a Hugging Face directory, an
    ONNX graph with its data): `path` must not exist, or be an empty
    directory.

    Raises:
        FileExistsError: naming `path` and the way out.
    """
    path = store.path(path)
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise FileExistsError(
            f"{path} exists and is not an empty directory: choose another (out=DIR)"
        )


@contextlib.contextmanager
def scratch_dir(path: str | os.PathLike) -> Iterator[Path]:
    """A new local directory to build `path` in (beside it on a disk, so that a rename
    moves it into place at once; in the temporary directory for a store), removed with
    whatever is left in it when the block ends."""
    path = store.path(path)
    parent = None if store.is_remote(path) else _existing_parent(path)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp", dir=parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a local temporary directory for the block to fill, then puts it at `path`:
    a crash never leaves a half-built `path` on a disk, and a block that raises leaves
    nothing (on a store, a failed upload removes what it uploaded).

    Raises:
        FileExistsError: `path` exists and is not an empty directory (`check_new`).
    """
    check_new(path)
    with scratch_dir(path) as tmp:
        yield tmp
        publish(tmp, path)


def publish(local: str | os.PathLike, path: str | os.PathLike) -> None:
    """Puts the finished local file or directory `local` at `path` (a rename on a disk;
    an upload to a store, undone if it fails midway)."""
    path = store.path(path)
    if not store.is_remote(path):
        if path.is_dir():
            path.rmdir()  # empty (check_new)
        os.replace(local, path)
        return
    files = {os.fspath(local): os.fspath(path)}
    if os.path.isdir(local):
        files = {
            os.path.join(here, name): f"{path}/{os.path.relpath(os.path.join(here, name), local)}"
            for here, _, names in os.walk(local)
            for name in names
        }
    try:
        for source, dest in files.items():
            store.PLAIN.upload(source, dest)
    except BaseException:
        with contextlib.suppress(Exception):
            store.PLAIN.remove_tree(path)
        raise


def _existing_parent(path: store.Path) -> store.Path:
    """The directory of the output `path`.

    Raises:
        FileNotFoundError: it does not exist, naming it (the temporary file or directory
            beside `path` would otherwise be what the OS names).
    """
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: its directory {path.parent} does not exist")
    return path.parent
