"""One path type for every file the package reads or writes: local paths and object-store
URLs (gs://, s3://) alike, as `etils.epath.Path` (the type Orbax uses).

  path(p)            a str or path -> epath.Path: a URL stays a URL, '~' is expanded
  absolute(p)        the same, a local path made absolute (a workdir, checkpoints)
  is_remote(p)       whether it names an object in a store
  create_new(p, b)   write `b` only if nothing is there, atomically (O_EXCL on a disk;
                     the store's own precondition: GCS ifGenerationMatch=0, S3
                     If-None-Match), for locks
  explain(error, p)  what a store's failure means, in a line with the way out

Object stores reach the package through fsspec (gcsfs, s3fs), with or without
TensorFlow: etils would route gs:// through TensorFlow's filesystem where TensorFlow is
installed, so that the same run behaved differently on two installs; EPATH_USE_TF=false
(set here unless the user set it) keeps the one backend. Their listing caches are off:
other writers (TensorStore, the run's other processes) add objects they cannot see. A
store has no directories and no rename: files are written whole (`base/files.py`) and
never renamed into place.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

from etils import epath

os.environ.setdefault("EPATH_USE_TF", "false")  # one backend, TensorFlow or not
try:  # Listings are not cached: Orbax's arrays (TensorStore) and the other processes of
    # a run write beside this process's gcsfs/s3fs, whose listing cache never expires and
    # would not see them (a checkpoint saved after one was set aside read as missing).
    import fsspec.config

    for _protocol in ("gcs", "s3"):
        fsspec.config.conf.setdefault(_protocol, {}).setdefault("use_listings_cache", False)
    import aiohttp  # gcsfs's: a connection silent for a minute fails (and is retried)

    _stalled = aiohttp.ClientTimeout(sock_connect=30, sock_read=60)
    fsspec.config.conf["gcs"].setdefault("requests_timeout", _stalled)
except ImportError:  # no fsspec: no object store either
    pass
# TensorStore's (Orbax's arrays) likewise: under 1 byte/s for a minute is a failure that
# it retries, not a wait without end (its default: no limit).
os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")
os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", "60")

Path = epath.Path
SCHEMES = ("gs://", "s3://")
_PACKAGES = {"gs": "gcsfs", "s3": "s3fs"}
REASONS = (
    "No space left on device",
    "Disk quota exceeded",
    "Permission denied",
    "Read-only file system",
    "Input/output error",
)


def path(p: str | os.PathLike) -> epath.Path:
    """`p` as an epath.Path; local paths with '~' expanded."""
    if isinstance(p, epath.Path):
        return p
    text = os.fspath(p)
    return epath.Path(text if text.startswith(SCHEMES) else os.path.expanduser(text))


def absolute(p: str | os.PathLike) -> epath.Path:
    """`path(p)`, a local one made absolute (Orbax refuses relative checkpoint paths)."""
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


def create_new(p: str | os.PathLike, data: bytes) -> bool:
    """Writes `data` to `p` if nothing is there, in one atomic step; False if something
    is (another writer won)."""
    p = path(p)
    if not is_remote(p):
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True
    try:
        filesystem(p).pipe_file(os.fspath(p), data, mode="create")
    except FileExistsError:
        return False
    return True


def size(p: str | os.PathLike) -> int:
    """Bytes of the file at `p`."""
    p = path(p)
    return filesystem(p).size(os.fspath(p)) if is_remote(p) else os.path.getsize(p)


def walk_files(root: str | os.PathLike) -> dict[str, int]:
    """{path relative to `root`: bytes} of every file below `root` (one listing on a
    store); {} when there is none."""
    root = path(root)
    if is_remote(root):
        found = filesystem(root).find(os.fspath(root), detail=True)
        prefix = os.fspath(root).split("://", 1)[1].rstrip("/") + "/"
        return {k[len(prefix) :]: int(v["size"]) for k, v in found.items() if k.startswith(prefix)}
    out = {}
    for here, _, names in os.walk(root):
        for name in names:
            full = os.path.join(here, name)
            out[os.path.relpath(full, root)] = os.path.getsize(full)
    return out


def remove_tree(p: str | os.PathLike) -> None:
    """Removes `p` and everything below it; nothing if it is not there."""
    p = path(p)
    if is_remote(p):
        fs = filesystem(p)
        if fs.exists(os.fspath(p)):
            fs.rm(os.fspath(p), recursive=True)
    elif p.exists():
        p.rmtree()


def move(source: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Moves a file or directory (a rename on a disk; copies then deletes on a store)."""
    source, dest = path(source), path(dest)
    if is_remote(source):
        filesystem(source).mv(os.fspath(source), os.fspath(dest), recursive=True)
    else:
        os.replace(source, dest)


# An HTTP status in an error's text: after a word that announces one ("HTTP 404", "code
# 401", "status: 403", "Error 503"), or before its reason ("401 Unauthorized"). A bare
# number is not one: "401" in a port (127.0.0.1:40123) or a checkpoint step
# (checkpoints/401) once made a missing bucket read as missing credentials.
_STATUS = re.compile(
    r"(?:\b(?:http|status|code|error)\W{0,3}(\d{3})\b)"
    r"|(?:\b(\d{3}) (?:unauthorized|forbidden|not found|service unavailable)\b)"
)


def status_of(error: BaseException, lowered: str) -> int | None:
    """The HTTP status of a store's error: its `code`/`status` attribute (gcsfs, aiohttp),
    else one its text names as a status (`_STATUS`); None without one."""
    for name in ("code", "status"):
        value = getattr(error, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    found = _STATUS.search(lowered)
    return int(found[1] or found[2]) if found else None


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
