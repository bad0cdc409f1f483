"""One converter: any checkpoint this package reads -> any format it writes.

    convert(checkpoint, fmt, out, model=None, image_size=None, num_classes=None,
            patch_size=None, labels=None) -> Converted

Formats written:
  npz          the published layout (older numbering), read by the original code and
               timm's npz loader
  timm         a .safetensors state dict for timm's VisionTransformer; `how_to_load` is
               Python lines that build timm's VisionTransformer and load it strictly
  hf           a directory for transformers' ViTForImageClassification.from_pretrained
               and pipeline('image-classification'): config.json (class names: `labels`,
               or the ImageNet names for a 1000-class head), model.safetensors and
               preprocessor_config.json (this package's resize and [-1, 1] scaling)
  onnx         an ONNX model with a dynamic batch dimension (see export.py)
  saved_model  a TensorFlow SavedModel, signature serving_default: images -> logits
Every output computes the model's function, its numerics (GELU form, LayerNorm epsilon)
included: npz and timm files record them (numerics.py), hf's config.json says them as
transformers reads them, the timm recipe builds timm's model with them, and the ONNX and
SavedModel graphs compute them. Every output is written under a temporary name and
renamed when complete.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax.data import images
from vit_jax.models.vit import VisionTransformer
from vit_jax.weights import hf, npz, numerics, safetensors_io, timm
from vit_jax.weights.adapt import adapt
from vit_jax.weights.load import load_model

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
    m, params, size = load_model(path, model, image_size, True, patch_size=patch_size, **overrides)
    if num_classes is not None and num_classes != (m.num_classes or 0):
        m = m.clone(num_classes=num_classes or None)
        params = adapt(params, m, size, reset_head=True, source=str(path))
    return m, params, size


def convert(
    path: str | os.PathLike,
    fmt: str,
    out: str | os.PathLike,
    model: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    patch_size: int | None = None,
    labels: Sequence[str] | str | os.PathLike | None = None,
    **overrides: Any,
) -> Converted:
    """Read `path` (any format read), write it as `fmt` at `out`.

    `labels`, the class names of an hf export's config.json: one per output of the head,
    or the path of a text file with one a line (as `python -m vit_jax.infer --labels`).

    Raises:
      ValueError: an unknown format, one that cannot hold the model, or labels for a
        format without class names or that do not fit the head (named).
      FileNotFoundError, CheckpointError: an unreadable input.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if labels is not None and fmt != "hf":
        raise ValueError(
            f"class names (--labels) are carried by --format=hf only; {fmt} has no place "
            "for them: leave --labels out, and pass it to python -m vit_jax.infer instead"
        )
    if isinstance(labels, (str, os.PathLike)) and not os.path.isfile(labels):
        raise FileNotFoundError(f"labels file not found: {labels}")  # before the slow load
    m, params, size = load(path, model, image_size, num_classes, patch_size, **overrides)
    if isinstance(labels, (str, os.PathLike)):
        labels = images.class_names(m.num_classes or 0, str(labels))
    return write(params, m, size, fmt, out, labels)


def write(
    params: dict,
    model: VisionTransformer,
    size: tuple[int, int],
    fmt: str,
    out: str | os.PathLike,
    labels: Sequence[str] | None = None,
) -> Converted:
    """Write a model's parameters (original layout) as `fmt` at `out`; `labels`: the class
    names of an hf export (None: ImageNet's for a 1000-class head, else LABEL_i). The
    directory that holds `out` is created if it does not exist."""
    out = str(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if model.scan:
        params = traverse_util.unflatten_dict(
            npz.unstack_blocks(traverse_util.flatten_dict(params, sep="/")), sep="/"
        )
        model = model.clone(scan=False)
    computes = numerics.of_model(model)
    if fmt == "npz":
        npz.save_npz(out, params, computes)
        how = f"vit_jax.weights.load_model({out!r})"
        if numerics.is_original(computes):
            how += "  # or the original code's np.load"
    elif fmt == "timm":
        tensors = {k: np.asarray(v, np.float32) for k, v in timm.to_timm(params).items()}
        how = timm.recipe(model, size, os.path.abspath(out))
        meta = {"format": "pt", "num_heads": str(model.num_heads)}
        safetensors_io.write(out, tensors, {**meta, **numerics.to_timm_metadata(computes)})
    elif fmt == "hf":
        tensors = {k: np.asarray(v, np.float32) for k, v in hf.to_hf(params).items()}
        if labels is None and model.num_classes == 1000:
            labels = images.imagenet_class_names()
        cfg = hf.config(model, size, labels)  # before writing: it checks the labels
        hf.write_dir(out, tensors, cfg, hf.preprocessor_config(size))
        d = os.path.abspath(out)
        how = (
            "import transformers\n"
            f"model = transformers.ViTForImageClassification.from_pretrained({d!r})\n"
            f"classify = transformers.pipeline('image-classification', model={d!r})\n"
            "# classify('cat.jpg') -> the top 5 classes with their probabilities"
        )
    else:
        from vit_jax.weights import export

        how = export.export(params, model, size, fmt, out)
    return Converted(out, fmt, model, size, how)
