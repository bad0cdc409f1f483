"""Position embeddings, and resizing them on their grid (pure NumPy/SciPy).

Kinds:
  learned     one table [1, prefix + gh*gw, D], class row included (the paper's default;
              param 'pos_embedding', init normal(0.02)).
  none        no position information.
  learned_2d  a row table [1, gh, D/2] and a column table [1, gw, D/2]; position (i, j)
              gets concat(row[i], col[j]) (the paper's Appendix D.4 "2-D" variant).
              The class token gets none: being learned itself, an offset would add nothing.
  sincos_2d   fixed 2D sin-cos (no parameters), class token none.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage

KINDS = ("learned", "none", "learned_2d", "sincos_2d")


def sincos_2d(grid: tuple[int, int], width: int, temperature: float = 10_000.0) -> np.ndarray:
    """Fixed 2D sin-cos embeddings [gh*gw, D]: a quarter of D each for sin/cos of x and y."""
    if width % 4:
        raise ValueError(f"sincos_2d position embeddings need a width divisible by 4, got {width}")
    gh, gw = grid
    y, x = np.mgrid[:gh, :gw]
    omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))  # [D/4]
    y = y.reshape(-1, 1) * omega  # [N, D/4]
    x = x.reshape(-1, 1) * omega
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


class PositionEmbedding(nn.Module):
    """Adds position embeddings to [B, prefix + gh*gw, D] tokens."""

    kind: str = "learned"
    grid: tuple[int, int] = (14, 14)
    num_prefix: int = 1
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, n, d = x.shape
        gh, gw = self.grid
        if self.kind == "none":
            return x
        if self.kind == "learned":
            self._check_stored("pos_embedding", (1, n, d))
            pe = self.param(
                "pos_embedding", nn.initializers.normal(0.02), (1, n, d), self.param_dtype
            )  # [1, N, D]
            return x + pe.astype(x.dtype)
        if self.kind == "learned_2d":
            if d % 2:
                raise ValueError(f"learned_2d position embeddings need an even width, got {d}")
            self._check_stored("pos_embedding_row", (1, gh, d // 2))
            self._check_stored("pos_embedding_col", (1, gw, d // 2))
            init = nn.initializers.normal(0.02)
            row = self.param("pos_embedding_row", init, (1, gh, d // 2), self.param_dtype)
            col = self.param("pos_embedding_col", init, (1, gw, d // 2), self.param_dtype)
            rows = jnp.broadcast_to(row[0][:, None], (gh, gw, d // 2))  # row i at (i, j)
            cols = jnp.broadcast_to(col[0][None, :], (gh, gw, d // 2))  # column j at (i, j)
            pe = jnp.concatenate([rows, cols], axis=-1).reshape(gh * gw, d)  # [gh*gw, D]
        elif self.kind == "sincos_2d":
            pe = jnp.asarray(sincos_2d(self.grid, d))
        else:
            raise ValueError(f"unknown position embedding {self.kind!r}: use one of {KINDS}")
        pe = jnp.pad(pe, ((self.num_prefix, 0), (0, 0)))  # prefix tokens get none
        return x + pe[None].astype(x.dtype)

    def _check_stored(self, name: str, shape: tuple[int, ...]) -> None:
        """A clear error when loaded position embeddings were made for another grid."""
        if not self.has_variable("params", name):
            return
        stored = self.get_variable("params", name).shape
        if tuple(stored) != shape:
            raise ValueError(
                f"position embeddings {name} have shape {tuple(stored)}, but these images make "
                f"a {self.grid[0]}x{self.grid[1]} grid of patches, which needs {shape}: resize "
                "them with vit_jax.weights.load_pretrained(path, model, image_size) or "
                "resize_posemb(), or feed images of the resolution they were trained at"
            )


def resize_grid(grid: np.ndarray, new_hw: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize [gh, gw, D] -> [gh', gw', D] as the original code does
    (scipy.ndimage.zoom, order=1)."""
    gh, gw, _ = grid.shape
    zoom = (new_hw[0] / gh, new_hw[1] / gw, 1)
    out = scipy.ndimage.zoom(grid, zoom, order=1)
    assert out.shape[:2] == tuple(new_hw), (out.shape, new_hw)
    return out


def resize_posemb(posemb: np.ndarray, new_grid: tuple[int, int], num_prefix: int = 1) -> np.ndarray:
    """Resize learned 1D embeddings [1, prefix + gs*gs, D] to [1, prefix + gh*gw, D].

    The prefix (class) rows are kept as they are; the rest is taken as a square grid
    (as the published checkpoints store them) and interpolated bilinearly.
    """
    prefix, rest = posemb[0, :num_prefix], posemb[0, num_prefix:]
    gs = int(round(np.sqrt(len(rest))))
    if gs * gs != len(rest):
        raise ValueError(
            f"cannot resize position embeddings of {len(rest)} grid rows: not a square grid"
        )
    grid = resize_grid(rest.reshape(gs, gs, -1), new_grid)
    rows = grid.reshape(new_grid[0] * new_grid[1], -1)
    return np.concatenate([prefix, rows], axis=0)[None].astype(posemb.dtype)


def resize_table(table: np.ndarray, n: int) -> np.ndarray:
    """Resize one axis table [1, g, D/2] of learned_2d embeddings to [1, n, D/2]."""
    return scipy.ndimage.zoom(table, (1, n / table.shape[1], 1), order=1).astype(table.dtype)
