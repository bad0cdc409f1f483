"""Random-access example tables of the idx, folder and TFDS sources.

A table is the list of examples a split keeps (after slicing, class subsetting and the
per-class budget) with a function that loads example i. Random access lets the
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
from vit_jax.data import crop_decode, folder_source, idx_source, pixels, splits, subsets


@dataclasses.dataclass(frozen=True)
class Table:
    """The examples of one split, addressable by position 0..N-1.

    Attributes:
        size: Number of examples N.
        num_classes: Number of classes after subsetting.
        example: Position -> (image, label after relabelling); the image is a file's
            bytes or a decoded uint8 [h, w, 1 or 3] (`load` makes pixels of either).
        corrupt: (position, why) -> the error to raise for an image that does not decode.
        paths: The file of each example (folder source), else None.
        labels: Every example's label, where known without decoding (idx and folder
            sources; TFDS when a class subset or budget made it read them).  # int64 [N]
        class_names: The name of each class, in label order (after subsetting), where
            the source names them: the folder names, TFDS's ClassLabel names, the
            Fashion-MNIST and MNIST classes of the idx source.
        images: All images, where they are in memory and of one size (idx files), for
            the batched path of the pipeline.  # uint8 [N, h, w, c]
    """

    size: int
    num_classes: int
    example: Callable[[int], tuple[bytes | np.ndarray, int]]
    corrupt: Callable[[int, str], Exception] = lambda i, why: ValueError(f"example {i}: {why}")
    paths: np.ndarray | None = None
    labels: np.ndarray | None = None
    class_names: tuple[str, ...] | None = None
    images: np.ndarray | None = None

    def __len__(self) -> int:
        return self.size


def load(table: Table, i: int, size, method: str, window=None, out=None, crop=False):
    """Example i as pixels (`crop_of`, resized to `size` by `method`: written into `out`
    when given) and its label."""
    image, label = crop_of(table, i, method, window, crop)
    return pixels.resize(image, size, method, None, out), label


def crop_of(table: Table, i: int, method: str, window=None, crop=False):
    """Example i's pixels in `window` (a box, a function of the upright (h, w), or None:
    the whole image), uint8 [h, w, c], and its label. With `crop`, a file decodes its
    window alone (`crop_decode`: big_vision's pixels).

    Raises:
        The table's `corrupt` error, naming the example, for an image that does not decode.
    """
    try:
        image, label = table.example(i)
        if not isinstance(image, np.ndarray):
            if crop and window is not None:
                return crop_decode.decode_crop(image, window, method), label
            image = pixels.decode(image, method)
        box = window(*image.shape[:2]) if callable(window) else window
        y0, x0, h, w = box or (0, 0, *image.shape[:2])
        return image[y0 : y0 + h, x0 : x0 + w], label
    except (ValueError, OSError) as e:
        raise table.corrupt(i, str(e)) from None


def every_bad(table: Table, index, method: str, first: Exception) -> Exception:
    """The error of a batch of a folder whose example raised `first`: each of the batch's
    files decoded again (the batch is lost anyway) and every one that fails named."""
    if table.paths is None:
        return first
    bad = []
    for i in index:
        try:
            crop_of(table, int(i), method)
        except (ValueError, OSError):
            bad.append(str(table.paths[int(i)]))
    later = " Later batches are not read yet: others may follow."
    return folder_source.corrupt_error(bad[0], str(first), tuple(bad[1:]), later)


_TABLES: dict[tuple, Table] = {}
# The classes of the idx datasets by name: Fashion-MNIST's (as its project and TFDS name
# them) and MNIST's digits.
IDX_CLASS_NAMES = {
    "fashion_mnist": (
        "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
        "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
    ),
    "mnist": tuple(str(d) for d in range(10)),
}  # fmt: skip


def _kept(names, classes) -> tuple[str, ...] | None:
    """The names of the classes kept (`classes`, in their order), or all of them."""
    if names is None:
        return None
    return tuple(names[c] for c in classes) if classes is not None else tuple(names)


def open_table(cfg: ml_collections.ConfigDict, spec: str) -> Table:
    """The table of split `spec` (cached per process: opening a folder lists every file).

    examples_per_class applies when spec is cfg.train_split.
    """
    epc = cfg.examples_per_class if spec == cfg.train_split else None
    classes = None if cfg.classes is None else tuple(cfg.classes)
    key = (cfg.source, config_lib.data_dir(cfg), spec, classes, epc, cfg.subset_seed)
    if cfg.source == "folder":
        key += (cfg.skip_corrupt, cfg.cache, cfg.train_split, cfg.test_split)
    if cfg.source == "tfds":
        key += (cfg.name, cfg.cache)
    if cfg.cache:  # decoded as the preprocessing decodes JPEGs, or kept encoded
        key += (cfg.preprocessing, cfg.decode)
    if key not in _TABLES:
        opener = {"idx": _open_idx, "folder": _open_folder, "tfds": _open_tfds}[cfg.source]
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
    kept_images = images[split.start + kept]  # uint8 [N, H, W, C]
    num_classes = len(classes) if classes else total
    example = lambda i: (kept_images[i], int(new_labels[i]))
    names = IDX_CLASS_NAMES.get(cfg.name)
    names = _kept(names, classes) if names is not None and len(names) == total else None
    return Table(
        len(kept), num_classes, example, labels=new_labels, class_names=names, images=kept_images
    )


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
    if cfg.skip_corrupt or cfg.cache:  # every file decoded once, up front
        ok, images, failures = folder_source.decode_all(
            paths, cfg.cache, cfg.preprocessing, cfg.decode == "crop"
        )
        if failures and not cfg.skip_corrupt:  # every file was decoded: each one is named
            (path, detail), more = failures[0], tuple(p for p, _ in failures[1:])
            raise folder_source.corrupt_error(path, detail, more)
        if failures:
            logging.warning(
                f"image folder {root} split {spec!r}: skipped {len(failures)} corrupt image(s) "
                f"of {len(paths)} (skip_corrupt=True): {[path for path, _ in failures[:5]]}"
            )
        paths, new_labels = paths[ok], new_labels[ok]
    read = images.__getitem__ if cfg.cache else (lambda i: folder_source.read(paths[i]))
    example = lambda i: (read(i), int(new_labels[i]))
    corrupt = lambda i, why: folder_source.corrupt_error(paths[i], why)
    names = _kept(class_names, classes)  # then labels, class_names:
    return Table(len(paths), num_classes, example, corrupt, paths, new_labels, names)


def _open_tfds(cfg, spec: str, classes, epc) -> Table:
    from vit_jax.data import tfds_source  # noqa: PLC0415 -- tensorflow_datasets only here

    builder = tfds_source.open_builder(cfg.name, cfg.data_dir)
    total = tfds_source.num_classes(builder)
    subsets.check_classes(classes, total, f"TFDS dataset {cfg.name!r}")
    name = splits.split_name(spec)
    split = splits.resolve(spec, tfds_source.split_size(builder, name))
    kept = np.arange(split.start, split.stop)  # record numbers
    kept_labels = None
    if classes is not None or epc is not None:  # needs every label of the range
        labels = tfds_source.labels(builder, name)[split.start : split.stop]
        chosen, kept_labels = subsets.select(labels, classes, total, epc, cfg.subset_seed)
        kept = kept[chosen]
    relabel = subsets.relabel_table(classes, total)
    records = tfds_source.records(builder, name)

    def example(i: int) -> tuple[bytes, int]:
        record = records[int(kept[i])]
        return record["image"], int(relabel[int(record["label"])])

    def corrupt(i: int, why: str) -> ValueError:
        return ValueError(
            f"TFDS dataset {cfg.name!r} split {name!r} record {int(kept[i])}: the image "
            f"does not decode ({why})."
        )

    if cfg.cache:
        examples = []
        for i in range(len(kept)):
            image, label = example(i)
            try:  # each decoded once; a crop-decoding config keeps the bytes
                decoded = pixels.decode(image, cfg.preprocessing)
            except ValueError as e:
                raise corrupt(i, str(e)) from None
            examples.append((image if cfg.decode == "crop" else decoded, label))
        example = examples.__getitem__
    names = _kept(tfds_source.class_names(builder), classes)
    num_classes = len(classes) if classes else total
    return Table(len(kept), num_classes, example, corrupt, labels=kept_labels, class_names=names)
