"""Where attention goes: mean attention distance per head, and attention rollout.

Both take the attention probabilities that `apply_with_intermediates` hands back,
[L, B, H, N, N] with N = prefix + gh * gw tokens (the prefix: the class token, then the
registers, `model.num_prefix`), rows (queries) summing to one. They are written with
jax.numpy so that they run inside a jit next to the model; they accept NumPy arrays too.

Mean attention distance (the paper's Figure 7, right; Appendix D.7): for each head, the
distance in input pixels between a query patch and the key patches, weighted by the
attention, averaged over query patches (and then over images by the caller). Here
only patch tokens count: the prefix's rows and columns are dropped and each patch
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
class token's row over the patch tokens; a 'gap' model (pooling the mean of the patches)
gets the mean of the patch rows, which is the flow into its pooled representation. A
`map` model pools with its MAP head's attention over the patches (its probe, a query
that is no token, so no identity): the head's mean over heads is the final row, times
the patches' rows of the rollout. Registers are never drawn: the maps are the patches'.

NaFlex input (models/naflex.py): pass the batch `x` where a grid goes. Padding is neither
a query nor a key (the model gives pads zero weight as keys, so no real row's rollout
reaches one); each image's values come back on its own gh x gw grid, a list of arrays
(`on_grids`), since grids differ.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import naflex


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
    attention: jax.Array, grid: tuple[int, int] | dict, stride: int, num_prefix: int
) -> jax.Array:
    """Attention-weighted distance in pixels, averaged over query patches.

    Args:
      attention: probabilities, any leading axes (e.g. [L, B, H]).  # [..., N, N]
      grid: (gh, gw) patch grid, N = num_prefix + gh * gw; or the NaFlex batch the
        attention [L, B, H, N, N] is of: each patch at its own coordinates, padding
        neither a query nor a key.
      stride: input pixels per token side (`model.token_stride`).
      num_prefix: tokens before the patches (`model.num_prefix`).

    Returns:
      mean distance per leading index, e.g. [L, B, H].
    """
    a = jnp.asarray(attention)[..., num_prefix:, num_prefix:]  # [..., n, n] patches only
    queries = None
    if naflex.is_naflex(grid):
        centres = (jnp.asarray(grid["coords"]) + 0.5) * stride  # [B, n, 2]
        distance = jnp.linalg.norm(centres[:, :, None] - centres[:, None], axis=-1)[:, None]
        queries = jnp.asarray(grid["valid"], a.dtype)[:, None]  # [B, 1, n], as [.., B, H, n]
        a = a * queries[..., None, :]  # keys: the image's own patches
    elif a.shape[-2:] != (grid[0] * grid[1],) * 2:
        raise ValueError(
            f"attention over {attention.shape[-2:]} tokens does not fit a {grid[0]}x{grid[1]} "
            f"grid with {num_prefix} prefix token(s) ({num_prefix + grid[0] * grid[1]} tokens)"
        )
    else:
        distance = jnp.asarray(pairwise_distances(grid, stride), a.dtype)  # [n, n]
    a = a / jnp.maximum(a.sum(-1, keepdims=True), 1e-12)  # renormalise over patches
    per_query = (a * distance).sum(-1)  # [..., n]
    if queries is None:
        return per_query.mean(-1)
    return (per_query * queries).sum(-1) / queries.sum(-1)  # [...]


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
    # the layers multiplied, later layers on the left
    return functools.reduce(lambda rollout, layer: layer @ rollout, a[1:], a[0])


def flow(
    rollout: jax.Array, num_prefix: int, valid=None, head=None, token: bool | None = None
) -> jax.Array:
    """The rollout's flow into the representation, per patch token.

    Args:
      rollout: from `attention_rollout`.  # [B, N, N]
      num_prefix: tokens before the patches (the class token, then the registers).
      valid: NaFlex's real patches [B, N - num_prefix]: the mean takes their rows only.
      head: a `map` model's head attention [B, H, 1, N - num_prefix]: its mean over heads
        is the row (times the patches' rows of the rollout).
      token: the class token's row (row 0) is the representation's ('token' pooling);
        False: the mean of the patch rows ('gap'); None: with any prefix.

    Returns:
      flow.  # [B, N - num_prefix]
    """
    rollout = jnp.asarray(rollout)
    patches = rollout[:, num_prefix:]  # [B, n, N]
    if head is not None:
        row = jnp.einsum("bk,bkn->bn", jnp.asarray(head).mean(axis=1)[:, 0], patches)
    elif bool(num_prefix) if token is None else token:
        row = rollout[:, 0]
    else:
        w = jnp.ones(patches.shape[:2]) if valid is None else jnp.asarray(valid, rollout.dtype)
        row = (patches * w[..., None]).sum(1) / jnp.maximum(w.sum(1, keepdims=True), 1)
    return row[:, num_prefix:]


def rollout_maps(rollout: jax.Array, grid: tuple[int, int], num_prefix: int) -> jax.Array:
    """`flow` on the grid (gh, gw) of an image batch.  # [B, N, N] -> [B, gh, gw]"""
    return on_grids(flow(rollout, num_prefix), grid)


def on_grids(values: jax.Array, grid: tuple[int, int] | dict) -> jax.Array | list[np.ndarray]:
    """Per-patch values [B, ..., n] on their grid: an image batch's (gh, gw), [B, ..., gh, gw];
    or each image's own of the NaFlex batch `grid`, on the host, a list of [..., gh, gw] (its
    patches at their coordinates; padding dropped)."""
    if not naflex.is_naflex(grid):
        return values.reshape(*values.shape[:-1], *grid)
    values, keep, coords = (np.asarray(a) for a in (values, grid["valid"], grid["coords"]))
    out = []
    for b, (gh, gw) in enumerate(naflex.grids(grid)):
        image = np.zeros((*values.shape[1:-1], gh, gw), values.dtype)
        at = coords[b, keep[b]]  # [n_b, 2]
        image[..., at[:, 0], at[:, 1]] = values[b][..., keep[b]]
        out.append(image)
    return out


def upsample(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize maps [..., gh, gw] to the images' [..., H, W]."""
    maps = jnp.asarray(maps, jnp.float32)
    return np.asarray(jax.image.resize(maps, (*maps.shape[:-2], *size), "bilinear"))
