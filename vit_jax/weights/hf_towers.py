"""transformers' vision towers -> the original layout (read only): DINOv2 (with and without
registers), DINOv3, the image tower of CLIP, SigLIP and SigLIP 2 (the `*VisionModel`
folders, or the two-tower `CLIPModel` / `SiglipModel` / `Siglip2Model` ones, whose text
tower is left unread); a plain ViT folder goes to hf.py.

The names of every model_type are in the tables below: the hub's (which transformers 5
also saves: DINOv2's attention.attention.query and packed SwiGLU `mlp.weights_in`, CLIP's
vision_model. prefix) and those transformers 5 holds in memory. `read_dir` also returns
the `VisionTransformer` fields the tensors cannot tell, so that the model's pre-logits
features are transformers' `pooler_output` (CLIP's `image_embeds` with the projection as
its head, a head without bias):
  DINOv2, DINOv3   the class token after the final LayerNorm (DINOv3: RoPE, no table);
  CLIP             LN(class token) (post_layernorm is our fc_norm, pre_layrnorm pre_norm);
  SigLIP (2)       the MAP head on the LayerNormed tokens (SigLIP 2 on NaFlex patches).
At another size the table is resized as transformers' `interpolate_pos_encoding` does
(`RESIZES`: PyTorch's bicubic, with antialias for DINOv2 with registers; CLIP's and
SigLIP's with interpolate_pos_encoding=True).
DINOv2 with registers adds the class row of its table to the class token and none to the
registers: the class row is folded into the class token here (embed_prefix False).
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
from flax import traverse_util

from vit_jax.base import store
from vit_jax.models.layers import QKV_BIASES
from vit_jax.weights import hf
from vit_jax.weights._tensors import leaf_from_torch, torch_names, unfuse
from vit_jax.weights.architecture import POSEMB
from vit_jax.weights.errors import CheckpointError

# model_type -> (family, its config's defaults: heads, hidden_act, layer_norm_eps)
MODELS = {
    "dinov2": ("dinov2", 12, "gelu", 1e-6),
    "dinov2_with_registers": ("dinov2", 12, "gelu", 1e-6),
    "dinov3_vit": ("dinov3", 6, "gelu", 1e-5),
    "clip_vision_model": ("clip", 12, "quick_gelu", 1e-5),
    "clip": ("clip", 12, "quick_gelu", 1e-5),
    "siglip_vision_model": ("siglip", 12, "gelu_pytorch_tanh", 1e-6),
    "siglip": ("siglip", 12, "gelu_pytorch_tanh", 1e-6),
    "siglip2_vision_model": ("siglip", 12, "gelu_pytorch_tanh", 1e-6),
    "siglip2": ("siglip", 12, "gelu_pytorch_tanh", 1e-6),
}
# model_type -> PyTorch's resize of its table (posemb.RESIZES): transformers 5's
RESIZES = {"dinov2": "bicubic", "dinov2_with_registers": "bicubic_aa"}
RESIZES |= dict.fromkeys(("clip", "clip_vision_model", "siglip", "siglip_vision_model"), "bicubic")
GELUS = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "quick_gelu": "quick"}
# the text tower, masked image modelling, the contrastive loss, old files' buffers: not read
UNREAD = (
    "text_model.",
    "text_projection.",
    "logit_scale",
    "logit_bias",
    "embeddings.mask_token",
    "embeddings.position_ids",
)
_ATT = "MultiHeadDotProductAttention_1"
_MAP = "MAPHead_0/MultiHeadDotProductAttention_0"


def _leaves(modules: dict[str, str]) -> dict[str, str]:
    """{torch module: original module} -> {torch leaf: original leaf} (`torch_names`,
    inverted)."""
    each = (torch_names({o: t}).items() for t, o in modules.items())
    return {t: o for leaves in each for o, t in leaves}


_TOP = {  # without the `vision_model.` prefix
    "embeddings.cls_token": "cls",
    "embeddings.class_embedding": "cls",  # CLIP [D]
    "embeddings.register_tokens": "reg",
    "embeddings.position_embeddings": POSEMB,
    "embeddings.position_embedding.weight": POSEMB,  # CLIP, SigLIP [N, D]
    "head.probe": "MAPHead_0/probe",
    **_leaves(
        {
            "embeddings.patch_embeddings.projection": "embedding",  # DINOv2
            "embeddings.patch_embeddings": "embedding",  # DINOv3
            "embeddings.patch_embedding": "embedding",  # CLIP, SigLIP (2: a Linear)
            "layernorm": "Transformer/encoder_norm",  # DINOv2
            "norm": "Transformer/encoder_norm",  # DINOv3
            "pre_layrnorm": "Transformer/pre_norm",  # CLIP
            "visual_projection": "head",  # CLIP, no bias
            "head.attention.out_proj": f"{_MAP}/out",
            "head.layernorm": "MAPHead_0/LayerNorm_0",
            "head.mlp.fc1": "MAPHead_0/MlpBlock_0/Dense_0",
            "head.mlp.fc2": "MAPHead_0/MlpBlock_0/Dense_1",
        }
    ),
}
_POST = {"clip": "fc_norm", "siglip": "Transformer/encoder_norm"}  # post_layernorm
_BLOCK = {  # under (encoder.)layer(s).{i}.
    "layer_scale1.lambda1": "layer_scale_1",
    "layer_scale2.lambda1": "layer_scale_2",
    **_leaves(
        {
            "norm1": "LayerNorm_0",  # DINOv2, DINOv3
            "layer_norm1": "LayerNorm_0",  # CLIP, SigLIP
            "norm2": "LayerNorm_2",
            "layer_norm2": "LayerNorm_2",
            **{f"attention.attention.{n}": f"{_ATT}/{n}" for n in ("query", "key", "value")},
            **{f"attention.{n[0]}_proj": f"{_ATT}/{n}" for n in ("query", "key", "value")},
            **{f"self_attn.{n[0]}_proj": f"{_ATT}/{n}" for n in ("query", "key", "value")},
            "attention.output.dense": f"{_ATT}/out",
            "attention.o_proj": f"{_ATT}/out",
            "self_attn.out_proj": f"{_ATT}/out",
            "mlp.fc1": "MlpBlock_3/Dense_0",
            "mlp.fc2": "MlpBlock_3/Dense_1",
            "mlp.up_proj": "MlpBlock_3/Dense_0",  # SwiGLU's x half, or DINOv3's plain MLP
            "mlp.gate_proj": "MlpBlock_3/gate",
            "mlp.down_proj": "MlpBlock_3/Dense_1",
            "mlp.weights_out": "MlpBlock_3/Dense_1",  # DINOv2 giant (weights_in: below)
        }
    ),
}


def read_dir(path: str | os.PathLike) -> tuple[dict, dict, dict]:
    """A transformers folder -> (original-layout tree, the `VisionTransformer` fields its
    tensors cannot tell, config.json). The fields hold `posemb_grid`, the grid the model
    was made for (DINOv3's, without a table, from its image_size).

    Raises:
      CheckpointError: a model_type not read (in one line with the ones read), missing
        weights, or a tensor this model_type does not have.
    """
    path = store.path(path)
    cfg = hf.read_config(path)
    kind = cfg.get("model_type")
    if kind == "vit":
        params, cfg = hf.read_dir(path)
        return params, {}, cfg
    if kind not in MODELS:
        raise CheckpointError(
            f"{path} holds a Hugging Face {kind!r} model; the model types read are "
            + ", ".join(["vit", *MODELS])
        )
    family, heads, act, eps = MODELS[kind]
    v = cfg.get("vision_config") or cfg  # a two-tower folder: its image tower's
    heads, act = int(v.get("num_attention_heads", heads)), v.get("hidden_act", act)
    flat = _canonical(hf.read_tensors(path), family, heads, str(path))
    p = int(v.get("patch_size", 14 if family == "dinov2" else 16))
    k = flat["embedding/kernel"]
    if k.ndim == 2:  # SigLIP 2: a Linear on patches flattened (row, column, channel)
        flat["embedding/kernel"] = k.reshape(p, p, -1, k.shape[-1])
    gelu = GELUS.get(act)
    if "Transformer/encoderblock_0/MlpBlock_3/gate/kernel" in flat:  # SwiGLU: SiLU on the gate
        gelu = "exact" if family == "dinov2" or act == "silu" else None  # 'exact': unused
    if gelu is None:
        raise CheckpointError(f"{path} computes hidden_act {act!r}; read: {', '.join(GELUS)}")
    fields = {"layer_norm_eps": float(v.get("layer_norm_eps", eps)), "gelu": gelu}
    if family == "dinov3":
        fields.update(posemb="none", rope="dinov3", rope_base=float(v.get("rope_theta", 100.0)))
    if family == "siglip" and "MAPHead_0/probe" not in flat:
        raise CheckpointError(f"{path} has no pooling head (vision_use_head false): not read")
    if "reg" in flat and POSEMB in flat:  # the class row, added to the class token alone
        flat["cls"] = flat["cls"] + flat[POSEMB][:, :1]
        flat[POSEMB] = flat[POSEMB][:, 1:]
    if POSEMB in flat and "cls" in flat:
        fields["embed_prefix"] = "reg" not in flat
    if "num_patches" in v or kind.startswith("siglip2"):  # SigLIP 2: a square table
        side = math.isqrt(int(v.get("num_patches", 256)))
        fields["posemb_grid"] = (side, side)
    else:
        size = v.get("image_size", 518 if family == "dinov2" else 224)
        size = (size, size) if isinstance(size, (int, float)) else size
        fields["posemb_grid"] = (int(size[0]) // p, int(size[1]) // p)
    return traverse_util.unflatten_dict(flat, sep="/"), fields, cfg


def _canonical(tensors: dict, family: str, heads: int, source: str) -> dict[str, np.ndarray]:
    """The state dict -> the flat original layout; a projection without bias gets zeros
    where the model has one (DINOv3's proj_bias, mlp_bias; a key bias alone)."""
    top = {**_TOP, **_leaves({"post_layernorm": _POST[family]} if family in _POST else {})}
    flat = {}
    for key, a in tensors.items():
        key, a = key.removeprefix("vision_model."), np.asarray(a, np.float32)
        m = re.fullmatch(r"(?:encoder\.|model\.)?layers?\.(\d+)\.(.*)", key)
        at = f"Transformer/encoderblock_{m[1]}" if m else ""
        if key.startswith(UNREAD) or a.size == 0:  # DINOv3 without registers: [1, 0, D]
            continue
        if key in ("head.attention.in_proj_weight", "head.attention.in_proj_bias"):
            flat.update(unfuse(_MAP, ("query", "key", "value"), a, heads))
        elif m and m[2].startswith("mlp.weights_in."):  # DINOv2's packed SwiGLU: gate, x
            leaf = "kernel" if a.ndim == 2 else "bias"
            for name, half in zip(("gate", "Dense_0"), np.split(a, 2), strict=True):
                flat[f"{at}/MlpBlock_3/{name}/{leaf}"] = half.T
        elif (m and m[2] in _BLOCK) or (not m and key in top):
            to = f"{at}/{_BLOCK[m[2]]}" if m else top[key]
            flat[to] = leaf_from_torch(to, a, heads)
        else:
            raise CheckpointError(f"{source}: tensor {key} {a.shape} is not in a {family} tower")
    for to in ("cls", POSEMB):  # CLIP's class token [D], CLIP's and SigLIP's table [N, D]
        if to in flat:
            flat[to] = flat[to].reshape(1, -1, flat[to].shape[-1])
    b0 = f"Transformer/encoderblock_0/{_ATT}/"
    has = "".join(n[0] for n in ("query", "key", "value") if f"{b0}{n}/bias" in flat)
    for k in [k for k in flat if k.endswith("/kernel") and k != "embedding/kernel"]:
        qkv = re.search(f"{_ATT}/(query|key|value)/", k)
        if not (qkv and has in QKV_BIASES):  # [H, hd] or [features]
            bias = np.zeros(flat[k].shape[1:] if qkv else flat[k].shape[-1:], np.float32)
            flat.setdefault(k.removesuffix("kernel") + "bias", bias)
    return flat
