"""The towers people fine-tune, by timm architecture name: the `VisionTransformer` fields
their tensors cannot tell (the GELU form and epsilon, pooling, the rotary embeddings), and
the key map that reads and writes each family's state dict.

What the tensors do tell (registers, LayerScale, SwiGLU, the extra LayerNorms, which
projections have a bias) is read from the parameters by `architecture.towers`; a table
row here only names what leaves no trace. The first row whose pattern matches the
architecture wins; `model_args` in a timm hub folder's config.json override the row
(`global_pool`, `act_layer`, ...), as timm's own constructor does.
"""

from __future__ import annotations

import re
from typing import Any

from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import TIMM_DEFAULT  # timm's VisionTransformer defaults

# (pattern on timm's architecture name, its family's key map, the fields it fixes)
# family 'vit': timm's VisionTransformer layout (weights/timm.py); 'eva': timm's Eva
# layout (weights/timm_eva.py).
READ = "vit_* (the paper's, *_dinov2, *_clip_*, *_siglip_*, *_dinov3), deit_*, deit3_*, eva02_*"
TIMM: list[tuple[str, str, dict[str, Any]]] = [
    # --- timm's VisionTransformer family (vit_*, deit3_*, *_dinov2, *_clip_*, *_siglip_*)
    # The tensors tell pooling, registers, LayerScale, DINOv2 g's SwiGLU, norm_pre and
    # fc_norm; a row names the numerics and the class token's missing table row. CLIP's
    # 512-wide head is its projection (timm's conversion gives it a zero bias).
    (r"^vit_.*_clip_quickgelu_", "vit", dict(gelu="quick", layer_norm_eps=1e-5)),
    (r"^vit_.*_clip_", "vit", dict(gelu="exact", layer_norm_eps=1e-5)),
    (  # SigLIP 2's tanh GELU (and two SigLIPs'); the other SigLIPs': the last row
        r"^vit_(base_patch32_siglip_(gap_)?256|large_patch16_siglip_(gap_)?512"
        r"|(so400m|giantopt)_patch16_siglip_)",
        "vit",
        dict(gelu="tanh", layer_norm_eps=1e-6),
    ),
    (r"^vit_.*_reg\d_dinov2|^deit3_", "vit", dict(embed_prefix=False, **TIMM_DEFAULT)),
    (r"^deit_", "vit", TIMM_DEFAULT),
    # --- timm's Eva family (*_dinov3*, eva02_*)
    # DINOv3: no position table, RoPE on each image's own grid; timm's pooling 'avg' (the
    # patches' mean after `norm`; upstream pools the class token: global_pool='token').
    # The 7B (32 heads of 128) is not read.
    (
        r"^vit_(tiny|small|small_plus|base|large|huge_plus)_patch16_dinov3",
        "eva",
        {
            **dict(gelu="exact", layer_norm_eps=1e-5, posemb="none", classifier="gap"),
            **dict(class_token=True, rope="dinov3", rope_base=100.0),
        },
    ),
    # EVA-02: a learned table and RoPE rescaled to the 16x16 grid it was trained on; the
    # CLIP towers pool the class token, the others the patches (then fc_norm). The
    # post-norm eva02_enormous is not read.
    (
        r"^eva02_(base|large)_patch1[46]_clip_",
        "eva",
        {
            **dict(gelu="exact", layer_norm_eps=1e-6, classifier="token", class_token=True),
            **dict(rope="eva", rope_base=10000.0, rope_grid=(16, 16)),
        },
    ),
    (
        r"^eva02_(tiny|small|base|large)_patch14_",
        "eva",
        {
            **dict(gelu="exact", layer_norm_eps=1e-6, classifier="gap", class_token=True),
            **dict(rope="eva", rope_base=10000.0, rope_grid=(16, 16)),
        },
    ),
    # --- the paper's ViT and AugReg: the last row, timm's VisionTransformer defaults
    (r"^vit_(?!pe_|.*_rope)", "vit", TIMM_DEFAULT),  # not timm's RoPE ViTs (Eva's, unread)
]


def timm_tower(architecture: str, model_args: dict[str, Any] | None = None):
    """(family, fields) of a timm architecture name: the key map's family ('vit' or
    'eva') and the VisionTransformer fields its tensors cannot tell.

    Raises:
      CheckpointError: an architecture no row reads, in one line with the ones read.
    """
    for pattern, family, fields in TIMM:
        if re.search(pattern, architecture):
            return family, {**fields, **model_fields(model_args or {})}
    raise CheckpointError(
        f"timm architecture {architecture!r} is not one this package builds: it reads {READ}"
    )


_POOLS = {"token": "token", "avg": "gap", "map": "map"}
_ACTS = {"gelu": "exact", "gelu_tanh": "tanh", "quick_gelu": "quick"}


def model_fields(model_args: dict[str, Any]) -> dict[str, Any]:
    """The VisionTransformer fields of timm `model_args` that change what a tower computes
    beyond its tensors: global_pool, act_layer, class_token, no_embed_class, pos_embed.

    Raises:
      CheckpointError: a pooling or activation the model does not compute.
    """
    a, out = model_args, {}
    for arg, field, known in (("global_pool", "classifier", _POOLS), ("act_layer", "gelu", _ACTS)):
        if arg in a and a[arg] not in known:
            raise CheckpointError(
                f"timm's {arg}={a[arg]!r} is not computed here: it reads {', '.join(known)}"
            )
        if arg in a:
            out[field] = known[a[arg]]
    if "class_token" in a:
        out["class_token"] = bool(a["class_token"])
    if "no_embed_class" in a:
        out["embed_prefix"] = not a["no_embed_class"]
    if a.get("pos_embed", "learn") in ("", "none"):
        out["posemb"] = "none"
    return out
