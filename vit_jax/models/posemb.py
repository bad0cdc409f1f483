"""Position embeddings, and resizing them on their grid (pure NumPy/SciPy).

Kinds:
  learned     one table [1, prefix + gh*gw, D], class row included (the paper's default;
              param 'pos_embedding', init normal(0.02)).
  none        no position information.
  learned_2d  a row table [1, gh, D/2] and a column table [1, gw, D/2]; position (i, j)
              gets concat(row[i], col[j]) (the paper's Appendix D.4 "2-D" variant).
              The class token gets none: being learned itself, an offset would add nothing.
  sincos_2d   fixed 2D sin-cos (no parameters), class token none.

With NaFlex input (models/naflex.py) each image's grid is its own: `learned` tables (a
square grid; the class row kept as it is) and `learned_2d` axes are resized to it and read
at each patch's coordinates, `sincos_2d` is computed at them.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage

from vit_jax.models import naflex

KINDS = ("learned", "none", "learned_2d", "sincos_2d")


def sincos_2d(grid: tuple[int, int], width: int, temperature: float = 10_000.0) -> np.ndarray:
    """Fixed 2D sin-cos embeddings [gh*gw, D]: a quarter of D each for sin/cos of x and y."""
    y, x = np.mgrid[: grid[0], : grid[1]]
    return sincos_at(y.ravel(), x.ravel(), width, temperature, np).astype(np.float32)


def sincos_at(y: Any, x: Any, width: int, temperature: float = 10_000.0, xp: Any = jnp) -> Any:
    """sincos_2d at positions (y, x) of any shape [...]: [..., D]."""
    if width % 4:
        raise ValueError(f"sincos_2d position embeddings need a width divisible by 4, got {width}")
    omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))  # [D/4]
    omega = omega.astype(np.float32) if xp is jnp else omega  # NumPy's in float64
    y, x = y[..., None] * omega, x[..., None] * omega
    return xp.concatenate([xp.sin(x), xp.cos(x), xp.sin(y), xp.cos(y)], axis=-1)


class PositionEmbedding(nn.Module):
    """Adds position embeddings to [B, prefix + gh*gw, D] tokens."""

    kind: str = "learned"
    grid: tuple[int, int] = (14, 14)
    num_prefix: int = 1
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, coords=None, shapes=None) -> jax.Array:
        """x [B, prefix + N, D]; NaFlex: each patch's coords [B, N, 2] and each image's
        grid `shapes` [B, 2], else the N = gh*gw patches of `grid`, row-major."""
        b, n, d = x.shape
        if self.kind == "none":
            return x
        if self.kind == "learned":
            gh, gw = self.grid  # NaFlex: a fresh table's grid, the square of N
            shape = (1, self.num_prefix + gh * gw, d)
            pe = self._table("pos_embedding", shape, coords is None)  # [1, prefix + gh*gw, D]
            if coords is None:
                return x + pe.astype(x.dtype)
            prefix, rows = pe[0, : self.num_prefix], pe[0, self.num_prefix :]
            side = math.isqrt(rows.shape[0])
            if side * side != rows.shape[0]:
                raise ValueError(
                    f"NaFlex input reads a square grid of position embeddings; this table holds "
                    f"{rows.shape[0]} patch rows: resize it to a square grid first"
                )
            at = naflex.table_at(rows.reshape(side, side, d), shapes, coords)  # [B, N, D]
            pe = jnp.concatenate([jnp.broadcast_to(prefix, (b, *prefix.shape)), at], axis=1)
            return x + pe.astype(x.dtype)
        gh, gw = self.grid
        if self.kind == "learned_2d":
            if d % 2:
                raise ValueError(f"learned_2d position embeddings need an even width, got {d}")
            row = self._table("pos_embedding_row", (1, gh, d // 2), coords is None)[0]
            col = self._table("pos_embedding_col", (1, gw, d // 2), coords is None)[0]
            if coords is not None:  # [B, N, D/2] each
                rows = naflex.axis_at(row, shapes[:, 0], coords[..., 0])
                pe = jnp.concatenate([rows, naflex.axis_at(col, shapes[:, 1], coords[..., 1])], -1)
            else:
                rows = jnp.broadcast_to(row[:, None], (gh, gw, d // 2))  # row i at (i, j)
                cols = jnp.broadcast_to(col[None, :], (gh, gw, d // 2))  # column j at (i, j)
                pe = jnp.concatenate([rows, cols], axis=-1).reshape(1, gh * gw, d)
        elif self.kind == "sincos_2d":
            if coords is not None:
                pe = sincos_at(
                    coords[..., 0].astype(jnp.float32), coords[..., 1].astype(jnp.float32), d
                )
            else:
                pe = jnp.asarray(sincos_2d(self.grid, d))[None]  # [1, gh*gw, D]
        else:
            raise ValueError(f"unknown position embedding {self.kind!r}: use one of {KINDS}")
        pe = jnp.pad(pe, ((0, 0), (self.num_prefix, 0), (0, 0)))  # prefix tokens get none
        return x + pe.astype(x.dtype)

    def _table(self, name: str, shape: tuple[int, ...], square: bool) -> jax.Array:
        """The learned table `name`: of `shape` on the image path, where a stored table
        made for another grid is an error; as stored with NaFlex input (resized per image)."""
        if square:
            self._check_stored(name, shape)
        elif self.has_variable("params", name):
            shape = tuple(self.get_variable("params", name).shape)
        return self.param(name, nn.initializers.normal(0.02), shape, self.param_dtype)

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
