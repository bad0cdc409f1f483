"""Checkpoints at remote paths: the published files (gs://vit_models/...,
https://storage.googleapis.com/vit_models/...) and a user's own on a store (gs://, s3://).

`resolve(path)` is where a reader reads `path`. The published files never change: each
is copied once into a local cache ($VIT_JAX_CACHE, default ~/.cache/vit_jax), over
HTTPS (the bucket is public: gs://vit_models/X is https://storage.googleapis.com/
vit_models/X, no credentials, no TensorFlow). Any other gs:// or s3:// path is read in
place, through the package's one path layer (`vit_jax.base.store`): a run's final.npz
on a bucket is read as it is now, not as a cache remembers it. Offline, a short
connection test fails first with a message that says so, instead of retries.
"""

from __future__ import annotations

import os
import shutil
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from vit_jax.base import files, store

SCHEMES = ("gs://", "http://", "https://", "s3://")
PUBLISHED = "gs://vit_models/"
PUBLIC_URL = "https://storage.googleapis.com/"


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` names a remote file."""
    return os.fspath(path).startswith(SCHEMES)


def cache_dir() -> Path:
    """Where published checkpoints are kept."""
    return Path(os.environ.get("VIT_JAX_CACHE", Path.home() / ".cache" / "vit_jax"))


def url(path: str) -> str | None:
    """The HTTPS address of a published file (or of an https:// path); None otherwise."""
    if path.startswith(PUBLISHED):
        return PUBLIC_URL + path[len("gs://") :]
    return path if path.startswith(("http://", "https://")) else None


def resolve(path: str | os.PathLike) -> store.Path:
    """Where to read `path`: the local cache's copy of a published file (downloaded on
    first use), `path` itself otherwise.

    Raises:
      OSError: no network for a file not yet cached, or no such remote file.
    """
    text = os.fspath(path)
    address = url(text)
    if address is None:
        return store.path(text)
    local = cache_dir() / text.split("://", 1)[1]
    if not local.is_file():
        check_network(address)
        copy(address, local)
    return store.path(local)


def check_network(address: str, timeout: float = 5.0) -> None:
    """Raise OSError when the host of `address` cannot be reached."""
    parts = urllib.parse.urlsplit(address)
    host, port = parts.hostname, parts.port or (80 if parts.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise OSError(
            f"cannot reach {host} for {address} ({e}): this machine has no network access. "
            "Download the file elsewhere and pass its local path"
        ) from None


def copy(source: str, local: str | os.PathLike) -> None:
    """Copies `source` (http(s)://, gs://, s3:// or local) to `local`, whole or not at all.

    Raises:
      FileNotFoundError: no such file at `source`.
    """
    missing = FileNotFoundError(f"{source}: no such remote file (see the published checkpoints)")
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    with files.atomic_write(local) as f:
        if source.startswith(("http://", "https://")):
            try:
                with urllib.request.urlopen(source, timeout=60) as r:
                    shutil.copyfileobj(r, f)
                    expected = r.headers.get("Content-Length")
            except urllib.error.HTTPError as e:
                raise missing if e.code == 404 else e from None
            if expected is not None and f.tell() != int(expected):  # http.client's read()
                raise ConnectionError(  # returns short, without an error, when cut off
                    f"{source}: the transfer broke off after {f.tell()} of {expected} bytes; "
                    "nothing was kept: try again"
                )
        else:
            remote = store.path(source)
            if not remote.exists():
                raise missing
            with remote.open("rb") as r:
                shutil.copyfileobj(r, f)
