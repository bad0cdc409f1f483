"""The one token structure every layer after the patch embedding reads: the tokens, where
each sits on its image's patch grid, and which are real. Images and NaFlex patches
(models/naflex.py) become the same thing here; an image is the case where every token is
real and every image fills one grid, row-major (`full`), which the position embeddings
read as the published code did (one table added, a NumPy sin-cos table).

Prefix tokens (the class token; registers next) lead the sequence, real; their coordinates
are (0, 0) and mean nothing: every position kind skips the first `prefix` tokens (`learned`
stores a row of its own for them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vit_jax.models import naflex
from vit_jax.models.attention import Mask


@struct.dataclass
class Tokens:
    """Tokens with their coordinates; a pytree, so it passes through scan and remat.

    Attributes:
      x: the tokens, `prefix` of them first.  # [B, S, D]
      coords: each token's (row, column) on its image's patch grid, int32.  # [B, S, 2]
      grids: each image's (gh, gw), int32.  # [B, 2]
      mask: which tokens are real (attention.Mask); None: every one.
      prefix: leading tokens without a grid position (static).
      full: (gh, gw) when every image fills this grid, row-major, without padding: the
        image path (static); None for NaFlex patches.
    """

    x: jax.Array
    coords: jax.Array
    grids: jax.Array
    mask: Mask | None = None
    prefix: int = struct.field(pytree_node=False, default=0)
    full: tuple[int, int] | None = struct.field(pytree_node=False, default=None)

    @classmethod
    def of_image(cls, x: jax.Array) -> Tokens:
        """An image's patch embeddings [B, gh, gw, D]: every token real, the grid full."""
        b, gh, gw, d = x.shape
        return cls(
            x.reshape(b, gh * gw, d),  # [B, N, D]
            jnp.broadcast_to(naflex.grid_coords(gh, gw), (b, gh * gw, 2)),
            jnp.broadcast_to(np.array([gh, gw], np.int32), (b, 2)),
            full=(gh, gw),
        )

    @classmethod
    def of_patches(cls, x: jax.Array, coords: jax.Array, valid: jax.Array) -> Tokens:
        """NaFlex patch embeddings [B, N, D] at `coords` [B, N, 2], `valid` [B, N] real
        (padding zeroed by the caller); each image's grid read from its coordinates."""
        grids = jnp.maximum(naflex.grids({"coords": coords, "valid": valid}), 1)  # [B, 2]
        return cls(x, coords, grids, Mask.of(valid))

    def with_prefix(self, t: jax.Array) -> Tokens:
        """`t` [B, k, D] put before the tokens: real, at (0, 0)."""
        k = t.shape[1]
        mask = self.mask
        if mask is not None:  # prefix tokens are real and lead: padding stays last
            valid = jnp.pad(mask.valid, ((0, 0), (k, 0)), constant_values=True)
            mask = Mask(valid, mask.padding_last)
        return self.replace(
            x=jnp.concatenate([t.astype(self.x.dtype), self.x], axis=1),  # [B, k+S, D]
            coords=jnp.pad(self.coords, ((0, 0), (k, 0), (0, 0))),
            mask=mask,
            prefix=self.prefix + k,
        )
