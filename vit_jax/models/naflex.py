"""NaFlex input: each image at its own shape, as a padded sequence of patches (NaViT's
"Patch n' Pack" with FlexiViT's resizable position embeddings, as big_vision's NaFlex
towers of SigLIP 2 take them).

A batch is a dict of three arrays, N patches a row, real patches first:

  patches  [B, N, P*P*C]  each patch flattened in (row, column, channel) order, as
                          tf.image.extract_patches gives it (the conv kernel reshaped
                          embeds it, so every plain ViT checkpoint runs either way)
  coords   [B, N, 2]      its (row, column) on its own image's gh x gw grid
  valid    [B, N]         False for padding, which comes last

`patchify` makes one from images; `VisionTransformer` takes it wherever it takes an
image array. What padding holds never matters: it is zeroed where it enters.

Position embeddings are resized to each image's grid with big_vision's `_pos_emb_resize`
numerics (jax.image.scale_and_translate, bilinear, antialiased) and read at each patch's
coordinates. The resize is separable, so here it is two small matrices per image (the
resize of an identity) contracted at the coordinates: the same weights, without the
[B, l, l, D] intermediate that limits big_vision's to l = 64 patches a side. Any grid up
to N patches a side is served. The square path keeps the published code's resize
(posemb.resize_grid, scipy's zoom), so the two agree only at the table's own grid.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

KEYS = ("patches", "coords", "valid")


def is_naflex(x: Any) -> bool:
    """Whether `x` is a NaFlex batch (a dict), not an image array."""
    return isinstance(x, dict)


def patchify(images: Any, patch_size: int, seq_len: int | None = None) -> dict[str, np.ndarray]:
    """Images [H, W, C] or [B, H, W, C] (sides multiples of `patch_size`) as a NaFlex batch
    of `seq_len` patches a row (default: the grid's own gh*gw), padded with zeros.

    Raises:
        ValueError: a side that is not a multiple of the patch, or more patches than
            `seq_len`.
    """
    x = np.asarray(images)
    x = x[None] if x.ndim == 3 else x
    b, h, w, c = x.shape
    p = patch_size
    gh, gw = h // p, w // p
    if h % p or w % p or not gh or not gw:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {p} px")
    n = seq_len or gh * gw
    if gh * gw > n:
        raise ValueError(f"a {gh}x{gw} grid has {gh * gw} patches, more than seq_len={n}")
    rows = x.reshape(b, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * gw, -1)
    coords = grid_coords(gh, gw)  # [gh*gw, 2]
    pad = n - gh * gw
    return {
        "patches": np.pad(rows, ((0, 0), (0, pad), (0, 0))).astype(np.float32),
        "coords": np.broadcast_to(np.pad(coords, ((0, pad), (0, 0))), (b, n, 2)).copy(),
        "valid": np.broadcast_to(np.arange(n) < gh * gw, (b, n)).copy(),
    }


def grid_coords(gh: int, gw: int) -> np.ndarray:
    """The (row, column) of each patch of a gh x gw grid, row-major: int32 [gh*gw, 2]."""
    rows, cols = np.mgrid[:gh, :gw]
    return np.stack([rows.ravel(), cols.ravel()], axis=-1).astype(np.int32)


def grids(x: dict[str, Any]) -> Any:
    """Each image's (gh, gw), from its valid patches' coordinates.  # [B, 2]"""
    xp = jnp if isinstance(x["coords"], jax.Array) else np
    coords = xp.where(xp.asarray(x["valid"])[..., None], xp.asarray(x["coords"]), -1)
    return coords.max(axis=1) + 1


def check(x: dict[str, Any], patch_dim: int) -> None:
    """Errors that name the bad input of a NaFlex batch, on the host (values are read only
    where they are concrete: under jit the caller checks before the step).

    Raises:
        ValueError: a key missing, shapes that disagree, a patch of another size,
            padding before a real patch, a coordinate off the sequence's grid.
    """
    if set(x) != set(KEYS):
        raise ValueError(f"a NaFlex batch has the keys {KEYS}, got {sorted(x)}")
    shapes = {k: tuple(np.shape(x[k])) for k in KEYS}
    p, c, v = shapes["patches"], shapes["coords"], shapes["valid"]
    if len(p) != 3 or c != (*p[:2], 2) or v != p[:2]:
        raise ValueError(
            f"NaFlex shapes {shapes}: expected patches [B, N, P*P*C], coords [B, N, 2], "
            "valid [B, N] (add a batch axis for a single image)"
        )
    if p[2] != patch_dim:
        side = math.isqrt(p[2] // 3) if p[2] % 3 == 0 else None
        raise ValueError(
            f"patches of {p[2]} values, the model embeds {patch_dim} (P*P*C): "
            f"patchify with the model's patch size{f', not {side}' if side else ''}"
        )
    if any(isinstance(x[k], jax.core.Tracer) for k in KEYS):
        return
    valid, coords = np.asarray(x["valid"], bool), np.asarray(x["coords"])
    if (valid[:, 1:] & ~valid[:, :-1]).any():
        row = int(np.argmax((valid[:, 1:] & ~valid[:, :-1]).any(axis=1)))
        raise ValueError(f"NaFlex row {row}: padding (valid False) must come after every patch")
    n, far = p[1], coords[valid]
    if far.size and (far.min() < 0 or far.max() >= n):
        raise ValueError(
            f"NaFlex coordinates from {far.min()} to {far.max()}: a grid of N={n} patches "
            f"reaches rows and columns 0 to {n - 1} at most (coords are (row, column) on "
            "each image's own patch grid, not pixels)"
        )


def resize_weights(size: jax.Array, n: int, length: int) -> jax.Array:
    """The matrix [length, n] that resizes an axis of n table rows to `size` (traced; rows
    from `size` on are zero) as jax.image.scale_and_translate does (bilinear, antialiased):
    its resize of the identity, exactly its weights."""
    eye = jnp.eye(n, dtype=jnp.float32)
    scale = jnp.reshape(size / n, (1,)).astype(jnp.float32)
    return jax.image.scale_and_translate(
        eye, (length, n), (0,), scale, jnp.zeros((1,)), method="bilinear", antialias=True
    )


def table_at(table: jax.Array, shapes: jax.Array, coords: jax.Array) -> jax.Array:
    """A position table [gh0, gw0, D] resized to each image's grid and read at each patch.

    Args:
      table: the stored grid of embeddings.  # [gh0, gw0, D]
      shapes: each image's (gh, gw).  # [B, 2]
      coords: each patch's (row, column).  # [B, N, 2]

    Returns:
      the embedding of every patch.  # [B, N, D]
    """
    length = coords.shape[1]  # no side of a grid of N patches is longer
    rows = jax.vmap(lambda s: resize_weights(s, table.shape[0], length))(shapes[:, 0])
    cols = jax.vmap(lambda s: resize_weights(s, table.shape[1], length))(shapes[:, 1])
    at_rows = jnp.take_along_axis(rows, coords[..., :1], axis=1, mode="clip")  # [B, N, gh0]
    at_cols = jnp.take_along_axis(cols, coords[..., 1:], axis=1, mode="clip")  # [B, N, gw0]
    weights = (at_rows[..., :, None] * at_cols[..., None, :]).reshape(*coords.shape[:2], -1)
    flat = table.reshape(-1, table.shape[-1]).astype(jnp.float32)  # [gh0*gw0, D]
    return jnp.einsum("bnk,kd->bnd", weights, flat, precision="highest")


def axis_at(table: jax.Array, sizes: jax.Array, index: jax.Array) -> jax.Array:
    """One axis table [g0, D'] (learned_2d) resized to each image's `sizes` [B] and read at
    `index` [B, N]: [B, N, D']."""
    length = index.shape[1]
    w = jax.vmap(lambda s: resize_weights(s, table.shape[0], length))(sizes)  # [B, N, g0]
    at = jnp.take_along_axis(w, index[..., None], axis=1, mode="clip")  # [B, N, g0]
    return jnp.einsum("bng,gd->bnd", at, table.astype(jnp.float32), precision="highest")
