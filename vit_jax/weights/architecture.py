"""What a checkpoint's parameters say about the model that made them.

A parameter tree in the original published layout (`npz.canonical`) fixes the
architecture up to options that leave no parameters behind: sizes, patch, the hybrid
stem's stages, the class token or MAP head, the representation layer, the head and the
kind of learned position embedding are all read here. A file without learned position
embeddings was trained with posemb 'none' or 'sincos_2d', which the file cannot tell
apart: `architecture` then says so, and the caller names the option.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax.models import VARIANTS, variant_config
from vit_jax.weights.errors import CheckpointError

POSEMB = "Transformer/posembed_input/pos_embedding"


def num_classes(params: dict) -> int | None:
    """Width of the stored head; None for a file without one."""
    if "head" not in params:
        return None
    return int(np.shape(params["head"]["bias"])[0])


def sizes(flat_params: dict[str, Any]) -> dict[str, Any]:
    """Width, depth, heads, MLP width, patch size and ResNet stages of a flat tree.

    Raises:
      CheckpointError: the tree is not a ViT in the published layout.
    """
    f = flat_params
    try:
        p, _, channels, d = np.shape(f["embedding/kernel"])
        depth = len({k.split("/")[1] for k in f if k.startswith("Transformer/encoderblock_")})
        mlp = np.shape(f["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"])[1]
        att = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
        heads = np.shape(f[att])[1]
    except (KeyError, IndexError, ValueError) as e:
        raise CheckpointError(
            f"not a ViT checkpoint this package knows (no {e}): expected the published "
            "layout (embedding/kernel, Transformer/encoderblock_0/..., head/...)"
        ) from None
    stages = None
    if "conv_root/kernel" in f:
        units: dict[int, int] = {}
        for k in f:
            m = re.match(r"block(\d+)/unit(\d+)/", k)
            if m:
                units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]))
        stages = tuple(units[s] for s in sorted(units))
        channels = np.shape(f["conv_root/kernel"])[2]
    return dict(
        width=int(d),
        depth=depth,
        num_heads=int(heads),
        mlp_dim=int(mlp),
        patch_size=int(p),
        resnet_stages=stages,
        channels=int(channels),
    )


def classifier(flat_params: dict[str, Any]) -> str:
    """'token' with a class token, 'map' with a MAP head (big_vision's MAPHead_0), else 'gap'."""
    if "cls" in flat_params:
        return "token"
    return "map" if "MAPHead_0/probe" in flat_params else "gap"


_BLOCK0 = "Transformer/encoderblock_0/"
_ATT0 = _BLOCK0 + "MultiHeadDotProductAttention_1/"


def towers(f: dict[str, Any], grid: tuple[int, int] | None = None) -> dict[str, Any]:
    """The towers' fields a flat tree fixes (VisionTransformer's docstring): registers,
    LayerScale (its initial value is not stored: 1e-5 stands for it), pre_norm, fc_norm,
    SwiGLU, the MLP's and the heads' LayerNorms, the projections' biases, and whether the
    prefix has rows in the position table: rows beyond the patch `grid` where the file
    records it, else the table's rows a square only without the prefix's."""
    out = dict(
        registers=int(np.shape(f["reg"])[1]) if "reg" in f else 0,
        layer_scale=1e-5 if _BLOCK0 + "layer_scale_1" in f else None,
        pre_norm="Transformer/pre_norm/scale" in f,
        fc_norm="fc_norm/scale" in f,
        swiglu=_BLOCK0 + "MlpBlock_3/gate/kernel" in f,
        mlp_norm=_BLOCK0 + "MlpBlock_3/norm/scale" in f,
        attention_norm=_ATT0 + "norm/scale" in f,
        qkv_bias="".join(a[0] for a in ("query", "key", "value") if f"{_ATT0}{a}/bias" in f),
    )
    if "cls" in f:  # kept whatever pools (timm's avg keeps it and pools the patches)
        out["class_token"] = True
    prefix = int("cls" in f) + out["registers"]
    if prefix and POSEMB in f:  # rows for the prefix, or (timm's no_embed_class) none
        rows = np.shape(f[POSEMB])[1]
        square = lambda n: n > 0 and round(np.sqrt(n)) ** 2 == n
        guess = not (square(rows) and not square(rows - prefix))
        out["embed_prefix"] = rows != grid[0] * grid[1] if grid else guess
    return out


def architecture(params: dict, grid: tuple[int, int] | None = None) -> dict[str, Any]:
    """Every `VisionTransformer` field a parameter tree (original layout) fixes.

    Returns:
      fields for `get_model(name, num_classes, **fields)`: the sizes, resnet_stages,
      channels, classifier (`classifier`),
      representation_size (None without pre_logits), posemb ('learned' or
      'learned_2d'; None when the file has no learned position embeddings), and the
      towers' fields (`towers`).
    """
    f = traverse_util.flatten_dict(params, sep="/")
    out = {**sizes(f), **towers(f, grid)}
    out["classifier"] = classifier(f)
    out["representation_size"] = (
        int(np.shape(f["pre_logits/bias"])[0]) if "pre_logits/bias" in f else None
    )
    tables = {POSEMB: "learned", POSEMB + "_row": "learned_2d"}  # None: no learned table
    out["posemb"] = next((kind for key, kind in tables.items() if key in f), None)
    return out


def guess_variant(flat_params: dict[str, Any]) -> str:
    """The published variant whose shapes a flat tree has, or its sizes in words."""
    try:
        s = sizes(flat_params)
    except CheckpointError:
        return "not a ViT checkpoint this package knows"
    s.pop("channels")
    for name in VARIANTS:
        cfg = variant_config(name)
        pool = cfg.get("classifier", "token")
        if all(cfg[k] == v for k, v in s.items()) and pool == classifier(flat_params):
            return name
    return (
        f"width {s['width']}, depth {s['depth']}, {s['num_heads']} heads, "
        f"MLP {s['mlp_dim']}, patch {s['patch_size']}"
        + (f", ResNet stages {s['resnet_stages']}" if s["resnet_stages"] is not None else "")
    )


def native_image_size(params: dict, token_stride: int) -> tuple[int, int]:
    """The resolution the stored learned position embeddings were made for.

    Raises:
      CheckpointError: no learned position embeddings, or a 1D table whose token count
        is not a square (its grid cannot be read from the count alone): pass the size.
    """
    pe = params.get("Transformer", {}).get("posembed_input", {})
    if "pos_embedding" in pe:
        f = traverse_util.flatten_dict(params, sep="/")
        t = towers(f)
        prefix = (int("cls" in f) + t["registers"]) * t.get("embed_prefix", True)
        n = pe["pos_embedding"].shape[1] - prefix  # the patches' rows
        side = int(round(np.sqrt(n)))
        if side * side != n:
            raise CheckpointError(
                f"the checkpoint's position embeddings hold {n} patch tokens, not a square "
                "grid, so its resolution cannot be read from them: pass the image size "
                "(image_size=(H, W))"
            )
        gh = gw = side
    elif "pos_embedding_row" in pe:
        gh, gw = pe["pos_embedding_row"].shape[1], pe["pos_embedding_col"].shape[1]
    else:
        raise CheckpointError(
            "the checkpoint has no learned position embeddings to tell its resolution "
            "from: pass the image size (image_size=(H, W))"
        )
    return gh * token_stride, gw * token_stride
