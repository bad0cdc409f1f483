"""timm's `VisionTransformer` state dict <-> the original layout.

Key map (torch Linear weights are the transpose of Flax kernels; convs [O, I, kh, kw]):
  cls [1, 1, D]                          cls_token
  Transformer/posembed_input/...         pos_embed [1, N(+1), D]
  embedding/{kernel [P,P,C,D], bias}     patch_embed.proj.{weight [D,C,P,P], bias}
  encoderblock_{i}/LayerNorm_0           blocks.{i}.norm1.{weight, bias}
  .../MultiHeadDotProductAttention_1/{query,key,value}/{kernel [D,H,d], bias [H,d]}
                                         blocks.{i}.attn.qkv.{weight [3D, D], bias [3D]}
  .../out/{kernel [H,d,D], bias}         blocks.{i}.attn.proj.{weight [D, D], bias}
  encoderblock_{i}/LayerNorm_2           blocks.{i}.norm2
  .../MlpBlock_3/Dense_0, Dense_1        blocks.{i}.mlp.fc1 [M, D], fc2 [D, M]
  Transformer/encoder_norm               norm
  head/{kernel [D, K], bias}             head.{weight [K, D], bias}
  MAPHead_0/...                          attn_pool.{latent, q, kv, proj, norm, mlp} ('map')
The towers (towers.py names the architectures):
  reg [1, R, D]                          reg_token
  Transformer/pre_norm, fc_norm          norm_pre, fc_norm
  encoderblock_{i}/layer_scale_{1,2}     blocks.{i}.ls{1,2}.gamma [D]
  .../MlpBlock_3/{gate, Dense_0}         blocks.{i}.mlp.fc1 [2F, D] (SwiGLUPacked: gate rows
                                         first; told from fc2 [D, F])
Hybrids (timm's ResNetV2 stem, `patch_embed.backbone.` + ...):
  conv_root, gn_root                     stem.conv, stem.norm (root-only stems: conv, norm)
  block{s}/unit{u}/conv{r}, gn{r}        stages.{s-1}.blocks.{u-1}.conv{r}, norm{r}
  block{s}/unit{u}/conv_proj, gn_proj    stages.{s-1}.blocks.{u-1}.downsample.conv, .norm

timm's VisionTransformer has no representation ('pre_logits') layer. The Python that
builds timm's model for a converted file is timm_recipe.py's.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from vit_jax.models import SIZES, param_shapes
from vit_jax.models.vit import VisionTransformer
from vit_jax.weights._tensors import (
    Shape,
    check_table,
    concat,
    leaf_from_torch,
    leaf_to_torch,
    torch_names,
    unfuse,
)
from vit_jax.weights.architecture import POSEMB
from vit_jax.weights.errors import CheckpointError

_ATT = "MultiHeadDotProductAttention_1"
_BLOCK = {  # original name under encoderblock_{i}/ -> timm name under blocks.{i}.
    **torch_names(
        {
            "LayerNorm_0": "norm1",
            "LayerNorm_2": "norm2",
            "MlpBlock_3/Dense_0": "mlp.fc1",
            "MlpBlock_3/Dense_1": "mlp.fc2",
            f"{_ATT}/out": "attn.proj",
        }
    ),
    "layer_scale_1": "ls1.gamma",
    "layer_scale_2": "ls2.gamma",
}
_MAP, _MAP_ATT = "MAPHead_0/", "MultiHeadDotProductAttention_0"
_TOP = {  # original key -> timm key, outside the blocks (the MAP head's k, v: fused as kv)
    "cls": "cls_token",
    "reg": "reg_token",
    POSEMB: "pos_embed",
    _MAP + "probe": "attn_pool.latent",
    **torch_names(
        {
            "embedding": "patch_embed.proj",
            "Transformer/encoder_norm": "norm",
            "Transformer/pre_norm": "norm_pre",
            "fc_norm": "fc_norm",
            "head": "head",
            _MAP + "LayerNorm_0": "attn_pool.norm",
            _MAP + "MlpBlock_0/Dense_0": "attn_pool.mlp.fc1",
            _MAP + "MlpBlock_0/Dense_1": "attn_pool.mlp.fc2",
            f"{_MAP}{_MAP_ATT}/query": "attn_pool.q",
            f"{_MAP}{_MAP_ATT}/out": "attn_pool.proj",
        }
    ),
}
PRE_LOGITS = (
    "the checkpoint has a representation layer (pre_logits) under its head; timm's "
    "VisionTransformer has none. Convert with num_classes=K for a new head "
    "(the layer is dropped), or with format='npz'"
)
_GN = {"scale": "weight", "bias": "bias"}


def _backbone_key(key: str, root_only: bool) -> str | None:
    """A hybrid stem's original key -> timm's, or None for a key outside the stem."""
    pre = "patch_embed.backbone." + ("" if root_only else "stem.")
    m = re.fullmatch(r"conv_root/kernel|gn_root/(scale|bias)", key)
    if m:
        return pre + ("norm." + _GN[m[1]] if m[1] else "conv.weight")
    m = re.fullmatch(r"block(\d+)/unit(\d+)/(conv|gn)(\d|_proj)/(kernel|scale|bias)", key)
    if not m:
        return None
    stage, unit, kind, which, leaf = m.groups()
    at = f"patch_embed.backbone.stages.{int(stage) - 1}.blocks.{int(unit) - 1}."
    if which == "_proj":
        return at + ("downsample.conv.weight" if kind == "conv" else "downsample.norm." + _GN[leaf])
    return at + (f"conv{which}.weight" if kind == "conv" else f"norm{which}." + _GN[leaf])


def to_timm(params: dict) -> dict[str, Any]:
    """An original-layout tree (arrays, or `Shape`s) -> timm's state dict (same kind).

    Raises:
      CheckpointError: a representation layer (timm has none), or a key timm lacks.
    """
    flat = traverse_util.flatten_dict(params, sep="/")
    if "pre_logits/kernel" in flat:
        raise CheckpointError(PRE_LOGITS)
    root_only = "block1/unit1/conv1/kernel" not in flat
    swiglu = "Transformer/encoderblock_0/MlpBlock_3/gate/kernel" in flat
    out: dict[str, Any] = {}
    qkv: dict[str, dict[str, Any]] = {}  # timm's fused tensors, by the parts they join
    for key, a in flat.items():
        m = re.fullmatch(r"Transformer/encoderblock_(\d+)/(.*)", key)
        fused = re.fullmatch(_FUSED, key)
        glu = swiglu and m and re.fullmatch(r"MlpBlock_3/(gate|Dense_0)/(kernel|bias)", m[2])
        to = f"blocks.{m[1]}.{_BLOCK[m[2]]}" if m and m[2] in _BLOCK else _TOP.get(key)
        if glu:  # SwiGLUPacked's fc1: the gate's rows, then Dense_0's
            leaf = "weight" if glu[2] == "kernel" else "bias"
            qkv.setdefault(f"blocks.{m[1]}.mlp.fc1.{leaf}", {})[glu[1]] = leaf_to_torch(key, a)
            continue
        if to is None and fused:  # one of timm's fused q, k, v (a block's) or k, v (the MAP head's)
            at = f"blocks.{m[1]}.attn.qkv" if m else "attn_pool.kv"
            leaf = "weight" if fused[2] == "kernel" else "bias"
            qkv.setdefault(f"{at}.{leaf}", {})[fused[1]] = leaf_to_torch(key, a)  # [H*d(, D)]
            continue
        to = to or _backbone_key(key, root_only)
        if to is None:
            raise CheckpointError(f"parameter {key} {tuple(a.shape)} has no place in timm's layout")
        out[to] = leaf_to_torch(key, a)
    for key, parts in qkv.items():  # rows q, k, v of [3D, D] (weight) or [3D] (bias); kv: k, v
        if key.endswith("qkv.bias") and len(parts) < 3:
            raise CheckpointError(
                "only some of the query, key and value projections have a bias: timm's "
                "VisionTransformer biases all or none (format='npz' keeps them)"
            )
        out[key] = concat([parts[n] for n in (*_QKV, "gate", "Dense_0") if n in parts], 0)
    return out


_QKV = ("query", "key", "value")
_FUSED = rf".*(?:{_ATT}|{_MAP_ATT})/(query|key|value)/(kernel|bias)"  # timm fuses them


def timm_shapes(model: VisionTransformer, image_size: tuple[int, int]) -> dict[str, Shape]:
    """timm's state dict shapes for `model` at `image_size` (its `strict=True` table)."""
    shapes = param_shapes(model.clone(scan=False, remat=False), image_size)
    return to_timm(jax.tree.map(lambda v: Shape(v.shape), shapes))


def from_timm(tensors: dict[str, np.ndarray], num_heads: int | None = None) -> dict:
    """timm's state dict (NumPy) -> an original-layout tree.

    Args:
      tensors: the state dict, e.g. `safetensors_io.read(path)[0]`.
      num_heads: attention heads (a fused qkv weight does not tell them); None: the
        published size with this width (192: 3, 384: 6, 768: 12, 1024 and 1280: 16).

    Raises:
      CheckpointError: a key that is not timm's ViT layout, or unknown heads.
    """
    d = np.shape(tensors.get("patch_embed.proj.weight", np.zeros((0,))))[0]
    if num_heads is None:
        num_heads = next((h for w, _, h, _ in SIZES.values() if w == d), None)
        if num_heads is None:
            raise CheckpointError(
                f"width {d} is no published size, so the number of attention heads is "
                "unknown: name the model (name=NAME) or its heads (num_heads=H)"
            )
    if d % num_heads:
        raise CheckpointError(
            f"the file's width {d} is not divisible by {num_heads} heads: is it the model "
            "you meant? (name=NAME, or num_heads=H)"
        )
    inverse = {v: k for k, v in _TOP.items()}
    block = {v: k for k, v in _BLOCK.items()}
    flat: dict[str, np.ndarray] = {}
    for key, a in tensors.items():
        a = np.asarray(a)
        m = re.fullmatch(r"blocks\.(\d+)\.(.*)", key)
        enc = f"Transformer/encoderblock_{m[1]}/" if m else ""
        if m and m[2] in ("mlp.fc1.weight", "mlp.fc1.bias") and packed_mlp(tensors, m[1]):
            flat |= unfuse(enc + "MlpBlock_3", ("gate", "Dense_0"), a, num_heads)
        elif m and m[2] in block:
            flat[enc + block[m[2]]] = leaf_from_torch(block[m[2]], a, num_heads)
        elif m and m[2] in ("attn.qkv.weight", "attn.qkv.bias"):
            flat |= unfuse(enc + _ATT, _QKV, a, num_heads)
        elif key in ("attn_pool.kv.weight", "attn_pool.kv.bias"):
            flat |= unfuse(_MAP + _MAP_ATT, ("key", "value"), a, num_heads)
        elif key in inverse:
            flat[inverse[key]] = leaf_from_torch(inverse[key], a, num_heads)
        elif key.startswith("patch_embed.backbone."):
            flat[_backbone_from(key)] = leaf_from_torch(_backbone_from(key), a, num_heads)
        else:
            raise CheckpointError(
                f"tensor {key} {a.shape} is not in timm's VisionTransformer layout (this "
                "package reads plain ViTs, their towers and the ResNetV2 hybrids)"
            )
    return traverse_util.unflatten_dict(flat, sep="/")


def packed_mlp(tensors: dict[str, np.ndarray], i: str) -> bool:
    """Whether block i's fc1 packs SwiGLU's two halves: [2F, D] rows for fc2's F inputs."""
    fc1, fc2 = (np.shape(tensors.get(f"blocks.{i}.mlp.fc{n}.weight", ())) for n in (1, 2))
    return len(fc1) == len(fc2) == 2 and fc1[0] == 2 * fc2[1]


def _backbone_from(key: str) -> str:
    """timm's hybrid stem key -> the original one."""
    k = key[len("patch_embed.backbone.") :]
    leaf = {"weight": "scale", "bias": "bias"}
    m = re.fullmatch(r"(?:stem\.)?(conv|norm)\.(weight|bias)", k)
    if m:
        return "conv_root/kernel" if m[1] == "conv" else f"gn_root/{leaf[m[2]]}"
    unit_re = r"stages\.(\d+)\.blocks\.(\d+)\."
    m = re.fullmatch(unit_re + r"(?:(conv|norm)(\d)|downsample\.(conv|norm))\.(weight|bias)", k)
    if not m:
        raise CheckpointError(f"tensor {key} is not in timm's ResNetV2 hybrid stem layout")
    stage, unit, kind, r, dkind, w = m.groups()
    at = f"block{int(stage) + 1}/unit{int(unit) + 1}/"
    kind, which = (kind, r) if kind else (dkind, "_proj")
    return at + ("conv" + which + "/kernel" if kind == "conv" else "gn" + which + "/" + leaf[w])


def check(
    tensors: dict[str, np.ndarray], model: VisionTransformer, size: tuple[int, int], source: str
) -> None:
    """Raise naming every tensor of `tensors` that timm's table for `model` lacks,
    misses or shapes differently."""
    fix = "Is the file a timm ViT of this size? Pass name=NAME for a size the file cannot tell."
    check_table(tensors, timm_shapes(model, size), source, "timm VisionTransformer", fix)
