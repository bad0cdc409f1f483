"""One converter: any checkpoint this package reads -> any format it writes.

    convert(checkpoint, fmt, out, model=None, image_size=None, num_classes=None,
            patch_size=None) -> Converted

Formats written:
  npz          the published layout (older numbering), read by the original code and
               timm's npz loader
  timm         a .safetensors state dict for timm's VisionTransformer (`strict=True`)
  hf           a directory for transformers' ViTForImageClassification.from_pretrained
  onnx         an ONNX model with a dynamic batch dimension (see export.py)
  saved_model  a TensorFlow SavedModel, signature serving_default: images -> logits
Every output is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax import checkpoint
from vit_jax.formats import hf, safetensors_io, timm
from vit_jax.models.vit import VisionTransformer

FORMATS = ("npz", "timm", "hf", "onnx", "saved_model")


@dataclasses.dataclass
class Converted:
    """What was written: the model, its resolution, and how to load the output."""

    out: str
    fmt: str
    model: VisionTransformer
    image_size: tuple[int, int]
    how_to_load: str


def load(
    path: str | os.PathLike,
    model: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    patch_size: int | None = None,
    **overrides: Any,
) -> tuple[VisionTransformer, dict, tuple[int, int]]:
    """The checkpoint as (model, params, size), with a new zero head of `num_classes`
    classes when it differs from the stored one (0: no head)."""
    m, params, size = checkpoint.load_model(
        path, model, image_size, True, patch_size=patch_size, **overrides
    )
    if num_classes is not None and num_classes != (m.num_classes or 0):
        m = m.clone(num_classes=num_classes or None)
        params = checkpoint.adapt(params, m, size, reset_head=True, source=str(path))
    return m, params, size


def convert(
    path: str | os.PathLike,
    fmt: str,
    out: str | os.PathLike,
    model: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    patch_size: int | None = None,
    **overrides: Any,
) -> Converted:
    """Read `path` (any format read), write it as `fmt` at `out`.

    Raises:
      ValueError: an unknown format, or one that cannot hold the model (named).
      FileNotFoundError, CheckpointError: an unreadable input.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    m, params, size = load(path, model, image_size, num_classes, patch_size, **overrides)
    return write(params, m, size, fmt, out)


def write(
    params: dict, model: VisionTransformer, size: tuple[int, int], fmt: str, out: str | os.PathLike
) -> Converted:
    """Write a model's parameters (original layout) as `fmt` at `out`."""
    out = str(out)
    if model.scan:
        params = traverse_util.unflatten_dict(
            checkpoint.unstack_blocks(traverse_util.flatten_dict(params, sep="/")), sep="/"
        )
        model = model.clone(scan=False)
    if fmt == "npz":
        checkpoint.save_npz(out, params)
        how = f"vit_jax.checkpoint.load_model({out!r})  # or the original code's np.load"
    elif fmt == "timm":
        tensors = {k: np.asarray(v, np.float32) for k, v in timm.to_timm(params).items()}
        how = timm.recipe(model, size, os.path.abspath(out))
        safetensors_io.write(out, tensors, {"format": "pt", "num_heads": str(model.num_heads)})
    elif fmt == "hf":
        tensors = {k: np.asarray(v, np.float32) for k, v in hf.to_hf(params).items()}
        hf.write_dir(out, tensors, hf.config(model, size))
        how = f"transformers.ViTForImageClassification.from_pretrained({out!r})"
    else:
        from vit_jax.formats import export

        how = export.export(params, model, size, fmt, out)
    return Converted(out, fmt, model, size, how)
