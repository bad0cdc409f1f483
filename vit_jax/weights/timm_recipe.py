"""The Python lines that build timm's own `VisionTransformer` for a model converted to
timm's layout (timm.py), and load the file strictly.

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

from vit_jax.models.vit import VisionTransformer
from vit_jax.weights.errors import CheckpointError
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
    """Python lines that build timm's own `VisionTransformer` for `model` at `image_size`
    and load the converted file at `path` with a strict `load_state_dict`.

    Every argument is spelled out: sizes, mlp_ratio, patch, image size, channels, classes,
    pooling (class token; 'avg', 'map' or none; fc_norm), the towers' registers, LayerScale,
    norm_pre and packed SwiGLU, the GELU ('gelu_tanh', 'quick_gelu' or the exact 'gelu', as
    `model.gelu`), the LayerNorm eps and, for hybrids, the ResNetV2 stem with GroupNorm eps
    1e-6 and the original weight standardisation. Pasted into Python (or exec'd), the lines
    leave `model` in eval mode: float32 [N, C, H, W] in [-1, 1] -> this package's logits.

    Raises:
      CheckpointError: a model timm's VisionTransformer cannot compute (2D or sin-cos
        position embeddings, a representation layer, the Eva towers' deltas).
    """
    _refuse(model)
    h, w = image_size
    args = _arguments(model, image_size)
    lines = [
        "from functools import partial",
        "import safetensors.torch, torch",
        "from timm.models.vision_transformer import VisionTransformer",
    ]
    if model.swiglu:
        lines.append("from timm.layers import SwiGLUPacked")
    if model.resnet_stages is not None:
        lines += _hybrid_stem(model)
        args.append("embed_layer=partial(HybridEmbed, backbone=backbone)")
    lines += _call("model = VisionTransformer", args)
    if "://" in path:  # on a store: its bytes through fsspec (gcsfs, s3fs)
        lines.insert(1, "import fsspec")
        load = f"safetensors.torch.load(fsspec.open({path!r}, 'rb').open().read())"
    else:
        load = f"safetensors.torch.load_file({path!r})"
    lines.append(f"model.load_state_dict({load})  # strict")
    lines.append(f"model.eval()  # takes float32 [N, {model.channels}, {h}, {w}] in [-1, 1]")
    return "\n".join(lines)


def _refuse(model: VisionTransformer) -> None:
    """Raise for what timm's VisionTransformer cannot compute (`recipe`'s errors)."""
    if model.representation_size:
        raise CheckpointError(PRE_LOGITS)
    eva = [
        f"{k}={getattr(model, k)!r}"
        for k in ("rope", "mlp_norm", "attention_norm")
        if getattr(model, k)
    ]
    eva += [f"qkv_bias={model.qkv_bias!r}"] if model.qkv_bias not in ("qkv", "") else []
    if eva:
        raise CheckpointError(
            f"a tower with {', '.join(eva)} is timm's Eva, not its VisionTransformer: use "
            "format='npz' or format='onnx'"
        )
    if model.posemb not in ("learned", "none"):
        raise CheckpointError(
            f"position embeddings {model.posemb!r} have no timm VisionTransformer "
            "equivalent (it learns one [1, N, D] table or has none): use format='npz' or "
            "format='onnx'"
        )


def _arguments(model: VisionTransformer, image_size: tuple[int, int]) -> list[str]:
    """timm's VisionTransformer arguments for `model`, spelled out (`recipe`)."""
    pool = {"token": "'token'", "gap": "'avg'", "map": "'map'", "unpooled": "''"}[model.classifier]
    hidden = model.mlp_dim * (2 if model.swiglu else 1)  # SwiGLUPacked: both halves
    args = [
        f"img_size={tuple(image_size)!r}",
        f"patch_size={model.patch_size}",
        f"in_chans={model.channels}",
        f"embed_dim={model.width}",
        f"depth={model.depth}",
        f"num_heads={model.num_heads}",
        f"mlp_ratio={_mlp_ratio(model.width, hidden)!r}",
        f"num_classes={model.num_classes or 0}",
        f"class_token={model.has_class_token}",
        f"global_pool={pool}",
        f"fc_norm={model.fc_norm}",
    ]
    tower = {  # the towers' arguments, where they differ from timm's defaults
        "reg_tokens": model.registers or None,
        "no_embed_class": True if model.num_prefix and not model.embed_prefix else None,
        "init_values": model.layer_scale,
        "pre_norm": model.pre_norm or None,
        "qkv_bias": False if not model.qkv_bias else None,
    }
    args += [f"{k}={v!r}" for k, v in tower.items() if v is not None]
    if model.posemb == "none":
        args.append("pos_embed='none'")
    act = {"tanh": "'gelu_tanh'", "quick": "'quick_gelu'"}.get(model.gelu, "'gelu'")
    if model.swiglu:  # DINOv2 g's packed SwiGLU, with the block's act_layer SiLU
        act = "'silu'"
        args.append("mlp_layer=SwiGLUPacked")
    eps = _float(model.layer_norm_eps)
    args += [f"act_layer={act}", f"norm_layer=partial(torch.nn.LayerNorm, eps={eps})"]
    return args


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
