"""The one size table: every ViT and hybrid of the paper, by its published name.

A variant is a size (width, depth, heads, MLP width) plus a patch size and, for
hybrids, the ResNet stem's stages. Published checkpoint names (``ViT-B_16``,
``R50+ViT-B_16``) and short names (``B/16``, ``R50+B/16``) both resolve here (the
towers' sizes by short name: big_vision's 'So400m/14' and 'g-opt/14', DINOv2's 'g/14',
DINOv3's 'H+/16');
any other combination is a short name plus keyword overrides, e.g.
``get_model('B/16', num_classes=10, depth=6, patch_size=8)``.
"""

from __future__ import annotations

import re
from typing import Any

# size: (width D, depth L, heads, MLP width)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "testing": (32, 2, 2, 64),
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
    "So400m": (1152, 27, 16, 4304),  # SigLIP's shape-optimised (big_vision's names)
    "g-opt": (1536, 40, 16, 6144),
    # DINOv2's ViT-g (not big_vision's g, 1408 wide) and DINOv3's ViT-H+: SwiGLU MLPs,
    # whose MLP width is each half's.
    "g": (1536, 40, 24, 4096),
    "H+": (1280, 32, 20, 5120),
}
SWIGLU = ("g", "H+")

# ResNet stems of the hybrids: stage depths (empty = the root alone). R50+ViT-B_16 keeps
# three stages (16 px per token); R50x4 is the full four-stage ResNet-50 (32 px per token).
RESNETS = {"R": (), "R26": (2, 2, 2, 2), "R50": (3, 4, 9), "R50x4": (3, 4, 6, 3)}

# published name: (size, patch size on the input or the stem's feature map, stem, extra options)
VARIANTS: dict[str, tuple[str, int, str | None, dict[str, Any]]] = {
    "testing": ("testing", 16, None, {}),
    "ViT-Ti_16": ("Ti", 16, None, {}),
    "ViT-S_16": ("S", 16, None, {}),
    "ViT-S_32": ("S", 32, None, {}),
    "ViT-B_8": ("B", 8, None, {}),
    "ViT-B_16": ("B", 16, None, {}),
    "ViT-B_32": ("B", 32, None, {}),
    "ViT-L_16": ("L", 16, None, {}),
    "ViT-L_32": ("L", 32, None, {}),
    "ViT-H_14": ("H", 14, None, {}),
    # The root alone downsamples 4x, and 8x8 patches on its map make 32 px per token
    # (the published name says 16 all the same).
    "R+ViT-Ti_16": ("Ti", 8, "R", {}),
    "R26+ViT-S_32": ("S", 1, "R26", {}),
    "R26+ViT-B_32": ("B", 1, "R26", {}),
    "R50+ViT-B_16": ("B", 1, "R50", {}),
    "R50+ViT-L_32": ("L", 1, "R50x4", {}),
    # Pool by averaging the tokens; no class token.
    "ViT-S_16-gap-norep": ("S", 16, None, {"classifier": "gap"}),
    "ViT-B_16-gap-norep": ("B", 16, None, {"classifier": "gap"}),
    "ViT-S_32-gap-norep": ("S", 32, None, {"classifier": "gap"}),
    "ViT-B_32-gap-norep": ("B", 32, None, {"classifier": "gap"}),
}

_SHORT = re.compile(r"^(?:(?P<stem>R\d*)\+)?(?P<size>[A-Za-z][\w+-]*)/(?P<patch>\d+)$")


def variant_config(name: str) -> dict[str, Any]:
    """Model fields for a published name (``ViT-B_16``) or a short one (``R50+B/16``).

    Short names give the patch size in pixels of the input; for hybrids that is the
    stem's downsampling (4x per root, 2x per later stage) times the patch size on
    the stem's map, e.g. ``R50+B/16`` is three stages and 1x1 patches.
    """
    if name in VARIANTS:
        size, patch, stem, extra = VARIANTS[name]
    else:
        m = _SHORT.match(name)
        if not m or m["size"] not in SIZES:
            raise ValueError(
                f"unknown model {name!r}: use a published name ({', '.join(VARIANTS)}) "
                f"or SIZE/PATCH with SIZE in {sorted(SIZES)}, optionally R26+ or R50+ first "
                "(e.g. 'B/16', 'R50+B/16')"
            )
        size, patch, stem = m["size"], int(m["patch"]), m["stem"]
        extra = {"swiglu": True} if size in SWIGLU else {}
        if stem is not None:
            patch, stem = _hybrid_patch(name, stem, patch)
    width, depth, heads, mlp = SIZES[size]
    cfg = dict(width=width, depth=depth, num_heads=heads, mlp_dim=mlp, patch_size=patch)
    return {**cfg, "resnet_stages": None if stem is None else RESNETS[stem], **extra}


def _hybrid_patch(name: str, stem: str, pixels: int) -> tuple[int, str]:
    """Patch size on the stem's map for a short hybrid name: R50+B/16 -> (1, 'R50')."""
    stem = "R50x4" if stem == "R50" and pixels == 32 else stem
    if stem not in RESNETS:
        raise ValueError(f"unknown ResNet stem {stem!r} in {name!r}: use one of {sorted(RESNETS)}")
    down = 4 * 2 ** max(len(RESNETS[stem]) - 1, 0)
    if pixels % down:
        raise ValueError(
            f"{name!r}: the {stem} stem downsamples {down}x, so the patch size in pixels "
            f"must be a multiple of {down}, got {pixels}"
        )
    return pixels // down, stem
