"""One path type for every file the package reads or writes: local paths and object-store
URLs (gs://, s3://) alike, as `etils.epath.Path` (the type Orbax uses).

  path(p)            a str or path -> epath.Path: a URL stays a URL, '~' is expanded
  absolute(p)        the same, a local path made absolute (a workdir, checkpoints); an
                     s3:// one refused (NO_S3_WORKDIR)
  is_remote(p)       whether it names an object in a store
  Store(window)      the operations (create_new for locks, read_text, write_text,
                     exists, makedirs, remove, upload, walk_files, remove_tree, move;
                     `retried` for Orbax's own), each deciding what success on a retry
                     means; a run's on a store retry through its outage.Window, PLAIN
                     tries each once
  explain(error, p)  what a store's failure means, in a line with the way out (what
                     kind of failure it is: `failures`)

Object stores reach the package through fsspec (gcsfs, s3fs), one backend whether or not
TensorFlow is installed, their clients set up once for the process when vit_jax.base is
first imported (`clients.configure`). A store has no directories and no rename: files are
written whole (`base/files.py`) and never renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from etils import epath

from vit_jax.base.failures import REASONS, status_of, transient

Path = epath.Path
T = TypeVar("T")
SCHEMES = ("gs://", "s3://")
_PACKAGES = {"gs": "gcsfs", "s3": "s3fs"}


def path(p: str | os.PathLike) -> epath.Path:
    """`p` as an epath.Path; local paths with '~' expanded."""
    if isinstance(p, epath.Path):
        return p
    text = os.fspath(p)
    return epath.Path(text if text.startswith(SCHEMES) else os.path.expanduser(text))


# Orbax (0.12.8, the newest) builds the TensorStore spec of a checkpoint's arrays for gs://
# or a local path only: an s3:// checkpoint failed at its first save. TensorStore's s3 driver
# works, but Orbax offers no public way to hand it one; until it does, refused up front.
NO_S3_WORKDIR = (
    "workdir {p}: Orbax writes checkpoint arrays only to gs:// or a local path, not s3:// "
    "(TensorStore's s3 driver is not one it offers): use a gs:// workdir or a local or NFS "
    "path (weights and data files on s3:// still work)"
)


def absolute(p: str | os.PathLike) -> epath.Path:
    """`path(p)`, a local one made absolute (Orbax refuses relative checkpoint paths).

    Raises:
        ValueError: `p` is on s3://, where Orbax cannot save (NO_S3_WORKDIR), before any work.
    """
    if os.fspath(p).startswith("s3://"):
        raise ValueError(NO_S3_WORKDIR.format(p=os.fspath(p)))
    return path(p) if is_remote(p) else epath.Path(os.path.abspath(path(p)))


def is_remote(p: str | os.PathLike) -> bool:
    """Whether `p` names an object in a store (gs://, s3://)."""
    return os.fspath(p).startswith(SCHEMES)


def filesystem(p: str | os.PathLike) -> Any:
    """The fsspec filesystem of a remote `p`.

    Raises:
        ImportError: its package (gcsfs, s3fs) is not installed, naming the install.
    """
    import fsspec

    scheme = os.fspath(p).split("://", 1)[0]
    try:
        return fsspec.filesystem("gcs" if scheme == "gs" else scheme)
    except ImportError:
        raise ImportError(
            f"{p}: {scheme}:// paths need the {_PACKAGES[scheme]} package: "
            f"pip install 'vit_jax[{'gcs' if scheme == 'gs' else 's3'}]'"
        ) from None


class Store:
    """The operations on files and objects. Those of a run on gs:// or s3:// go through its
    `window`: a transient failure is retried with backoff while the window lasts, a
    permanent one (403, 404, credentials) raised at once, and each operation says what
    success means when an earlier try reached the store but its answer was lost. Without
    a window (`PLAIN`) each operation is tried once (the clients retry within it)."""

    def __init__(self, window: Any = None):
        self.window = window  # an outage.Window (outage.py sits above this module)

    def retried(self, fn: Callable[[], T], what: str) -> T:
        """fn(), an operation that a retry repeats safely (a read, a whole overwrite, an
        Orbax restore or listing), retried through the window."""
        tries = 0
        while True:
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001 (transient ones only; the rest raised)
                if not self.rides_out(e, what):
                    raise
                tries += 1
                time.sleep(min(2.0 ** min(tries, 4), 10.0) * (0.5 + random.random()))
                continue
            if self.window is not None:
                self.window.answered()
            return out

    def rides_out(self, error: BaseException, what: str = "") -> bool:
        """Whether `error` is the store not answering inside a window, which it rides out
        (the failure counts towards the window: the run stops once it has passed)."""
        if self.window is None or not transient(error):
            return False
        self.window.failed(f"{what}: {error}" if what else error)
        return True

    def create_new(self, p: str | os.PathLike, data: bytes) -> bool:
        """Writes `data` to `p` if nothing is there, in one atomic step (O_EXCL on a disk;
        the store's precondition: GCS ifGenerationMatch=0, S3 If-None-Match); False if
        something is (another writer won). `data` must be the writer's own (a lock names
        its process): a create whose answer was lost, retried by the client or here, finds
        the object holding these bytes, and that is success."""
        p = path(p)
        if not is_remote(p):
            return _create_local(p, data)

        def create() -> bool:
            try:
                filesystem(p).pipe_file(os.fspath(p), data, mode="create")
            except FileExistsError:
                try:
                    return p.read_bytes() == data
                except FileNotFoundError:
                    return False  # removed since: the caller looks again
            return True

        return self.retried(create, f"creating {p}")

    def read_text(self, p: str | os.PathLike) -> str:
        """The text of the small file at `p`."""
        return self.retried(path(p).read_text, f"reading {p}")

    def write_text(self, p: str | os.PathLike, text: str) -> None:
        """Writes the small file at `p` whole (a retry writes the same again)."""
        self.retried(lambda: path(p).write_text(text), f"writing {p}")

    def exists(self, p: str | os.PathLike) -> bool:
        """Whether a file or directory is at `p`."""
        return self.retried(path(p).exists, f"reading {p}")

    def makedirs(self, p: str | os.PathLike) -> None:
        """The directory `p` and its parents, on a disk (a store has no directories)."""
        if not is_remote(p):
            os.makedirs(path(p), exist_ok=True)

    def remove(self, p: str | os.PathLike) -> None:
        """Removes the file at `p`; one already gone (by an earlier try) is success."""
        p = path(p)
        self.retried(lambda: p.unlink(missing_ok=True), f"removing {p}")

    def upload(self, local: str | os.PathLike, p: str | os.PathLike) -> None:
        """Puts the local file `local` at the remote `p`, whole (a retry uploads again)."""
        fs = filesystem(p)
        self.retried(lambda: fs.put_file(os.fspath(local), os.fspath(p)), f"writing {p}")

    def walk_files(self, root: str | os.PathLike) -> dict[str, int]:
        """{path relative to `root`: bytes} of every file below `root` (one listing on a
        store); {} when there is none."""
        root = path(root)
        if not is_remote(root):
            files = (f for f in pathlib.Path(root).rglob("*") if f.is_file())
            return {str(f.relative_to(root)): f.stat().st_size for f in files}
        prefix = os.fspath(root).split("://", 1)[1].rstrip("/") + "/"

        def find() -> dict[str, int]:
            found = filesystem(root).find(os.fspath(root), detail=True)
            return {
                k[len(prefix) :]: int(v["size"]) for k, v in found.items() if k.startswith(prefix)
            }

        return self.retried(find, f"listing {root}")

    def remove_tree(self, p: str | os.PathLike) -> None:
        """Removes `p` and everything below it; nothing if it is not there (already gone,
        by an earlier try, is success)."""
        p = path(p)
        if not is_remote(p):
            if p.exists():
                p.rmtree()
            return

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                filesystem(p).rm(os.fspath(p), recursive=True)

        self.retried(remove, f"removing {p}")

    def move(self, source: str | os.PathLike, dest: str | os.PathLike) -> None:
        """Moves a file or directory (a rename on a disk). On a store, file by file, each
        copied whole to the same place below `dest` and then deleted: a retry after a lost
        answer or a partial try moves what is left, never nesting a second copy below
        `dest`; nothing left at `source` and something at `dest` is a finished move."""
        source, dest = path(source), path(dest)
        if not is_remote(source):
            os.replace(source, dest)
            return
        fs = filesystem(source)
        root = os.fspath(source).split("://", 1)[1].rstrip("/")
        to = os.fspath(dest).split("://", 1)[1].rstrip("/")

        def move() -> None:
            files = fs.find(root)
            if not files and not fs.exists(to):
                raise FileNotFoundError(f"{source}: nothing to move, and nothing at {dest}")
            for f in files:
                fs.copy(f, to + f[len(root) :])
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(f)

        self.retried(move, f"moving {source}")


PLAIN = Store()


def _create_local(p: epath.Path, data: bytes) -> bool:
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return True


def explain(error: BaseException, p: str | os.PathLike) -> str:
    """What a failed store operation on `p` means, in a few words with the way out."""
    text = f"{type(error).__name__}: {error}"
    lowered = text.lower()
    if not is_remote(p):
        if isinstance(error, OSError) and error.strerror:
            return error.strerror
        for cause in REASONS:  # TensorStore's and Orbax's words for an OS error
            if cause in str(error):
                return cause
        return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    status = status_of(error, lowered)
    if status == 401 or any(w in lowered for w in ("credential", "unauthorized")):
        return (
            "no credentials for the store: run `gcloud auth application-default login` "
            "(or set GOOGLE_APPLICATION_CREDENTIALS; AWS_* for s3://)"
        )
    if isinstance(error, PermissionError) or status == 403 or "forbidden" in lowered:
        return "permission denied: the account needs read and write access to the bucket"
    if isinstance(error, FileNotFoundError) or "nosuchbucket" in lowered or status == 404:
        return "no such bucket or object: check the bucket name (create the bucket first)"
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return "No space left on device"
    down = ("connect", "timeout", "unreachable", "unavailable")
    if status == 503 or any(w in lowered for w in down):
        return "the store did not answer (no network, or it is down): try again when it does"
    return text.splitlines()[0][:200]
