"""The Python lines that build timm's own `VisionTransformer` (or `Eva`, for the towers
of its Eva layout) for a model converted to timm's layout (timm.py, timm_eva.py), and
load the file strictly; and the config.json of timm's hub folder (`hub_config`), which
`timm.create_model('local-dir:' + DIR, pretrained=True)` builds and loads strictly.

timm's named models cover the published sizes only and replace a head that is not
1000-class, so `recipe` builds timm's `VisionTransformer` class itself with every
argument the model needs (GELU form, LayerNorm eps, mlp_ratio, image size, pooling, a
hybrid's ResNetV2 stem). A hybrid's recipe subclasses timm's StdConv2dSame, whose
(w - mean) / sqrt(var + eps) differs from the original's (w - mean) / (std + 1e-5) by
~1e-5 in the logits. timm's logits are then this package's to float32 round-off (~1e-6).
"""

from __future__ import annotations

import math
import re
from typing import Any

from vit_jax.data.preprocessing import to_timm_cfg
from vit_jax.models import rope
from vit_jax.models.vit import VisionTransformer
from vit_jax.weights import timm_eva, towers
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import Meta
from vit_jax.weights.timm import PRE_LOGITS


def _mlp_ratio(width: int, mlp_dim: int) -> float:
    """The float timm multiplies by the width: int(width * ratio) must be mlp_dim."""
    ratio = mlp_dim / width
    while int(width * ratio) < mlp_dim:  # 1 ulp up where the product rounds below
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def _float(x: float) -> str:
    """1e-06 -> '1e-6': the float as Python reads it back, exponent without zeros."""
    return re.sub(r"e([-+])0*(\d)", r"e\1\2", repr(float(x)))


def _call(head: str, args: list[str], width: int = 92) -> list[str]:
    """`head(` and its keyword arguments, wrapped at `width`, then `)`."""
    lines, line = [head + "("], "   "
    for a in args:
        if len(line) + len(a) + 2 > width:
            lines.append(line)
            line = "   "
        line += f" {a},"
    return [*lines, line, ")"]


def recipe(model: VisionTransformer, image_size: tuple[int, int], path: str) -> str:
    """Python lines that build timm's own `VisionTransformer` (or, for the towers of timm's
    Eva layout, `eva_fields`, its `Eva`) for `model` at `image_size` and load the converted
    file at `path` with a strict `load_state_dict`.

    Every argument is spelled out (`arguments`): sizes, mlp_ratio, patch, image size,
    channels, classes, pooling (class token; 'avg', 'map' or none; fc_norm), the towers'
    registers, LayerScale, norm_pre, SwiGLU, Eva's q/v biases, MLP and attention norms and
    rotary embeddings, the GELU ('gelu_tanh', 'quick_gelu' or the exact 'gelu', as
    `model.gelu`), the LayerNorm eps and, for hybrids, the ResNetV2 stem with GroupNorm eps
    1e-6 and the original weight standardisation. Pasted into Python (or exec'd), the lines
    leave `model` in eval mode: float32 [N, C, H, W] in [-1, 1] -> this package's logits.

    Raises:
      CheckpointError: a model timm cannot compute (2D or sin-cos position embeddings, a
        representation layer, an Eva tower with a key bias or another GELU).
    """
    h, w = image_size
    cls = "Eva" if eva_fields(model) else "VisionTransformer"
    args = [f"{k}={v!r}" for k, v in arguments(model, image_size).items()]
    lines = [
        "from functools import partial",
        "import safetensors.torch, torch",
        f"from timm.models.{'eva' if cls == 'Eva' else 'vision_transformer'} import {cls}",
    ]
    if model.swiglu and cls != "Eva":  # DINOv2 g's packed SwiGLU
        lines.append("from timm.layers import SwiGLUPacked")
        args.append("mlp_layer=SwiGLUPacked")
    if model.resnet_stages is not None:
        lines += _hybrid_stem(model)
        args.append("embed_layer=partial(HybridEmbed, backbone=backbone)")
    args.append(f"norm_layer=partial(torch.nn.LayerNorm, eps={_float(model.layer_norm_eps)})")
    lines += _call(f"model = {cls}", args)
    if "://" in path:  # on a store: its bytes through fsspec (gcsfs, s3fs)
        lines.insert(1, "import fsspec")
        load = f"safetensors.torch.load(fsspec.open({path!r}, 'rb').open().read())"
    else:
        load = f"safetensors.torch.load_file({path!r})"
    lines.append(f"model.load_state_dict({load})  # strict")
    lines.append(f"model.eval()  # takes float32 [N, {model.channels}, {h}, {w}] in [-1, 1]")
    return "\n".join(lines)


def eva_fields(model: VisionTransformer) -> list[str]:
    """The fields that make `model` a tower of timm's Eva layout (timm_eva.py), not of its
    VisionTransformer: rotary embeddings, the MLP's or attention's LayerNorm, q/v biases."""
    kinds = ("rope", "mlp_norm", "attention_norm")
    eva = [f"{k}={getattr(model, k)!r}" for k in kinds if getattr(model, k)]
    return eva + ([f"qkv_bias={model.qkv_bias!r}"] if model.qkv_bias not in ("qkv", "") else [])


def arguments(model: VisionTransformer, image_size: tuple[int, int]) -> dict[str, Any]:
    """timm's VisionTransformer (or Eva) arguments for `model`, every one spelled out
    (`recipe`; a hub folder's model_args), but the norm_layer and a packed SwiGLU's class.

    Raises:
      CheckpointError: as `recipe`.
    """
    if model.representation_size:
        raise CheckpointError(PRE_LOGITS)
    if model.posemb not in ("learned", "none"):
        raise CheckpointError(
            f"position embeddings {model.posemb!r} have no timm VisionTransformer "
            "equivalent (it learns one [1, N, D] table or has none): use format='npz' or "
            "format='onnx'"
        )
    eva = eva_fields(model)
    pool = {"token": "token", "gap": "avg", "map": "map", "unpooled": ""}[model.classifier]
    hidden = model.mlp_dim * (2 if model.swiglu and not eva else 1)  # SwiGLUPacked: 2 halves
    args = dict(
        img_size=tuple(image_size),
        patch_size=model.patch_size,
        in_chans=model.channels,
        embed_dim=model.width,
        depth=model.depth,
        num_heads=model.num_heads,
        mlp_ratio=_mlp_ratio(model.width, hidden),
        num_classes=model.num_classes or 0,
        class_token=model.has_class_token,
        global_pool=pool,
        init_values=model.layer_scale,
        no_embed_class=bool(model.num_prefix and not model.embed_prefix),
    )
    if eva:
        return args | _eva_arguments(model, eva)
    act = {"tanh": "gelu_tanh", "quick": "quick_gelu"}.get(model.gelu, "gelu")
    return args | dict(
        fc_norm=model.fc_norm,
        reg_tokens=model.registers,
        pre_norm=model.pre_norm,
        qkv_bias=bool(model.qkv_bias),
        pos_embed="learn" if model.posemb == "learned" else "none",
        act_layer="silu" if model.swiglu else act,  # DINOv2 g's SwiGLU: the block's SiLU
    )


def _eva_arguments(model: VisionTransformer, eva: list[str]) -> dict[str, Any]:
    """timm's Eva arguments beyond those it shares with its VisionTransformer."""
    if model.qkv_bias == "qkv" or (model.gelu != "exact" and not model.swiglu):
        what = "key bias" if model.qkv_bias == "qkv" else f"GELU {model.gelu!r}"
        raise CheckpointError(
            f"a tower with {', '.join(eva)} is timm's Eva, which has no {what}: use "
            "format='npz' or format='onnx'"
        )
    fused, packed = timm_eva.timm_layout(model)
    args = dict(
        qkv_bias=bool(model.qkv_bias),
        qkv_fused=fused,
        swiglu_mlp=model.swiglu,
        swiglu_align_to=int(model.swiglu and not packed and not model.mlp_norm),  # SwiGLU apart
        scale_mlp=model.mlp_norm,
        scale_attn_inner=model.attention_norm,
        num_reg_tokens=model.registers,
        use_abs_pos_emb=model.posemb == "learned",
        use_pre_transformer_norm=model.pre_norm,
        use_post_transformer_norm=not model.fc_norm,
        use_fc_norm=model.fc_norm,
        dynamic_img_size=model.posemb == "none",  # DINOv3: RoPE on each image's grid
        use_rot_pos_emb=bool(model.rope),
    )
    if model.rope:
        args |= dict(
            rope_type="dinov3" if model.rope == "dinov3" else "cat",
            rope_temperature=model.rope_base or rope.BASES[model.rope],
            rope_rotate_half=model.rope == "dinov3",
            ref_feat_shape=model.rope_grid,
        )
    return args


# timm architectures whose factories fix what model_args cannot carry (the LayerNorm's
# epsilon, DINOv2 g's SwiGLUPacked), by layout and epsilon; model_args set the rest.
HUB_ARCHITECTURES = {
    ("vit", 1e-6): "vit_base_patch16_224",
    ("vit", 1e-5): "vit_base_patch16_clip_224",
    ("swiglu", 1e-6): "vit_giant_patch14_dinov2",
    ("dinov3", 1e-5): "vit_small_patch16_dinov3",
    ("eva", 1e-6): "eva02_base_patch14_224",
}


def hub_config(model: VisionTransformer, image_size: tuple[int, int], meta: Meta) -> dict:
    """config.json of timm's hub folder for `model`: an architecture of HUB_ARCHITECTURES,
    `model_args` (`arguments`) over every size and field, `pretrained_cfg` with `meta`'s
    preprocessing (`to_timm_cfg`), `label_names`; read back here (`towers.timm_tower`) as
    `model`, which the check ensures.

    Raises:
      CheckpointError: a model no architecture's folder holds (a hybrid's stem, another
        epsilon, fields the architecture's towers.py row reads otherwise), in one line.
    """
    args = arguments(model, image_size)
    kind = model.rope or ("eva" if eva_fields(model) else "swiglu" if model.swiglu else "vit")
    arch = HUB_ARCHITECTURES.get((kind, float(model.layer_norm_eps)))
    if kind == "swiglu":  # the factory's SiLU (model_args carry the GELUs only)
        del args["act_layer"]
    fields = towers.timm_tower(arch, args)[1] if arch else {}
    as_read = model.clone(class_token=model.has_class_token, rope_base=args.get("rope_temperature"))
    as_read = as_read.clone(gelu=fields["gelu"]) if kind == "swiglu" else as_read  # no GELU
    other = {k: v for k, v in fields.items() if getattr(as_read, k) != v}
    if model.resnet_stages is not None or arch is None or other:
        why = f"{arch} reads {other}" if arch else f"{kind} of eps {model.layer_norm_eps}"
        why = "a hybrid's stem" if model.resnet_stages is not None else why
        raise CheckpointError(
            f"timm's hub folder cannot hold this model ({why}): write a "
            ".safetensors file (its recipe builds timm's model) or format='npz'"
        )
    pixels = to_timm_cfg(meta.preprocessing, image_size, model.channels)
    cfg = dict(architecture=arch, num_classes=args["num_classes"], num_features=model.width)
    cfg |= dict(global_pool=args["global_pool"], model_args=args, pretrained_cfg=pixels)
    return cfg | ({"label_names": list(meta.labels)} if meta.labels else {})


def _hybrid_stem(model: VisionTransformer) -> list[str]:
    """The lines that define `backbone`, a hybrid's ResNet stem in timm's layers: its
    ResNetV2 stages (or the root alone) with GroupNorm eps 1e-6, and a StdConv subclass
    with the original weight standardisation."""
    stages = tuple(model.resnet_stages)
    lines = [
        "from timm.layers import GroupNormAct, HybridEmbed, StdConv2dSame",
        "from timm.layers.padding import pad_same",
        f"from timm.models.resnetv2 import {'ResNetV2' if stages else 'create_resnetv2_stem'}",
        "class StdConv(StdConv2dSame):  # the original's standardisation: / (std + 1e-5)",
        "    def forward(self, x):",
        "        w = self.weight - self.weight.mean((1, 2, 3), keepdim=True)",
        "        w = w / (w.std((1, 2, 3), correction=0, keepdim=True) + 1e-5)",
        "        x = pad_same(x, self.kernel_size, self.stride) if self.same_pad else x",
        "        return torch.nn.functional.conv2d(x, w, None, self.stride, self.padding)",
        "",
        "norm = partial(GroupNormAct, num_groups=32, eps=1e-6)",
    ]
    common = ["stem_type='same'", "preact=False", "conv_layer=StdConv", "norm_layer=norm"]
    if stages:
        lines += _call(
            "backbone = ResNetV2",
            [f"layers={stages!r}", f"in_chans={model.channels}", "num_classes=0"]
            + ["global_pool=''", *common],
        )
    else:  # the root alone (conv, norm, pool)
        lines += _call("backbone = create_resnetv2_stem", [str(model.channels), *common])
    return lines
