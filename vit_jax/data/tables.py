"""Random-access example tables for the idx and folder sources.

A table is the list of examples a split keeps (after slicing, class subsetting and the
per-class budget) with a TF function that loads example i. Random access lets the
pipeline draw any permutation of the split from a seed, so a batch depends only on
(seed, step) and each process loads only the examples of its share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_collections
import numpy as np
from absl import logging

from vit_jax.data import config as config_lib
from vit_jax.data import folder_source, idx_source, splits, subsets
from vit_jax.data._tf import tf


@dataclasses.dataclass(frozen=True)
class Table:
    """The examples of one split, addressable by position 0..N-1.

    Attributes:
        labels: Labels after relabelling.  # int64 [N]
        num_classes: Number of classes after subsetting.
        load: TF function: int64 scalar position -> uint8 image [h, w, 1 or 3], or the
            encoded file bytes (folder source without cache; decoded in preprocessing).
        paths: The file of each example (folder source) to name corrupt files, else None.
        num_skipped: Corrupt files left out (skip_corrupt=True).
        images: All images when they are in memory and of one size (idx source), for
            batched preprocessing.  # uint8 [N, h, w, c]
    """

    labels: np.ndarray
    num_classes: int
    load: Callable[[tf.Tensor], tf.Tensor]
    paths: np.ndarray | None = None
    num_skipped: int = 0
    images: tf.Tensor | None = None

    def __len__(self) -> int:
        return len(self.labels)


_TABLES: dict[tuple, Table] = {}


def open_table(cfg: ml_collections.ConfigDict, spec: str) -> Table:
    """The table of split `spec` (cached per process: opening a folder lists every file).

    examples_per_class applies when spec is cfg.train_split.
    """
    epc = cfg.examples_per_class if spec == cfg.train_split else None
    classes = None if cfg.classes is None else tuple(cfg.classes)
    key = (cfg.source, config_lib.data_dir(cfg), spec, classes, epc, cfg.subset_seed)
    if cfg.source == "folder":
        key += (cfg.skip_corrupt, cfg.cache, cfg.train_split, cfg.test_split)
    if key not in _TABLES:
        opener = _open_idx if cfg.source == "idx" else _open_folder
        _TABLES[key] = opener(cfg, spec, classes, epc)
    return _TABLES[key]


def _open_idx(cfg, spec: str, classes, epc) -> Table:
    data_dir = config_lib.data_dir(cfg)
    images, labels = idx_source.load_split(data_dir, splits.split_name(spec))
    split = splits.resolve(spec, len(labels))
    total = idx_source.num_classes(data_dir)
    kept, new_labels = subsets.select(
        labels[split.start : split.stop], classes, total, epc, cfg.subset_seed
    )
    images_t = tf.constant(images[split.start + kept])  # uint8 [N, H, W, C]
    num_classes = len(classes) if classes else total
    return Table(new_labels, num_classes, lambda i: images_t[i], images=images_t)


def _open_folder(cfg, spec: str, classes, epc) -> Table:
    root = cfg.data_dir
    names = [splits.split_name(s) for s in (cfg.train_split, cfg.test_split, spec)]
    class_names = folder_source.check_same_classes(root, list(dict.fromkeys(names)))
    paths, labels = folder_source.scan_split(root, names[2], class_names)
    split = splits.resolve(spec, len(labels))
    kept, new_labels = subsets.select(
        labels[split.start : split.stop], classes, len(class_names), epc, cfg.subset_seed
    )
    paths = paths[split.start + kept]
    num_classes = len(classes) if classes else len(class_names)
    if not (cfg.skip_corrupt or cfg.cache):
        paths_t = tf.constant(paths.astype(str))
        return Table(new_labels, num_classes, lambda i: tf.io.read_file(paths_t[i]), paths)

    ok, images = folder_source.decode_all(paths, keep_images=cfg.cache)
    bad = np.setdiff1d(np.arange(len(paths)), ok)
    if len(bad) and not cfg.skip_corrupt:
        detail = folder_source.find_corrupt([paths[bad[0]]])
        raise folder_source.corrupt_error(paths[bad[0]], detail[0][1] if detail else "error")
    if len(bad):
        logging.warning(
            "image folder %s split %r: skipped %d corrupt image(s) of %d (skip_corrupt=True): %s",
            root,
            spec,
            len(bad),
            len(paths),
            [paths[i] for i in bad[:5]],
        )
    paths, new_labels = paths[ok], new_labels[ok]
    if cfg.cache:
        load = folder_source.image_store(images)
    else:
        paths_t = tf.constant(paths.astype(str))
        load = lambda i: tf.io.read_file(paths_t[i])
    return Table(new_labels, num_classes, load, paths, num_skipped=len(bad))
