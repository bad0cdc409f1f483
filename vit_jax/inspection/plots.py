"""The figures, as PNG files (matplotlib, optional: `pip install -e .[plot]`).

Each function takes the numbers the other modules compute and a path; none computes
anything the numbers file would not hold. matplotlib is imported on first use with
the non-interactive Agg backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vit_jax.base import files

MAX_ROLLOUT_IMAGES = 8


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or an ImportError that says how to get it."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            "the figures need matplotlib, an optional dependency: pip install -e .[plot]"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str) -> None:
    """The figure as a PNG at `path` (local or on a store), written whole."""
    plt = pyplot()
    with files.atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_filters(tiles: np.ndarray, variance_ratio: np.ndarray, path: str, title: str) -> None:
    """Principal components as tiles, 7 a row, each titled with its share of variance.

    Args:
      tiles: components rescaled to [0, 1] (`filters.to_tiles`).  # [k, P, P, C]
      variance_ratio: explained variance fraction of each.  # [k]
    """
    plt = pyplot()
    k, cols = len(tiles), min(7, len(tiles))
    rows = -(-k // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.3 * cols, 1.45 * rows + 0.4), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < k:
            tile = tiles[i] if tiles.shape[-1] == 3 else tiles[i, ..., 0]
            ax.imshow(tile, cmap=None if tiles.shape[-1] == 3 else "gray", interpolation="nearest")
            ax.set_title(f"PC{i + 1} {100 * variance_ratio[i]:.1f}%", fontsize=7)
    fig.suptitle(f"{title}\nprincipal components of the patch-embedding filters")
    _save(fig, path)


def plot_posemb_similarity(sim: np.ndarray, path: str, title: str) -> None:
    """One gh x gw similarity map per patch position, laid out on the grid.

    Args:
      sim: cosine similarities (`posemb.cosine_similarity_maps`).  # [gh, gw, gh, gw]
    """
    plt = pyplot()
    gh, gw = sim.shape[:2]
    # each map [gh, gw] with a NaN row and column after it: 1-pixel gaps, the last cut off
    gaps = np.pad(sim, [(0, 0), (0, 0), (0, 1), (0, 1)], constant_values=np.nan)
    mosaic = gaps.transpose(0, 2, 1, 3).reshape(gh * (gh + 1), -1)[:-1, :-1]
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # the gaps
    image = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    cols = range(0, gw, max(1, gw // 8))  # at most 8 ticks a side
    rows = range(0, gh, max(1, gh // 8))
    ax.set_xticks([j * (gw + 1) + (gw - 1) / 2 for j in cols], [str(j + 1) for j in cols])
    ax.set_yticks([i * (gh + 1) + (gh - 1) / 2 for i in rows], [str(i + 1) for i in rows])
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    fig.colorbar(image, ax=ax, label="cosine similarity")
    ax.set_title(f"{title}\nposition embedding similarity ({gh}x{gw} grid)")
    _save(fig, path)


def plot_attention_distance(distance: np.ndarray, path: str, title: str) -> None:
    """Mean attention distance against depth, one dot per head.

    Args:
      distance: mean distance in pixels.  # [L, H]
    """
    plt = pyplot()
    depth, heads = distance.shape
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    colors = plt.get_cmap("tab20" if heads > 10 else "tab10")
    layers = np.arange(1, depth + 1)
    for h in range(heads):
        ax.scatter(layers, distance[:, h], s=14, color=colors(h % colors.N), label=f"head {h + 1}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xlim(0.5, depth + 0.5)
    ax.set_ylim(0, max(float(distance.max()) * 1.1, 1.0))
    ax.set_xticks(np.arange(1, depth + 1, max(1, depth // 12)))
    ax.grid(alpha=0.3)
    if heads <= 16:
        ax.legend(
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
            title="one dot per head",
            title_fontsize=7,
        )
    ax.set_title(f"{title}\nmean attention distance")
    _save(fig, path)


def plot_rollout(
    images: np.ndarray, maps: np.ndarray, path: str, title: str, names: list[str] | None = None
) -> None:
    """Each image next to its attention-rollout map overlaid on it (first 8 images).

    Args:
      images: inputs in [-1, 1], [B, H, W, 3] or a list of [H, W, 3] (NaFlex).
      maps: rollout maps upsampled to the images (`attention.upsample`), [H, W] each.
      names: each image's row label (its file name); default 'image 1', 'image 2', ...
    """
    captions = [["attention rollout" if i == 0 else ""] for i in range(len(maps))]
    plot_relevance(images, [m[None] for m in maps], captions, path, title, names, "rollout flow")


def plot_relevance(
    images: np.ndarray,
    maps: np.ndarray,
    captions: list[list[str]],
    path: str,
    title: str,
    names: list[str] | None = None,
    what: str = "relevance",
) -> None:
    """Each image (first 8), then its relevance map for each class asked for, overlaid.

    Args:
      images: inputs in [-1, 1], [B, H, W, 3] or a list of [H, W, 3] (NaFlex).
      maps: relevance maps upsampled to the images, [K, H, W] each.
      captions: per image and class, 'name (probability)'.
      names: each image's row label (its file name); default 'image 1', 'image 2', ...
      what: the maps' name, on the colour bar.
    """
    plt = pyplot()
    n, k = min(len(images), MAX_ROLLOUT_IMAGES), len(maps[0])
    fig, axes = plt.subplots(
        n, k + 1, figsize=(2.6 * (k + 1) + 0.4, 2.5 * n + 0.6), squeeze=False, layout="constrained"
    )
    for i in range(n):
        rgb = np.clip((np.asarray(images[i]) + 1) / 2, 0, 1)
        axes[i, 0].imshow(rgb)
        axes[i, 0].set_ylabel(names[i] if names else f"image {i + 1}")
        for j in range(k):
            heat = maps[i][j] / max(float(maps[i][j].max()), 1e-12)
            axes[i, j + 1].imshow(rgb)
            shown = axes[i, j + 1].imshow(heat, cmap="inferno", alpha=0.6, vmin=0, vmax=1)
            axes[i, j + 1].set_title(captions[i][j], fontsize=8)
        for ax in axes[i]:
            ax.set(xticks=[], yticks=[])
    axes[0, 0].set_title("input", fontsize=9)
    fig.colorbar(
        shown, ax=axes.ravel().tolist(), shrink=min(0.9, 2.2 / n), label=f"{what} / its maximum"
    )
    fig.suptitle(title)
    _save(fig, path)
