"""Where attention goes: mean attention distance per head, and attention rollout.

Both take the attention probabilities that `apply_with_intermediates` hands back,
[L, B, H, N, N] with N = prefix + gh * gw tokens (prefix = 1 with a class token, else 0),
rows (queries) summing to one. They are written with jax.numpy so that they run
inside a jit next to the model; they accept NumPy arrays as well.

Mean attention distance (the paper's Figure 7, right; Appendix D.7): for each head, the
distance in input pixels between a query patch and the key patches, weighted by the
attention, averaged over query patches (and then over images by the caller). Here
only patch tokens count: the class token's row and column are dropped and each patch
query's weights over the patches are renormalised to sum to one, so that the distance
says how far *within the image* a head looks (attention to the class token, which has no
position, neither counts as distance 0 nor is lost). Patch centres are
((i + 1/2) * s, (j + 1/2) * s) for grid cell (i, j) and token stride s =
`model.token_stride` (the patch size, times the ResNet stem's downsampling for hybrids),
so distances are in input pixels for plain and hybrid models at any resolution.

Attention rollout (Abnar & Zuidema 2020): per layer the heads' attention is averaged,
the identity is added for the residual connection and the rows are renormalised
((A + I) / 2); the layers are multiplied, the last on the left. Row q of the result says
how much of each input token flows into output token q. The map of an image is the
class token's row over the patch tokens; a model without a class token ('gap', pooling
the mean of all tokens) gets the mean of the patch rows, which is the flow into its
pooled representation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def patch_centres(grid: tuple[int, int], stride: int) -> np.ndarray:
    """Pixel coordinates (y, x) of the centre of each patch, row-major.  # [gh*gw, 2]"""
    gh, gw = grid
    y, x = np.mgrid[:gh, :gw]
    return (np.stack([y.ravel(), x.ravel()], axis=-1) + 0.5) * stride


def pairwise_distances(grid: tuple[int, int], stride: int) -> np.ndarray:
    """Euclidean pixel distance between every pair of patch centres.  # [N, N]"""
    c = patch_centres(grid, stride)
    return np.sqrt(((c[:, None, :] - c[None, :, :]) ** 2).sum(-1))


def mean_attention_distance(
    attention: jax.Array, grid: tuple[int, int], stride: int, num_prefix: int
) -> jax.Array:
    """Attention-weighted distance in pixels, averaged over query patches.

    Args:
      attention: probabilities, any leading axes (e.g. [L, B, H]).  # [..., N, N]
      grid: (gh, gw) patch grid; N = num_prefix + gh * gw.
      stride: input pixels per token side (`model.token_stride`).
      num_prefix: tokens before the patches (1 for a class token, else 0).

    Returns:
      mean distance per leading index, e.g. [L, B, H].
    """
    n = grid[0] * grid[1]
    if attention.shape[-1] != num_prefix + n or attention.shape[-2] != num_prefix + n:
        raise ValueError(
            f"attention over {attention.shape[-2:]} tokens does not fit a {grid[0]}x{grid[1]} "
            f"grid with {num_prefix} prefix token(s) ({num_prefix + n} tokens)"
        )
    a = jnp.asarray(attention)[..., num_prefix:, num_prefix:]  # [..., n, n] patches only
    a = a / jnp.maximum(a.sum(-1, keepdims=True), 1e-12)  # renormalise over patches
    distance = jnp.asarray(pairwise_distances(grid, stride), a.dtype)  # [n, n]
    return (a * distance).sum(-1).mean(-1)  # [...]


def attention_rollout(attention: jax.Array) -> jax.Array:
    """Attention rollout through all layers.

    Args:
      attention: probabilities of every layer.  # [L, B, H, N, N]

    Returns:
      row-stochastic flow from input tokens (columns) to output tokens (rows).  # [B, N, N]
    """
    a = jnp.asarray(attention).mean(axis=2)  # [L, B, N, N]
    a = a + jnp.eye(a.shape[-1], dtype=a.dtype)  # residual connection
    a = a / a.sum(-1, keepdims=True)
    rollout = a[0]
    for layer in range(1, a.shape[0]):
        rollout = a[layer] @ rollout  # later layers on the left
    return rollout


def rollout_maps(rollout: jax.Array, grid: tuple[int, int], num_prefix: int) -> jax.Array:
    """The rollout's flow into the representation, per patch, on the grid.

    Args:
      rollout: from `attention_rollout`.  # [B, N, N]
      grid: (gh, gw).
      num_prefix: 1 with a class token (its row is taken), 0 without (mean of the rows).

    Returns:
      maps.  # [B, gh, gw]
    """
    rollout = jnp.asarray(rollout)
    patches = rollout[:, :, num_prefix:]  # [B, N, n]
    flow = patches[:, 0] if num_prefix else patches.mean(axis=1)  # [B, n]
    return flow.reshape(flow.shape[0], *grid)


def upsample(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize maps [..., gh, gw] to the images' [..., H, W]."""
    maps = jnp.asarray(maps, jnp.float32)
    return np.asarray(jax.image.resize(maps, (*maps.shape[:-2], *size), "bilinear"))
