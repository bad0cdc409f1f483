"""Class subsets and per-class example budgets, computed on label arrays (pure numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from absl import logging


class ClassesError(ValueError):
    """Class ids to keep that the dataset does not have."""


def check_classes(classes: Sequence[int] | None, num_total: int, where: str) -> None:
    """Raises ClassesError if a kept class id is not a class of the dataset."""
    if classes is None:
        return
    bad = [c for c in classes if not 0 <= c < num_total]
    if bad:
        raise ClassesError(
            f"{where} has {num_total} classes (ids 0..{num_total - 1}); {bad} do not exist"
        )


def relabel_table(classes: Sequence[int] | None, num_total: int) -> np.ndarray:
    """Maps original class id -> new id, -1 for dropped classes.  # [num_total]"""
    if classes is None:
        return np.arange(num_total, dtype=np.int64)
    table = np.full([num_total], -1, np.int64)
    table[np.asarray(classes, np.int64)] = np.arange(len(classes))
    return table


def select(
    labels: np.ndarray,
    classes: Sequence[int] | None,
    num_total: int,
    examples_per_class: int | None = None,
    subset_seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Chooses the examples a split keeps and their new labels.

    Args:
        labels: Original labels of the split's examples, in storage order.  # [N]
        classes: Class ids to keep, relabelled 0..k-1 in this order; None keeps all.
        num_total: Number of classes of the dataset before subsetting.
        examples_per_class: If set, keep the first n examples of each kept class in a
            permutation of the split drawn with subset_seed.
        subset_seed: Seed of that permutation.

    Returns:
        (indices, new_labels): kept positions in storage order, ascending  # [M]
        and their labels after relabelling.  # [M]
    """
    labels = np.asarray(labels, np.int64)
    check_classes(classes, num_total, "the dataset")
    new_labels = relabel_table(classes, num_total)[labels]  # [N], -1 = dropped
    keep = new_labels >= 0
    if examples_per_class is not None:
        order = np.random.default_rng(subset_seed).permutation(len(labels))
        order = order[keep[order]]
        # Rank of each example within its class along the seeded order.
        by_class = order[np.argsort(new_labels[order], kind="stable")]  # [M]
        sorted_labels = new_labels[by_class]
        ranks = np.zeros(len(labels), np.int64)
        ranks[by_class] = np.arange(len(by_class)) - np.searchsorted(sorted_labels, sorted_labels)
        counts = np.bincount(sorted_labels)
        short = [int(c) for c in np.unique(sorted_labels) if counts[c] < examples_per_class]
        if short:
            have = [int(counts[c]) for c in short]
            logging.warning(
                f"examples_per_class={examples_per_class}: classes {short} have only {have} "
                "examples; keeping all of them."
            )
        keep &= ranks < examples_per_class
    indices = np.flatnonzero(keep)
    return indices, new_labels[indices]
