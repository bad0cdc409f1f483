"""timm's `Eva` state dict (DINOv3, EVA-02) <-> the original layout.

Key map (under blocks.{i}. / Transformer/encoderblock_{i}/; torch Linear weights are the
transpose of Flax kernels, as in timm.py):
  cls [1, 1, D], reg [1, R, D]            cls_token, reg_token
  Transformer/posembed_input/...          pos_embed [1, (1+)N, D] (EVA-02; DINOv3 has none)
  embedding/{kernel, bias}                patch_embed.proj (no bias under norm_pre)
  Transformer/pre_norm                    norm_pre
  LayerNorm_0, LayerNorm_2                norm1, norm2
  .../{query,key,value}/kernel [D,H,d]    attn.qkv.weight [3D, D], or attn.{q,k,v}_proj
  .../{query,value}/bias [H, d]           attn.q_bias, attn.v_bias, or attn.{q,v}_proj.bias
                                          (the key's bias is a zero buffer, never stored)
  .../MultiHeadDotProductAttention_1/norm [H, d]   attn.norm [D] (scale_attn_inner)
  .../out                                 attn.proj
  layer_scale_1, layer_scale_2            gamma_1, gamma_2
  MlpBlock_3/gate, MlpBlock_3/Dense_0     mlp.fc1_g, mlp.fc1_x; or mlp.fc1 [2F, D] packed,
                                          the gate's rows first; a plain MLP's Dense_0: mlp.fc1
  MlpBlock_3/norm, MlpBlock_3/Dense_1     mlp.norm (scale_mlp), mlp.fc2
  Transformer/encoder_norm, fc_norm, head norm, fc_norm, head

The rotary embeddings leave no tensors (timm's are buffers it does not save): the
towers.py row names them. Only their plain rotation is computed: the coordinate
augmentations DINOv3 trains with (shift, jitter, rescale; timm's `rope_*_coords`, in
training only) are not.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from vit_jax.models import param_shapes
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
from vit_jax.weights.timm import packed_mlp

_ATT, _MLP = "MultiHeadDotProductAttention_1", "MlpBlock_3"
_BLOCK = {  # original name under encoderblock_{i}/ -> timm name under blocks.{i}.
    "layer_scale_1": "gamma_1",
    "layer_scale_2": "gamma_2",
    **torch_names(
        {
            "LayerNorm_0": "norm1",
            "LayerNorm_2": "norm2",
            f"{_ATT}/query": "attn.q_proj",
            f"{_ATT}/key": "attn.k_proj",
            f"{_ATT}/value": "attn.v_proj",
            f"{_ATT}/norm": "attn.norm",
            f"{_ATT}/out": "attn.proj",
            f"{_MLP}/gate": "mlp.fc1_g",
            f"{_MLP}/Dense_0": "mlp.fc1_x",
            f"{_MLP}/norm": "mlp.norm",
            f"{_MLP}/Dense_1": "mlp.fc2",
        }
    ),
}
_TOP = {  # original key -> timm key, outside the blocks
    "cls": "cls_token",
    "reg": "reg_token",
    POSEMB: "pos_embed",
    **torch_names(
        {
            "embedding": "patch_embed.proj",
            "Transformer/pre_norm": "norm_pre",
            "Transformer/encoder_norm": "norm",
            "fc_norm": "fc_norm",
            "head": "head",
        }
    ),
}


def is_eva(tensors: dict[str, Any]) -> bool:
    """Whether a timm state dict is in the Eva layout (LayerScale, q/v biases, q_proj or
    SwiGLU halves under Eva's names), not the VisionTransformer's."""
    eva = ("gamma_1", ".q_bias", "attn.q_proj.weight", "mlp.fc1_g.weight", "attn.norm.weight")
    return any(k.endswith(eva) for k in tensors)


def timm_layout(model: VisionTransformer) -> tuple[bool, bool]:
    """(fused qkv, packed SwiGLU fc1) as timm's defs build `model`: q, k, v apart only
    where the MLP has its LayerNorm (EVA-02 B and L: qkv_fused=False with scale_mlp), the
    SwiGLU packed unless it has that LayerNorm or DINOv3's swiglu_align_to."""
    return not model.mlp_norm, model.swiglu and not model.mlp_norm and model.rope != "dinov3"


def to_timm(
    params: dict, model: VisionTransformer, fused: bool | None = None, packed: bool | None = None
) -> dict[str, Any]:
    """An original-layout tree (arrays, or `Shape`s) -> timm's Eva state dict (same kind).

    `fused`, `packed`: the qkv and SwiGLU layouts; None: `timm_layout(model)`'s.

    Raises:
      CheckpointError: a key timm's Eva has no place for (a key bias, a MAP head, ...).
    """
    layout = timm_layout(model)
    fused = layout[0] if fused is None else fused
    packed = layout[1] if packed is None else packed
    out: dict[str, Any] = {}
    for key, a in traverse_util.flatten_dict(params, sep="/").items():
        m = re.fullmatch(r"Transformer/encoderblock_(\d+)/(.*)", key)
        to = f"blocks.{m[1]}.{_BLOCK[m[2]]}" if m and m[2] in _BLOCK else _TOP.get(key)
        if to is None or to.endswith("k_proj.bias"):
            raise CheckpointError(f"parameter {key} {tuple(a.shape)} has no place in timm's Eva")
        a = leaf_to_torch(key, a)
        out[to] = a.reshape(-1) if to.endswith(("attn.norm.weight", "attn.norm.bias")) else a
    for at in [k[: -len("q_proj.weight")] for k in out if k.endswith("attn.q_proj.weight")]:
        if fused:  # rows q, k, v of [3D, D]; the biases apart (k's: timm's zero buffer)
            out[at + "qkv.weight"] = concat([out.pop(f"{at}{n}_proj.weight") for n in "qkv"])
            for n in "qv":
                if f"{at}{n}_proj.bias" in out:
                    out[f"{at}{n}_bias"] = out.pop(f"{at}{n}_proj.bias")
        mlp = at[: -len("attn.")] + "mlp."
        for leaf in ("weight", "bias"):
            up = out.pop(f"{mlp}fc1_x.{leaf}")
            if f"{mlp}fc1_g.{leaf}" not in out:  # a plain MLP
                out[f"{mlp}fc1.{leaf}"] = up
            elif packed:  # rows: the gate's, then x's
                out[f"{mlp}fc1.{leaf}"] = concat([out.pop(f"{mlp}fc1_g.{leaf}"), up])
            else:
                out[f"{mlp}fc1_x.{leaf}"] = up
    return out


def from_timm(tensors: dict[str, np.ndarray], num_heads: int | None = None) -> dict:
    """timm's Eva state dict (NumPy; either qkv and SwiGLU layout) -> an original-layout tree.

    Args:
      tensors: the state dict, e.g. `safetensors_io.read(path)[0]`.
      num_heads: attention heads (the tensors do not tell them); None: width / 64, as in
        every DINOv3 and EVA-02 tower but DINOv3 7B (32 heads).

    Raises:
      CheckpointError: a key that is not timm's Eva layout, or a width the heads do not divide.
    """
    d = np.shape(tensors.get("patch_embed.proj.weight", np.zeros((64,))))[0]
    num_heads = num_heads or max(d // 64, 1)
    if d % num_heads:
        raise CheckpointError(
            f"the file's width {d} is not divisible by {num_heads} heads: pass num_heads=H"
        )
    inverse = {v: k for k, v in _TOP.items()}
    block = {v: k for k, v in _BLOCK.items()} | {"mlp.fc1.weight": f"{_MLP}/Dense_0/kernel"}
    block |= {"mlp.fc1.bias": f"{_MLP}/Dense_0/bias"}
    block |= {f"attn.{n[0]}_bias": f"{_ATT}/{n}/bias" for n in ("query", "value")}
    flat: dict[str, np.ndarray] = {}
    for key, a in tensors.items():
        a = np.asarray(a)
        m = re.fullmatch(r"blocks\.(\d+)\.(.*)", key)
        enc = f"Transformer/encoderblock_{m[1]}/" if m else ""
        if m and m[2] == "attn.qkv.weight":
            flat |= unfuse(enc + _ATT, ("query", "key", "value"), a, num_heads)
        elif m and m[2] in ("mlp.fc1.weight", "mlp.fc1.bias") and packed_mlp(tensors, m[1]):
            flat |= unfuse(enc + _MLP, ("gate", "Dense_0"), a, num_heads)
        elif m and m[2] in ("attn.norm.weight", "attn.norm.bias"):
            flat[enc + block[m[2]]] = a.reshape(num_heads, -1)
        elif m and m[2] in block:
            flat[enc + block[m[2]]] = leaf_from_torch(block[m[2]], a, num_heads)
        elif key in inverse:
            flat[inverse[key]] = leaf_from_torch(inverse[key], a, num_heads)
        else:
            raise CheckpointError(
                f"tensor {key} {a.shape} is not in timm's Eva layout (this package reads "
                "the DINOv3 and EVA-02 towers)"
            )
    return traverse_util.unflatten_dict(flat, sep="/")


def timm_shapes(
    model: VisionTransformer, image_size: tuple[int, int], fused=None, packed=None
) -> dict[str, Shape]:
    """timm's Eva state dict shapes for `model` at `image_size` (its `strict=True` table)."""
    shapes = param_shapes(model.clone(scan=False, remat=False), image_size)
    return to_timm(jax.tree.map(lambda v: Shape(v.shape), shapes), model, fused, packed)


def check(
    tensors: dict[str, np.ndarray], model: VisionTransformer, size: tuple[int, int], source: str
) -> None:
    """Raise naming every tensor of `tensors` that timm's Eva table for `model` (in the
    file's own qkv and SwiGLU layouts) lacks, misses or shapes differently."""
    fused = any(k.endswith("attn.qkv.weight") for k in tensors)
    packed = model.swiglu and any(k.endswith("mlp.fc1.weight") for k in tensors)
    fix = "Is the file a timm DINOv3 or EVA-02 of this size? Pass num_heads=H if not width/64."
    check_table(tensors, timm_shapes(model, size, fused, packed), source, "timm Eva", fix)
