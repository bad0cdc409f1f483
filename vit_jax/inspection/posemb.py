"""Similarity of position embeddings (the paper's Figure 7, centre).

For every patch position (i, j) on the gh x gw grid, the cosine similarity of its
embedding with the embeddings of all positions, as a small gh x gw map. Learned
embeddings of a trained ViT show the 2D structure of the image: close patches have
similar embeddings, and often row and column structure appears. The class token's
row is excluded. Works for learned, learned_2d and sincos_2d embeddings; models with
posemb='none' have nothing to show.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vit_jax.models.posemb import sincos_2d
from vit_jax.weights import architecture


class NoPositionEmbeddings(ValueError):
    """The model has no position embeddings (posemb='none')."""


def patch_embeddings(params: dict[str, Any], model: Any, grid: tuple[int, int]) -> np.ndarray:
    """The position embeddings of the patch tokens, row-major, class row excluded.

    Args:
      params: the model's parameters (at the resolution of `grid`).
      model: the VisionTransformer (its posemb kind, class token, width).
      grid: (gh, gw) of the images the parameters were adapted to.

    Returns:
      embeddings.  # [gh*gw, D]
    """
    gh, gw = grid
    if model.posemb == "none":
        raise NoPositionEmbeddings("the model has no position embeddings (posemb='none')")
    if model.posemb == "sincos_2d":
        return sincos_2d(grid, model.width)
    stored = params["Transformer"]["posembed_input"]
    if model.posemb == "learned_2d":
        row = np.asarray(stored["pos_embedding_row"][0])  # [gh, D/2]
        col = np.asarray(stored["pos_embedding_col"][0])  # [gw, D/2]
        pe = np.concatenate(
            [np.repeat(row[:, None], gw, axis=1), np.repeat(col[None], gh, axis=0)], axis=-1
        )  # [gh, gw, D]
        return pe.reshape(gh * gw, -1)
    pe = np.asarray(stored["pos_embedding"][0])[model.posemb_prefix :]  # [N, D]
    if len(pe) != gh * gw:
        raise ValueError(
            f"{len(pe)} position embeddings do not make a {gh}x{gw} grid: adapt the parameters "
            "to the image size first (vit_jax.weights.adapt(params, model, image_size))"
        )
    return pe


def stored_grid(params: dict[str, Any], model: Any) -> tuple[int, int] | None:
    """The grid a learned table was stored for (NaFlex resizes it to each image's), or None
    (sincos_2d and none store no table)."""
    if model.posemb not in ("learned", "learned_2d"):
        return None
    return architecture.native_image_size(params, 1)  # tokens per side


def cosine_similarity_maps(embeddings: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Cosine similarity of every position's embedding with every other's.

    Args:
      embeddings: row-major over the grid.  # [gh*gw, D]
      grid: (gh, gw).

    Returns:
      sim[i, j] is the gh x gw map of position (i, j)'s similarities.  # [gh, gw, gh, gw]
    """
    gh, gw = grid
    e = np.asarray(embeddings, np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
    return (e @ e.T).reshape(gh, gw, gh, gw)
