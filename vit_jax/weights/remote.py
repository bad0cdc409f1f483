"""Published checkpoints at remote paths (gs://vit_models/..., https://...).

A remote path is copied once into a local cache ($VIT_JAX_CACHE, default
~/.cache/vit_jax) through etils.epath (gs:// and s3://, by TensorFlow's filesystem
layer) or urllib (http(s)://), then read like a local file. Offline, a short connection
test fails first with a message that says so, instead of the filesystem layer's retries.
"""

from __future__ import annotations

import os
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

from etils import epath

from vit_jax.base import quiet_tf

SCHEMES = ("gs://", "http://", "https://", "s3://")
_HOSTS = {"gs://": "storage.googleapis.com", "s3://": "s3.amazonaws.com"}


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` names a remote file."""
    return str(path).startswith(SCHEMES)


def cache_dir() -> Path:
    """Where remote checkpoints are kept."""
    return Path(os.environ.get("VIT_JAX_CACHE", Path.home() / ".cache" / "vit_jax"))


def _host(path: str) -> str:
    for scheme, host in _HOSTS.items():
        if path.startswith(scheme):
            return host
    return path.split("://", 1)[1].split("/", 1)[0]


def check_network(path: str, timeout: float = 5.0) -> None:
    """Raise OSError when the host of `path` cannot be reached."""
    host = _host(path)
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError as e:
        raise OSError(
            f"cannot reach {host} for {path} ({e}): this machine has no network access. "
            "Download the file elsewhere and pass its local path"
        ) from None


def fetch(path: str) -> Path:
    """The local copy of the remote `path`, downloaded on first use.

    Raises:
      OSError: no network, or no such remote file.
      ImportError: no filesystem layer for gs:// (pip install 'vit_jax[data]').
    """
    local = cache_dir() / path.split("://", 1)[1]
    if local.is_file():
        return local
    check_network(path)
    try:
        copy(path, local)
    except ImportError as e:
        raise ImportError(
            f"reading {path} needs TensorFlow's filesystem layer: pip install 'vit_jax[data]'"
        ) from e
    return local


def copy(source: str | os.PathLike, local: Path) -> None:
    """Copies `source` (gs://, s3://, http(s):// or local) to `local`, whole or not at all.

    Raises:
      FileNotFoundError: no such file at `source`.
    """
    source = str(source)
    missing = FileNotFoundError(f"{source}: no such remote file (see the published checkpoints)")
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(local.name + ".tmp")
    try:
        if source.startswith(("http://", "https://")):
            # etils.epath has no http(s):// backend; the standard library reads URLs.
            try:
                with urllib.request.urlopen(source, timeout=60) as r, open(tmp, "wb") as f:
                    shutil.copyfileobj(r, f)
            except urllib.error.HTTPError as e:
                raise missing if e.code == 404 else e from None
        else:
            if is_remote(source):
                quiet_tf.tensorflow()  # epath's gs:// backend, imported without its notes
            remote = epath.Path(source)
            if not remote.exists():
                raise missing
            remote.copy(tmp, overwrite=True)
        os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)
