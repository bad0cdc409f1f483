"""Position embeddings, and resizing them on their grid (pure NumPy/SciPy).

Kinds:
  learned     one table [1, prefix + gh*gw, D], class row included (the paper's default;
              param 'pos_embedding', init normal(0.02)).
  none        no position information.
  learned_2d  a row table [1, gh, D/2] and a column table [1, gw, D/2]; position (i, j)
              gets concat(row[i], col[j]) (the paper's Appendix D.4 "2-D" variant).
              The class token gets none: being learned itself, an offset would add nothing.
  sincos_2d   fixed 2D sin-cos (no parameters), class token none.

Each kind is one function of the tokens' coordinates (models/tokens.py). Where every image
fills the tables' grid (the image path) a table is added as stored; otherwise (NaFlex, each
image at its own grid) `learned` tables (the class row kept as it is) and `learned_2d`
axes are resized to each image's grid and read at each patch, `sincos_2d` is computed at
the coordinates.
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
from vit_jax.models.tokens import Tokens

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


def learned(table: jax.Array, t: Tokens, grid: tuple[int, int], k: int) -> jax.Array:
    """The `learned` table [1, k + gh*gw, D] (k prefix rows) at the tokens: as stored on
    its own full grid (the paper's); else its grid resized to each image's and read at
    each patch."""
    if t.full == grid:
        return table  # [1, k + N, D]
    prefix, rows = table[0, :k], table[0, k:]
    rows = rows.reshape(*grid, rows.shape[-1])  # [gh, gw, D]
    at = naflex.table_at(rows, t.grids, t.coords[:, t.prefix :])  # [B, N, D]
    return jnp.concatenate([jnp.broadcast_to(prefix, (at.shape[0], *prefix.shape)), at], 1)


def learned_2d(row: jax.Array, col: jax.Array, t: Tokens) -> jax.Array:
    """concat(row[i], col[j]) at (i, j) from axis tables [gh, D/2], [gw, D/2]; each resized
    to each image's grid unless every image fills the tables' own.  # [B or 1, N, D]"""
    if t.full == (row.shape[0], col.shape[0]):
        gh, gw, half = *t.full, row.shape[-1]
        rows = jnp.broadcast_to(row[:, None], (gh, gw, half))  # row i at (i, j)
        cols = jnp.broadcast_to(col[None, :], (gh, gw, half))  # column j at (i, j)
        return jnp.concatenate([rows, cols], axis=-1).reshape(1, gh * gw, 2 * half)
    coords = t.coords[:, t.prefix :]
    rows = naflex.axis_at(row, t.grids[:, 0], coords[..., 0])  # [B, N, D/2]
    return jnp.concatenate([rows, naflex.axis_at(col, t.grids[:, 1], coords[..., 1])], -1)


def sincos(t: Tokens, width: int) -> jax.Array:
    """sincos_2d at the patches: the NumPy table on a full grid, else at the coordinates."""
    if t.full is not None:
        return jnp.asarray(sincos_2d(t.full, width))[None]  # [1, N, D]
    at = t.coords[:, t.prefix :].astype(jnp.float32)
    return sincos_at(at[..., 0], at[..., 1], width)  # [B, N, D]


class PositionEmbedding(nn.Module):
    """Adds position embeddings to tokens (models/tokens.py), one function per kind above.

    `grid` is the stored tables' (the model's `posemb_grid`), fixed by the model and never
    by a batch; None: the images' own grid, as the paper makes a table per resolution
    (NaFlex input then reads a stored square table, or asks for posemb_grid)."""

    kind: str = "learned"
    grid: tuple[int, int] | None = None
    param_dtype: Any = jnp.float32
    embed_prefix: bool = True  # the prefix tokens have rows in a `learned` table (timm's
    # no_embed_class is False)

    @nn.compact
    def __call__(self, t: Tokens) -> jax.Array:  # t.x [B, S, D] -> [B, S, D]
        d = t.x.shape[-1]
        if self.kind == "none":
            return t.x
        if self.kind == "sincos_2d":
            pe = sincos(t, d)
        elif self.kind == "learned":
            k = t.prefix if self.embed_prefix else 0
            grid = self._grid(t, "pos_embedding", k)
            table = self._table("pos_embedding", (1, k + grid[0] * grid[1], d), t)
            pe = jnp.pad(learned(table, t, grid, k), ((0, 0), (t.prefix - k, 0), (0, 0)))
            return t.x + pe.astype(t.x.dtype)
        elif self.kind == "learned_2d":
            if d % 2:
                raise ValueError(f"learned_2d position embeddings need an even width, got {d}")
            gh, gw = self._grid(t, "pos_embedding_row", None)
            row = self._table("pos_embedding_row", (1, gh, d // 2), t)[0]
            col = self._table("pos_embedding_col", (1, gw, d // 2), t)[0]
            pe = learned_2d(row, col, t)
        else:
            raise ValueError(f"unknown position embedding {self.kind!r}: use one of {KINDS}")
        pe = jnp.pad(pe, ((0, 0), (t.prefix, 0), (0, 0)))  # prefix tokens get none
        return t.x + pe.astype(t.x.dtype)

    def _grid(self, t: Tokens, name: str, prefix: int | None) -> tuple[int, int]:
        """The tables' grid: the model's, which images must fill (the image path reads the
        table as stored); without one the images' own, or (a NaFlex batch on a model built
        without posemb_grid) the stored table's, which must then be square."""
        if t.full is not None and self.grid and tuple(self.grid) != t.full:
            raise ValueError(
                f"these images make a {t.full[0]}x{t.full[1]} grid of patches; the model's "
                f"position tables are {self.grid[0]}x{self.grid[1]} (posemb_grid): load it at "
                "this size (vit_jax.weights.load_model(path, image_size=...)), or feed "
                "images of the size it was built for"
            )
        grid = self.grid or t.full
        if grid is not None:
            return tuple(grid)
        if not self.has_variable("params", name):
            raise ValueError(
                "NaFlex input on a model without posemb_grid: the position table's grid is "
                "the model's, not the batch's; build it with get_model(..., posemb_grid=(gh, "
                "gw)), or initialise it on images"
            )
        table = self.get_variable("params", name)
        if prefix is None:  # learned_2d: the two axis tables
            return table.shape[1], self.get_variable("params", "pos_embedding_col").shape[1]
        rows = table.shape[1] - prefix
        side = math.isqrt(rows)
        if side * side != rows:
            grids = [(h, rows // h) for h in range(1, rows + 1) if rows % h == 0]
            raise ValueError(
                f"NaFlex input on a model without posemb_grid reads a square table; this one "
                f"holds {rows} patch rows: build the model with posemb_grid set to its grid, "
                f"one of {grids} (weights.load_model sets it from the file)"
            )
        return side, side

    def _table(self, name: str, shape: tuple[int, ...], t: Tokens) -> jax.Array:
        """The learned table `name` of `shape`; a clear error when a stored one is another
        shape (made for another grid than these images make)."""
        if self.has_variable("params", name):
            stored = tuple(self.get_variable("params", name).shape)
            if stored != shape:
                if t.full is None:  # NaFlex: the table was made for another posemb_grid
                    raise ValueError(
                        f"position embeddings {name} have shape {stored}, but the model's "
                        f"posemb_grid {tuple(self.grid)} needs {shape}: build the model with "
                        "the grid the table was made on (weights.load_model sets it)"
                    )
                raise ValueError(
                    f"position embeddings {name} have shape {stored}, but these images make "
                    f"a {t.full[0]}x{t.full[1]} grid of patches, which needs {shape}: resize "
                    "them with vit_jax.weights.load_pretrained(path, model, image_size) or "
                    "resize_posemb(), or feed images of the resolution they were trained at"
                )
        return self.param(name, nn.initializers.normal(0.02), shape, self.param_dtype)


def resize_grid(grid: np.ndarray, new_hw: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize [gh, gw, D] -> [gh', gw', D] as the original code does
    (scipy.ndimage.zoom, order=1)."""
    gh, gw, _ = grid.shape
    out = scipy.ndimage.zoom(grid, (new_hw[0] / gh, new_hw[1] / gw, 1), order=1)
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


RESIZES = ("bilinear", "bicubic", "bicubic_aa")  # the paper's, and PyTorch's two bicubics


def torch_weights(n_in: int, n_out: int, antialias: bool) -> np.ndarray:
    """The [n_out, n_in] weights of PyTorch's bicubic `F.interpolate` along one axis
    (align_corners=False): Keys' cubic with a = -0.75, edges clamped; with `antialias`,
    PIL's filter (a = -0.5), widened by the scale when shrinking."""
    scale, w = n_in / n_out, np.zeros((n_out, n_in))

    def cubic(x: np.ndarray, a: float) -> np.ndarray:
        x = np.abs(x)
        near, far = ((a + 2) * x - (a + 3)) * x * x + 1, (((x - 5) * x + 8) * x - 4) * a
        return np.where(x < 1, near, np.where(x < 2, far, 0.0))

    for i in range(n_out):
        if antialias:  # ATen's _upsample_bicubic2d_aa
            support, inv = 2 * max(scale, 1.0), 1 / max(scale, 1.0)
            centre = scale * (i + 0.5)
            lo = max(int(centre - support + 0.5), 0)
            js = np.arange(lo, min(int(centre + support + 0.5), n_in))
            f = cubic((js - centre + 0.5) * inv, -0.5)
            np.add.at(w[i], js, f / f.sum())
        else:  # ATen's upsample_bicubic2d
            real = scale * (i + 0.5) - 0.5
            j, t = int(np.floor(real)), real - np.floor(real)
            f = cubic(np.array([t + 1, t, 1 - t, 2 - t]), -0.75)
            np.add.at(w[i], np.clip(np.arange(j - 1, j + 3), 0, n_in - 1), f)
    return w


def resize_torch(grid: np.ndarray, new_hw: tuple[int, int], antialias: bool) -> np.ndarray:
    """[gh, gw, D] -> [gh', gw', D] as PyTorch's bicubic interpolation does (timm's
    resample_abs_pos_embed: antialias; transformers' Dinov2: none)."""
    rows = torch_weights(grid.shape[0], new_hw[0], antialias)
    cols = torch_weights(grid.shape[1], new_hw[1], antialias)
    return np.einsum("ah,hwd,bw->abd", rows, grid.astype(np.float64), cols).astype(grid.dtype)
