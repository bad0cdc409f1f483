"""Hugging Face `ViTForImageClassification` directories <-> the original layout.

A directory holds `config.json` and `model.safetensors` with (per block i):
  vit.embeddings.{cls_token, position_embeddings, patch_embeddings.projection.{weight, bias}}
  vit.encoder.layer.{i}.layernorm_before, .attention.attention.{query, key, value},
  .attention.output.dense, .layernorm_after, .intermediate.dense, .output.dense
  vit.layernorm, classifier
Linear weights are the transpose of Flax kernels. transformers' ViT config defaults
to layer_norm_eps=1e-12 and the exact GELU ('gelu'); the original ViT uses 1e-6 and the
tanh approximation, whose name there is 'gelu_pytorch_tanh' (the same function as
'gelu_new'). A directory read here computes what its config.json says, and `config`
writes the model's own GELU form and epsilon (meta.py), so the logits agree both
ways. Files converted by others from the original checkpoints (e.g. google/vit-base-
patch16-224) say 'gelu' and 1e-12 although their weights were trained with tanh and
1e-6: load them with the original numerics (--numerics=original). Plain ViTs with a
class token only: transformers' ViT has no hybrid stem, no 'gap' pooling and no
representation layer. `preprocessor_config` writes this package's image preprocessing
for transformers' image processors, so that `pipeline('image-classification',
model=DIR)` runs, and `config` the class names pipelines print.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax.base import files, store
from vit_jax.data.preprocessing import Preprocessing, from_hf_processor
from vit_jax.models import get_model, param_shapes
from vit_jax.models.vit import VisionTransformer
from vit_jax.weights import safetensors_io
from vit_jax.weights._tensors import Shape, check_table, leaf_from_torch, leaf_to_torch, torch_names
from vit_jax.weights.architecture import POSEMB
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import Meta, checked

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
_ATT = "MultiHeadDotProductAttention_1"
_TOP = {
    "cls": "vit.embeddings.cls_token",
    POSEMB: "vit.embeddings.position_embeddings",
    **torch_names(
        {
            "embedding": "vit.embeddings.patch_embeddings.projection",
            "Transformer/encoder_norm": "vit.layernorm",
            "head": "classifier",
        }
    ),
}
_BLOCK = torch_names(
    {  # under encoderblock_{i}/ -> under vit.encoder.layer.{i}.
        "LayerNorm_0": "layernorm_before",
        "LayerNorm_2": "layernorm_after",
        "MlpBlock_3/Dense_0": "intermediate.dense",
        "MlpBlock_3/Dense_1": "output.dense",
        f"{_ATT}/out": "attention.output.dense",
        **{f"{_ATT}/{n}": f"attention.attention.{n}" for n in ("query", "key", "value")},
    }
)


def to_hf(params: dict) -> dict[str, Any]:
    """An original-layout tree (arrays or `Shape`s) -> the HF state dict (same kind).

    Raises:
      CheckpointError: a hybrid, a model without class token (a 'gap' or 'map' one) or
        with a representation layer, which transformers' ViT cannot hold.
    """
    flat = traverse_util.flatten_dict(params, sep="/")
    if "conv_root/kernel" in flat:
        raise CheckpointError(
            "a hybrid (ResNet stem) has no transformers ViT equivalent: use format='timm' or "
            "format='npz'"
        )
    if "MAPHead_0/probe" in flat:
        raise CheckpointError(
            "the model pools with a MAP head (classifier 'map'); transformers' ViT has none: "
            "use format='timm' or format='npz'"
        )
    if "cls" not in flat:
        raise CheckpointError(
            "the model pools without a class token ('gap'); transformers' ViT always uses "
            "one: use format='timm' or format='npz'"
        )
    if "pre_logits/kernel" in flat:
        raise CheckpointError(
            "the checkpoint has a representation layer (pre_logits); transformers' ViT has "
            "none: convert with num_classes=K for a new head (the layer is dropped)"
        )
    out: dict[str, Any] = {}
    for key, a in flat.items():
        m = re.fullmatch(r"Transformer/encoderblock_(\d+)/(.*)", key)
        to = f"vit.encoder.layer.{m[1]}.{_BLOCK[m[2]]}" if m and m[2] in _BLOCK else _TOP.get(key)
        if to is None:
            raise CheckpointError(f"parameter {key} {tuple(a.shape)} has no place in HF's ViT")
        out[to] = leaf_to_torch(key, a)
    return out


def config(model: VisionTransformer, image_size: tuple[int, int], meta: Meta | None = None) -> dict:
    """transformers' ViTConfig fields for `model` at `image_size` (square sizes only), with
    `meta`'s numerics and preprocessing; its labels (one name per class) become id2label /
    label2id, which pipelines print (None: transformers' LABEL_0, LABEL_1, ...).

    Raises:
      ValueError: a non-square size, or labels that do not fit the head (names repeated
        or not one per class).
    """
    if image_size[0] != image_size[1]:
        raise ValueError(f"transformers' ViT takes square images; got {image_size}")
    meta = meta or Meta.of_model(model)
    k = model.num_classes or 0
    names = checked(meta.labels, k, "the class names") or [f"LABEL_{i}" for i in range(k)]
    return {
        "architectures": ["ViTForImageClassification"],
        "model_type": "vit",
        "hidden_size": model.width,
        "num_hidden_layers": model.depth,
        "num_attention_heads": model.num_heads,
        "intermediate_size": model.mlp_dim,
        **meta.to_hf(),  # hidden_act, layer_norm_eps, vit_jax_preprocessing
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "image_size": image_size[0],
        "patch_size": model.patch_size,
        "num_channels": model.channels,
        "qkv_bias": True,
        "encoder_stride": model.patch_size,
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},
        "torch_dtype": "float32",
    }


def preprocessor_config(image_size: tuple[int, int], method: str = "pil_antialias") -> dict:
    """`preprocessor_config.json` for transformers' ViTImageProcessor: the preprocessing
    `method` of `vit_jax.data.images.load_image` (RGB, PIL's bilinear or bicubic resize to
    `image_size` without a crop, x / 255 then (x - mean) / std), so that
    `pipeline('image-classification')` feeds the model what `python -m vit_jax.infer
    --preprocessing=pil_antialias` does. transformers has no resize without antialiasing,
    so a tf_bilinear model (config.json's vit_jax_preprocessing) gets PIL's pixels there,
    and no crop but its own: a crop the string names is left out."""
    spec = Preprocessing.parse(method)
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"height": image_size[0], "width": image_size[1]},
        "resample": 3 if spec.resize == "pil_bicubic" else 2,  # PIL's BICUBIC, BILINEAR
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(spec.mean),
        "image_std": list(spec.std),
    }


def hf_shapes(model: VisionTransformer, image_size: tuple[int, int]) -> dict[str, Shape]:
    """The HF state dict shapes of `model` at `image_size`."""
    shapes = traverse_util.flatten_dict(param_shapes(model.clone(scan=False), image_size), sep="/")
    tree = traverse_util.unflatten_dict({k: Shape(v.shape) for k, v in shapes.items()}, sep="/")
    return to_hf(tree)


def read_config(path: str | os.PathLike) -> dict:
    """config.json of an HF directory; without a vit_jax_preprocessing of its own, that of
    its preprocessor_config.json where it has one (`from_hf_processor`).

    Raises:
      CheckpointError: missing or not JSON, or a preprocessing this package lacks.
    """
    try:
        cfg = json.loads((store.path(path) / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{store.path(path) / CONFIG} is not readable JSON: {e}") from None
    processor = store.path(path) / PREPROCESSOR
    if "vit_jax_preprocessing" not in cfg and processor.exists():
        try:
            cfg["vit_jax_preprocessing"] = from_hf_processor(json.loads(processor.read_text()))
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            raise CheckpointError(f"{processor}: {e}") from None
    return cfg


def read_dir(path: str | os.PathLike) -> tuple[dict, dict]:
    """An HF ViT directory -> (original-layout tree, its config.json).

    Raises:
      CheckpointError: another architecture, missing weights, or tensors that do not
        fit the config (each named).
    """
    path = store.path(path)
    cfg = read_config(path)
    if cfg.get("model_type") != "vit":
        raise CheckpointError(
            f"{path} holds a Hugging Face {cfg.get('model_type')!r} model "
            f"({', '.join(cfg.get('architectures') or ['?'])}); only model_type 'vit' "
            "(ViTModel / ViTForImageClassification) is read"
        )
    tensors = {
        ("vit." + k if k.startswith(("embeddings.", "encoder.", "layernorm.")) else k): v
        for k, v in read_tensors(path).items()
    }  # a bare ViTModel
    tensors.pop("vit.embeddings.mask_token", None)  # masked image modelling only
    tensors = {k: v for k, v in tensors.items() if not k.startswith(("pooler.", "vit.pooler."))}
    h = int(cfg.get("num_attention_heads", 12))
    model = get_model(
        None,
        tensors["classifier.bias"].shape[0] if "classifier.bias" in tensors else None,
        width=int(cfg.get("hidden_size", 768)),
        depth=int(cfg.get("num_hidden_layers", 12)),
        num_heads=h,
        mlp_dim=int(cfg.get("intermediate_size", 3072)),
        patch_size=int(cfg.get("patch_size", 16)),
        channels=int(cfg.get("num_channels", 3)),
    )
    size = cfg.get("image_size", 224)
    size = (int(size), int(size)) if isinstance(size, (int, float)) else tuple(map(int, size))
    fix = "Is config.json the one saved with these weights?"
    check_table(tensors, hf_shapes(model, size), str(path), "Hugging Face ViT", fix)
    return from_hf(tensors, h), cfg


def read_tensors(path: store.Path) -> dict[str, np.ndarray]:
    """A folder's model.safetensors, or the shards its index names."""
    index = path / (WEIGHTS + ".index.json")
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: a for s in shards for k, a in safetensors_io.read(path / s)[0].items()}
    if not (path / WEIGHTS).is_file():
        raise CheckpointError(
            f"{path} has no {WEIGHTS}; only safetensors weights are read (re-save with "
            "model.save_pretrained(DIR, safe_serialization=True))"
        )
    return safetensors_io.read(path / WEIGHTS)[0]


def from_hf(tensors: dict[str, np.ndarray], num_heads: int) -> dict:
    """The HF state dict (NumPy, keys with 'vit.') -> an original-layout tree."""
    top = {v: k for k, v in _TOP.items()}
    block = {v: k for k, v in _BLOCK.items()}
    flat = {}
    for key, a in tensors.items():
        m = re.fullmatch(r"vit\.encoder\.layer\.(\d+)\.(.*)", key)
        name = block.get(m[2]) if m else None
        to = f"Transformer/encoderblock_{m[1]}/{name}" if name else top.get(key)
        if to is None:
            raise CheckpointError(f"tensor {key} {a.shape} is not in Hugging Face's ViT layout")
        flat[to] = leaf_from_torch(to, np.asarray(a), num_heads)
    return traverse_util.unflatten_dict(flat, sep="/")


def write_dir(
    path: str | os.PathLike,
    tensors: dict[str, np.ndarray],
    cfg: dict,
    preprocessor: dict | None = None,
) -> None:
    """Write config.json, model.safetensors and (given) preprocessor_config.json into a
    new directory `path`, built under a temporary name and renamed, so nothing
    half-written is left at `path` (`files.atomic_dir`).

    Raises:
        FileExistsError: `path` exists and is not an empty directory.
    """
    with files.atomic_dir(path) as tmp:
        safetensors_io.write(tmp / WEIGHTS, tensors, {"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
        if preprocessor is not None:
            (tmp / PREPROCESSOR).write_text(json.dumps(preprocessor, indent=2) + "\n")


def how_to_load(out: str, where: str, method: str | None) -> str:
    """Python lines that load the directory `out` (`where`: its absolute path) into
    transformers' image-classification pipeline, with PIL's resize."""
    d, fetch = repr(where), ""
    if store.is_remote(out):  # from_pretrained reads a local directory: a copy of it
        fetch = (
            "import fsspec, tempfile\n"
            "d = tempfile.mkdtemp()  # transformers reads a local copy of the directory\n"
            f"fs, root = fsspec.core.url_to_fs({out!r})\n"
            "fs.get(root + '/', d + '/', recursive=True)\n"
        )
        d = "d"
    resize = (
        "# PIL's resize, as vit_jax computes (transformers prefers torchvision's where\n"
        "# torchvision is installed, which rounds differently)\n"
    )
    if method == "tf_bilinear":
        resize = (
            "# PIL's antialiased resize: transformers has none without antialiasing, and\n"
            "# these weights were trained on tf.image.resize's (vit_jax's preprocessing\n"
            "# 'tf_bilinear'): probabilities differ slightly from vit_jax.infer's\n"
        )
    return fetch + (
        "import transformers\n"
        f"model = transformers.ViTForImageClassification.from_pretrained({d})\n"
        + resize
        + f"processor = transformers.AutoImageProcessor.from_pretrained({d}, backend='pil')\n"
        "classify = transformers.pipeline(\n"
        "    'image-classification', model=model, image_processor=processor\n"
        ")\n"
        "# classify('cat.jpg') -> the top 5 classes with their probabilities"
    )
