"""Reading any checkpoint a user holds: a published .npz, a timm .safetensors file, a
Hugging Face directory, local or remote.

`read_checkpoint(path)` recognises the input format from the file and returns the
original-layout parameter tree that `adapt.adapt` fits to a model, so every command that
takes --checkpoint (and `init_from`) reads every format; `read_source` also returns what
the file says beyond its parameters (numerics, class names, preprocessing: meta.py).
"""

from __future__ import annotations

import dataclasses
import os

from vit_jax.base import store
from vit_jax.models import get_model
from vit_jax.weights import architecture, hf, npz, remote, safetensors_io, timm
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import Meta

__all__ = ["FORMATS_READ", "Source", "detect_format", "read_checkpoint", "read_meta", "read_source"]

FORMATS_READ = "a published .npz, a timm .safetensors file, or a Hugging Face model directory"


def detect_format(path: str | os.PathLike) -> str:
    """'npz', 'timm' or 'hf' for a local or store path, from its contents.

    Raises:
      FileNotFoundError: no such file or directory.
      CheckpointError: none of the three (the message says what was expected).
    """
    p = store.path(path)
    if p.is_dir():
        if hf.is_hf_dir(p):
            return "hf"
        raise CheckpointError(
            f"{p} is a directory without config.json: expected {FORMATS_READ} "
            "(config.json + model.safetensors)"
        )
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {p}: no such file or directory")
    with p.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"PK") or p.suffix == ".npz":
        return "npz"
    if safetensors_io.is_safetensors(p) or p.suffix == ".safetensors":
        return "timm"
    raise CheckpointError(
        f"{p} is not a checkpoint this package reads: expected {FORMATS_READ} "
        "(config.json + model.safetensors)"
    )


@dataclasses.dataclass(frozen=True)
class Source:
    """What a checkpoint file holds: the parameters in the original layout, what it
    says beyond them (as the file says or its format implies), and what was not read, in
    words (a two-tower file's text tower: npz.py)."""

    params: dict
    meta: Meta
    unread: tuple[str, ...] = ()


def read_checkpoint(path: str | os.PathLike, num_heads: int | None = None) -> dict:
    """Any checkpoint (npz, timm safetensors, HF directory; local or remote) -> the
    original-layout parameter tree (`read_source(...).params`)."""
    return read_source(path, num_heads).params


def read_source(path: str | os.PathLike, num_heads: int | None = None) -> Source:
    """Any checkpoint (npz, timm safetensors, HF directory; local or remote) -> its
    `Source`: parameters and Meta.

    Args:
      path: a local path, a gs:// or s3:// path (read in place), or a published file's
        gs:// / https:// path (fetched once into the cache, see `remote.resolve`).
      num_heads: attention heads for a timm file of a width that is no published size.

    Raises:
      FileNotFoundError, CheckpointError: unreadable, unrecognised or incomplete input,
        each named with the way out.
    """
    path = remote.resolve(path)
    fmt = detect_format(path)
    if fmt == "npz":
        return Source(*npz.read_npz(path))
    if fmt == "hf":
        params, cfg = hf.read_dir(path)
        return Source(params, Meta.from_hf(cfg, str(path / hf.CONFIG)))
    tensors, meta = safetensors_io.read(path)
    if any(k.startswith(("vit.", "embeddings.")) for k in tensors):
        raise CheckpointError(
            f"{path} holds Hugging Face ViT weights; pass the directory with its config.json"
        )
    heads = num_heads or (int(meta["num_heads"]) if "num_heads" in meta else None)
    params = timm.from_timm(tensors, heads)
    arch = architecture.architecture(params)
    model = get_model(None, architecture.num_classes(params), **arch)
    size = architecture.native_image_size(params, model.token_stride)
    timm.check(tensors, model, size, str(path))
    return Source(params, Meta.from_timm(meta, str(path)))


def read_meta(path: str | os.PathLike) -> Meta:
    """`read_source`'s Meta alone, reading only the file's metadata (an .npz's entries,
    the safetensors header, config.json), not its tensors.

    Raises:
      FileNotFoundError, CheckpointError: as `read_source`.
    """
    path = remote.resolve(path)
    fmt = detect_format(path)
    if fmt == "npz":
        return npz.read_meta(path)
    if fmt == "hf":
        return Meta.from_hf(hf.read_config(path), str(path / hf.CONFIG))
    return Meta.from_timm(safetensors_io.read_metadata(path), str(path))
