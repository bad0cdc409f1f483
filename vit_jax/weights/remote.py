"""Checkpoints at remote paths: the published files (gs://vit_models/...,
https://storage.googleapis.com/vit_models/...) and a user's own on a store (gs://, s3://).

`resolve(path)` is where a reader reads `path`. The published files never change: each
is copied once into a local cache ($VIT_JAX_CACHE, default ~/.cache/vit_jax), over
HTTPS (the bucket is public: gs://vit_models/X is https://storage.googleapis.com/
vit_models/X, no credentials, no TensorFlow). Any other gs:// or s3:// path is read in
place, through the package's one path layer (`vit_jax.base.store`): a run's final.npz
on a bucket is read as it is now, not as a cache remembers it. Offline, a short
connection test fails first with a message that says so, instead of retries.

A Hugging Face hub name, `hf-hub:ORG/NAME[@REVISION]` (a branch, tag or commit; 'main' by
default), is read from the hub's own cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub: models--ORG--NAME/refs, snapshots/COMMIT/) by huggingface_hub
itself: no network when the files are there, none at all with HF_HUB_OFFLINE=1, else a
download of the files the readers read (`HUB_FILES`), with the hub's progress bar.
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
from vit_jax.weights.errors import CheckpointError

PUBLISHED = "gs://vit_models/"
PUBLIC_URL = "https://storage.googleapis.com/"
HUB = "hf-hub:"
HUB_FILES = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",  # a sharded folder's map, and its shards
    "model-*.safetensors",
    "preprocessor_config.json",
    "open_clip_config.json",
]


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
    first use), a hub name's snapshot folder (`hub_snapshot`), `path` itself otherwise.

    Raises:
      OSError: no network for a file not yet cached, or no such remote file.
      CheckpointError: a hub name the hub refuses (`hub_snapshot`).
    """
    text = os.fspath(path)
    if text.startswith(HUB):
        return store.path(hub_snapshot(text))
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


def hub_snapshot(name: str) -> str:
    """The local folder of `hf-hub:ORG/NAME[@REVISION]`'s files (`HUB_FILES`), from the
    hub's cache or downloaded into it.

    Raises:
      ImportError: huggingface_hub is not installed.
      FileNotFoundError: not in the cache, and offline (or the hub not reachable).
      CheckpointError: no such name, or a gated or private one without a token.
    """
    repo, _, revision = name[len(HUB) :].partition("@")
    if len(repo.split("/")) != 2 or not all(repo.split("/")):
        raise CheckpointError(f"{name}: expected hf-hub:ORG/NAME[@REVISION]")
    try:
        from huggingface_hub import constants, errors, snapshot_download
    except ImportError:
        raise ImportError(
            f"{name}: hub names need huggingface_hub: pip install huggingface_hub"
        ) from None
    env = os.environ  # read at each call: huggingface_hub's constants are read at its import
    home = os.path.join(os.path.expanduser(env["HF_HOME"]), "hub") if "HF_HOME" in env else None
    cache = os.path.expanduser(env.get("HF_HUB_CACHE") or home or constants.HF_HUB_CACHE)
    flag = env.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    offline = flag or constants.HF_HUB_OFFLINE
    try:
        return snapshot_download(
            repo,
            revision=revision or None,
            cache_dir=cache,
            allow_patterns=HUB_FILES,
            local_files_only=offline,
            endpoint=env.get("HF_ENDPOINT"),
        )
    except errors.RepositoryNotFoundError as e:  # GatedRepoError too: the hub says 401 for all
        raise CheckpointError(
            f"{name}: the hub answered {getattr(e.response, 'status_code', 401)}: no such "
            "repository, or a gated or private one and no token with access was sent: log in "
            f"(`hf auth login`, or set HF_TOKEN) and accept its terms on https://huggingface.co/{repo}"
        ) from None
    except errors.RevisionNotFoundError:
        raise CheckpointError(f"{name}: the repository has no revision {revision!r}") from None
    except errors.LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        fetch = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
        raise FileNotFoundError(
            f"{name}: not in the hub cache {cache} and {why}: fetch it where there is a "
            f"network with `{fetch}` (into the same HF_HUB_CACHE), then run again"
        ) from None
