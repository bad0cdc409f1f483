"""Principal components of the patch-embedding filters (the paper's Figure 7, left).

The patch embedding is a P x P convolution with stride P: its kernel [P, P, C, D] holds
D filters of P * P * C pixels each. PCA over the D filters (centred on their mean)
gives orthonormal components in pixel space, ordered by explained variance; shown
as RGB tiles they look like plausible basis functions for the fine structure of a patch.

Only meaningful for plain ViTs: a hybrid's embedding acts on ResNet feature maps
(C = hundreds of channels, usually P = 1), not on pixels, so `filter_pca` refuses it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

NUM_COMPONENTS = 28  # as many as the paper shows


class NotPixelFilters(ValueError):
    """The embedding filters do not act on image pixels (hybrid models)."""


@dataclasses.dataclass(frozen=True)
class FilterPCA:
    """Principal components of embedding filters.

    Attributes:
      components: unit-norm, mutually orthogonal, in filter shape.  # [k, P, P, C]
      explained_variance: variance of the filters along each component, descending.  # [k]
      variance_ratio: the same as a fraction of the filters' total variance.  # [k]
    """

    components: np.ndarray
    explained_variance: np.ndarray
    variance_ratio: np.ndarray


def embedding_kernel(params: dict[str, Any], model: Any) -> np.ndarray:
    """The patch-embedding kernel [P, P, C, D] of a plain ViT.

    Raises:
      NotPixelFilters: for hybrids (`model.resnet_stages` is not None), whose filters
        act on ResNet features rather than pixels.
    """
    kernel = np.asarray(params["embedding"]["kernel"], np.float64)
    if model.resnet_stages is not None:
        raise NotPixelFilters(
            f"the patch-embedding filters of a hybrid (kernel {tuple(kernel.shape)}) act on "
            f"the ResNet stem's {kernel.shape[2]}-channel features, not on RGB pixels: "
            "there are no pixel filters to show"
        )
    return kernel


def filter_pca(kernel: np.ndarray, num_components: int = NUM_COMPONENTS) -> FilterPCA:
    """PCA of the D filters of a [P, P, C, D] kernel.

    At most min(D - 1, P * P * C) components exist (the centred filters span no more);
    fewer than asked are returned then. Each component's sign is fixed so that its
    largest-magnitude entry is positive.
    """
    p1, p2, c, d = kernel.shape
    x = np.asarray(kernel, np.float64).reshape(p1 * p2 * c, d).T  # [D, P*P*C]
    x = x - x.mean(axis=0)  # centred over the filters
    _, s, vt = np.linalg.svd(x, full_matrices=False)  # vt: [r, P*P*C], s descending
    k = min(num_components, max(d - 1, 1), vt.shape[0])
    comps = vt[:k]
    signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(axis=1)])
    comps = comps * signs[:, None]
    variance = s**2 / max(d - 1, 1)
    return FilterPCA(
        components=comps.reshape(k, p1, p2, c).astype(np.float32),
        explained_variance=variance[:k],
        variance_ratio=variance[:k] / max(variance.sum(), 1e-30),
    )


def to_tiles(components: np.ndarray) -> np.ndarray:
    """Each component rescaled to [0, 1] on its own (min -> 0, max -> 1) for display.

    [k, P, P, C] -> [k, P, P, C]; a constant component becomes 0.5.
    """
    comps = np.asarray(components, np.float64)
    lo = comps.min(axis=(1, 2, 3), keepdims=True)
    span = comps.max(axis=(1, 2, 3), keepdims=True) - lo
    return np.where(span > 0, (comps - lo) / np.where(span > 0, span, 1), 0.5)
