"""One converter: any checkpoint this package reads -> any format it writes.

    convert(checkpoint, fmt, out, model=None, image_size=None, num_classes=None,
            patch_size=None, labels=None) -> Converted

Formats written:
  npz          the published layout (older numbering), read by the original code and
               timm's npz loader
  timm         a .safetensors state dict for timm's VisionTransformer (its Eva for the
               towers of that layout: rotary embeddings, q/v biases, EVA-02's norms);
               `how_to_load` is Python lines that build timm's model and load it
               strictly. An `out` ending in '/' or without a suffix is timm's hub
               folder instead (config.json + model.safetensors, timm_recipe.hub_config),
               for timm.create_model('local-dir:' + out, pretrained=True)
  hf           a directory for transformers' ViTForImageClassification.from_pretrained
               and pipeline('image-classification'): config.json (class names in
               id2label; the ImageNet names for a 1000-class head without any),
               model.safetensors and preprocessor_config.json (this package's resize and
               [-1, 1] scaling)
  onnx         an ONNX model with a dynamic batch dimension (see export.py)
Every output keeps the head's class names, the input's own unless `labels` says others.
Every output computes the model's function, its numerics (GELU form, LayerNorm epsilon)
included: npz and timm files record them (meta.py),
hf's config.json says them as transformers reads them, the timm recipe builds timm's
model with them, and the ONNX graph computes them. Every output is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax.base import store
from vit_jax.data import images
from vit_jax.models.vit import VisionTransformer
from vit_jax.weights import hf, npz, onnx_export, safetensors_io, timm, timm_eva, timm_recipe
from vit_jax.weights.adapt import adapt
from vit_jax.weights.load import Loaded
from vit_jax.weights.load import load as load_checkpoint
from vit_jax.weights.meta import Meta, checked

FORMATS = ("npz", "timm", "hf", "onnx")


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
) -> Loaded:
    """The checkpoint, with a new zero head of `num_classes` classes when it differs from
    the stored one (0: no head; the stored class names no longer apply)."""
    loaded = load_checkpoint(path, model, image_size, True, patch_size=patch_size, **overrides)
    if num_classes is not None and num_classes != (loaded.model.num_classes or 0):
        m = loaded.model.clone(num_classes=num_classes or None)
        params = adapt(loaded.params, m, loaded.image_size, reset_head=True, source=str(path))
        return dataclasses.replace(loaded, model=m, params=params, labels=None)
    return loaded


def convert(
    path: str | os.PathLike,
    fmt: str,
    out: str | os.PathLike,
    model: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    patch_size: int | None = None,
    labels: Sequence[str] | str | os.PathLike | None = None,
    preprocessing: str | None = None,
    **overrides: Any,
) -> Converted:
    """Read `path` (any format read), write it as `fmt` at `out`.

    `preprocessing`: the resize the weights expect, recorded in the output (npz, timm,
    hf); None keeps the input's (meta.py).

    `labels`: the head's class names, one per output, or the path of a text file with
    one a line (as `python -m vit_jax.infer --labels`); None keeps the input's own (the
    files this package writes name them), where the head is kept. Every format
    carries them (meta.py; an ONNX model as metadata).

    Raises:
      ValueError: an unknown format, one that cannot hold the model, or labels that do
        not fit the head (named).
      FileNotFoundError, CheckpointError: an unreadable input.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if isinstance(labels, (str, os.PathLike)) and not store.path(labels).is_file():
        raise FileNotFoundError(f"labels file not found: {labels}")  # before the slow load
    loaded = load(path, model, image_size, num_classes, patch_size, **overrides)
    m = loaded.model
    if isinstance(labels, (str, os.PathLike)):
        labels = images.class_names(m.num_classes or 0, str(labels))
    elif labels is None:
        labels = loaded.labels
    meta = Meta(labels=labels, preprocessing=preprocessing or loaded.preprocessing)
    return write(loaded.params, m, loaded.image_size, fmt, out, meta)


def write(
    params: dict,
    model: VisionTransformer,
    size: tuple[int, int],
    fmt: str,
    out: str | os.PathLike,
    meta: Meta | None = None,
) -> Converted:
    """Write a model's parameters (original layout) as `fmt` at `out`, with `meta`: the
    head's class names (None: none; an hf export then names a 1000-class head with
    ImageNet's, any other LABEL_i) and the preprocessing the weights expect (npz, timm
    and hf files record it; meta.py); its numerics are the model's. The directory that
    holds `out` is created if it does not exist."""
    out = str(out)
    where = out if store.is_remote(out) else os.path.abspath(out)  # in the printed lines
    if not store.is_remote(out):
        os.makedirs(os.path.dirname(where), exist_ok=True)
    if model.scan:
        params = traverse_util.unflatten_dict(
            npz.unstack_blocks(traverse_util.flatten_dict(params, sep="/")), sep="/"
        )
        model = model.clone(scan=False)
    meta = meta or Meta()
    labels = checked(meta.labels, model.num_classes or 0, "the class names")
    if fmt == "hf" and labels is None and model.num_classes == 1000:
        labels = images.imagenet_class_names()
    grid = model.posemb_grid or model.grid(size)  # the table's, at the size written
    meta = Meta.of_model(model.clone(posemb_grid=grid), labels, meta.preprocessing)
    if fmt == "npz":
        npz.save_npz(out, params, meta)
        how = f"vit_jax.weights.load_model({out!r})"
        if meta.original_numerics:
            how += "  # or the original code's np.load"
    elif fmt == "timm":
        folder = out.endswith("/") or not os.path.splitext(out)[1]  # timm's hub folder
        cfg = timm_recipe.hub_config(model, size, meta) if folder else None  # refusals first
        how = f"timm.create_model('local-dir:' + {where!r}, pretrained=True)"
        how = how if folder else timm_recipe.recipe(model, size, where)
        eva = timm_recipe.eva_fields(model)
        layout = timm_eva.to_timm(params, model) if eva else timm.to_timm(params)
        tensors = {k: np.asarray(v, np.float32) for k, v in layout.items()}
        if folder:
            hf.write_dir(out, tensors, cfg)
        else:
            metadata = {"format": "pt", "num_heads": str(model.num_heads), **meta.to_timm()}
            safetensors_io.write(out, tensors, metadata)
    elif fmt == "hf":
        if other := onnx_export.unwritten(model):  # ViTForImageClassification: the paper's
            raise ValueError(f"transformers' ViT is the paper's, not {', '.join(other)}")
        tensors = {k: np.asarray(v, np.float32) for k, v in hf.to_hf(params).items()}
        cfg = hf.config(model, size, meta)  # before writing: it checks the labels
        hf.write_dir(out, tensors, cfg, hf.preprocessor_config(size))
        how = hf.how_to_load(out, where, meta.preprocessing)
    else:
        onnx_export.export_onnx(params, model, size, out, labels=labels)
        how = f"onnxruntime.InferenceSession({out!r}).run(['logits'], {{'images': x}})"
    return Converted(out, fmt, model, size, how)
