"""2D rotary position embeddings (RoPE) on the queries and keys of the patches, in the two
forms the towers were trained with; prefix tokens (class, registers) are left unrotated.

Each head takes hd/2 angles, hd/4 of the patch's row then hd/4 of its column, at hd/4
frequencies, and turns hd/2 pairs of its features [hd] by them:

  dinov3  DINOv3 (Siméoni et al. 2025; timm `rope_type='dinov3'`, transformers
          `DINOv3ViTRopePositionEmbedding`): patch centres normalised to [-1, 1] on each
          image's own grid, angle 2π·c / base^(4k/hd) (base 100); feature i turns with
          i + hd/2 by angle i ("rotate half": the row turns quarters 1 and 3).
  eva     EVA-02 (Fang et al. 2023; timm `rope_type='cat'`): integer positions rescaled
          to a reference grid (`ref_feat_shape`, 16x16), angle c / base^(4k/hd) (base
          10000); features 2j and 2j + 1 turn by angle j (interleaved: the row turns the
          first half).

Angles come from each token's coordinates and its image's grid (models/tokens.py), so
NaFlex patches at any shape are rotated as the image they belong to.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from vit_jax.models.tokens import Tokens

KINDS = ("dinov3", "eva")
BASES = {"dinov3": 100.0, "eva": 10_000.0}


def angles(t: Tokens, kind: str, head_dim: int, base: float | None, ref=None) -> jax.Array:
    """Each patch's rotation angles, rows then columns: [B, N, hd/2] (N: the patches)."""
    if kind not in KINDS:
        raise ValueError(f"unknown rope {kind!r}: use one of {KINDS}")
    if head_dim % 4:
        raise ValueError(f"2D rotary embeddings need a head width divisible by 4, got {head_dim}")
    n, base = head_dim // 4, base or BASES[kind]
    c = t.coords[:, t.prefix :].astype(jnp.float32)  # [B, N, 2] (row, column)
    g = t.grids[:, None, :].astype(jnp.float32)  # [B, 1, 2]
    k = jnp.arange(n, dtype=jnp.float32)
    if kind == "dinov3":
        c = 2.0 * ((c + 0.5) / g) - 1.0  # centres in [-1, 1]
        freqs = 2 * math.pi / base ** (4 * k / head_dim)  # 2π / period
    else:
        c = c if ref is None else c / g * jnp.asarray(ref, jnp.float32)
        freqs = 1.0 / base ** (k / n)
    return (c[..., None] * freqs).reshape(*c.shape[:2], 2 * n)  # [B, N, hd/2]


def rotate(x: jax.Array, theta: jax.Array, kind: str, prefix: int) -> jax.Array:
    """Queries or keys [B, S, H, hd] turned by `theta` [B, S - prefix, hd/2] after the first
    `prefix` tokens, in float32, back in x's dtype."""
    head, rest = x[:, :prefix], x[:, prefix:].astype(jnp.float32)
    if kind == "dinov3":  # [a, a]: feature i and i + hd/2 turn together
        sin, cos = (jnp.concatenate([f(theta)] * 2, -1)[:, :, None] for f in (jnp.sin, jnp.cos))
        a, b = jnp.split(rest, 2, axis=-1)
        turned = rest * cos + jnp.concatenate([-b, a], -1) * sin
    else:  # [a0, a0, a1, a1, ...]: features 2k and 2k + 1 turn together
        sin, cos = (jnp.repeat(f(theta), 2, -1)[:, :, None] for f in (jnp.sin, jnp.cos))
        pairs = rest.reshape(*rest.shape[:-1], -1, 2)
        turned_pairs = jnp.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(rest.shape)
        turned = rest * cos + turned_pairs * sin
    return jnp.concatenate([head, turned.astype(x.dtype)], axis=1)
