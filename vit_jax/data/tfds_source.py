"""TFDS image-classification builders, read as ordered streams of encoded records.

TFDS splits are not random access (TFRecord files), so this source streams: each
process reads a contiguous range of the split in storage order (TFDS shuffles examples
when it prepares a dataset), and the pipeline shuffles with a buffer. Images stay
encoded until after shuffling and skipping, so a resume skips records, not decodes.

Class subsets and per-class budgets need the labels of the split: they are read once
per process (image bytes skipped) and kept in memory.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools

import numpy as np

from vit_jax.data._tf import tf  # before tensorflow_datasets, which imports TensorFlow

# isort: split
import tensorflow_datasets as tfds

from vit_jax.data import splits, subsets


def _prepare_hint(builder: tfds.core.DatasetBuilder) -> str:
    """How to prepare `builder`'s dataset where this builder reads it.

    `--data_dir` of `tfds build` is the root (TFDS adds <name>/<version> below it), so the
    hint names `builder.data_dir_root`, not `builder.data_dir`, the versioned directory.
    """
    name = builder.name
    if builder.builder_config is not None:
        name += f"/{builder.builder_config.name}"
    root = str(builder.data_dir_root)
    return (
        f"Prepare it with `tfds build {name} --data_dir={root}` (in Python: "
        f"`tfds.builder({name!r}, data_dir={root!r}).download_and_prepare()`); "
        f"imagenet2012 and imagenet21k need their archives in {root}/downloads/manual first."
    )


@functools.lru_cache(maxsize=16)
def open_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
    """tfds.builder(name, data_dir) with errors that list close names or how to prepare."""
    base = name.split("/")[0].split(":")[0]
    known = tfds.list_builders(with_community_datasets=False)
    if base not in known:
        close = difflib.get_close_matches(base, known, n=5, cutoff=0.5)
        raise ValueError(
            f"dataset.name={name!r} is not a TFDS builder (close matches: {close}). Expected an "
            "image-classification builder with 'image' and 'label' features, e.g. cifar10, "
            "cifar100, imagenet2012, oxford_iiit_pet, oxford_flowers102, fashion_mnist."
        )
    builder = tfds.builder(name, data_dir=data_dir)
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise ValueError(
            f"TFDS builder {name!r} has features {list(features)}; the pipeline needs "
            "'image' and 'label' (an image-classification dataset)."
        )
    return builder


def _read(builder, name: str, start: int, stop: int | None) -> tf.data.Dataset:
    """Records [start, stop) of split `name` (all if stop is None) in storage order.

    Images stay encoded; the pipeline decodes them after shuffling and skipping.
    """
    decoders = None
    if isinstance(builder.info.features["image"], tfds.features.Image):
        decoders = {"image": tfds.decode.SkipDecoding()}
    read_config = tfds.ReadConfig(interleave_cycle_length=1)  # keeps storage order
    try:
        ds = builder.as_dataset(
            split=name if stop is None else f"{name}[{start}:{stop}]",
            shuffle_files=False,
            decoders=decoders,
            read_config=read_config,
        )
    except AssertionError as e:  # TFDS asserts that the data was prepared.
        raise FileNotFoundError(
            f"TFDS dataset {builder.name!r} is not prepared in {builder.data_dir}. "
            f"{_prepare_hint(builder)}"
        ) from e
    options = tf.data.Options()
    options.deterministic = True
    ds = ds.with_options(options)
    ds = ds.map(lambda ex: {"image": ex["image"], "label": ex["label"]})
    # take() keeps the range exact even where slicing is not applied (tfds.testing.mock_data).
    return ds if stop is None else ds.take(stop - start)


@functools.lru_cache(maxsize=16)
def split_size(builder, name: str) -> int:
    """Number of examples of split `name` (from the dataset info, else by cardinality)."""
    infos = builder.info.splits
    if len(infos) and name not in infos:
        raise ValueError(
            f"TFDS dataset {builder.name!r} has no split {name!r}; its splits are {list(infos)}."
        )
    if len(infos):
        return int(infos[name].num_examples)
    ds = _read(builder, name, 0, None)  # raises the not-prepared error
    size = int(ds.cardinality())
    if size < 0:
        raise FileNotFoundError(
            f"TFDS dataset {builder.name!r} has no split info in {builder.data_dir}. "
            f"{_prepare_hint(builder)}"
        )
    return size


@functools.lru_cache(maxsize=32)
def _labels(builder, name: str, start: int, stop: int) -> np.ndarray:
    """Labels of records [start, stop) of split `name`.  # int64 [stop - start]"""
    ds = _read(builder, name, start, stop).map(lambda ex: ex["label"]).batch(8192)
    parts = [np.asarray(x, np.int64) for x in ds.as_numpy_iterator()]
    return np.concatenate(parts) if parts else np.zeros([0], np.int64)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one split spec reads: its raw range and the kept examples within it.

    Attributes:
        builder: The TFDS builder.
        name: Split name, e.g. 'train' for 'train[:10%]'.
        start: First raw record of the spec.
        stop: End of the raw range.
        kept: Kept positions relative to start, ascending, or None (all kept).  # [M]
        relabel: Original class id -> new id (-1 dropped).  # [num_total]
        num_classes: Classes after subsetting.
    """

    builder: tfds.core.DatasetBuilder
    name: str
    start: int
    stop: int
    kept: np.ndarray | None
    relabel: np.ndarray
    num_classes: int

    @property
    def size(self) -> int:
        return self.stop - self.start if self.kept is None else len(self.kept)

    def part(self, index: int, count: int) -> tuple[int, int, int]:
        """(raw_lo, raw_hi, n): the raw range holding share `index` of count, and its size."""
        lo, hi = splits.process_range(self.size, index, count)
        if self.kept is None:
            return self.start + lo, self.start + hi, hi - lo
        if hi == lo:
            return self.start, self.start, 0
        return self.start + int(self.kept[lo]), self.start + int(self.kept[hi - 1]) + 1, hi - lo

    def examples(self, raw_lo: int, raw_hi: int) -> tf.data.Dataset:
        """Kept examples of raw range [raw_lo, raw_hi): {'image': encoded, 'label': new id}."""
        ds = _read(self.builder, self.name, raw_lo, raw_hi)
        relabel = tf.constant(self.relabel)
        if self.kept is not None:
            mask = np.zeros([raw_hi - raw_lo], bool)
            inside = self.kept[
                (self.kept >= raw_lo - self.start) & (self.kept < raw_hi - self.start)
            ]
            mask[inside - (raw_lo - self.start)] = True
            mask_t = tf.constant(mask)
            ds = ds.enumerate().filter(lambda j, ex: mask_t[j])
            ds = ds.map(lambda _, ex: ex)
        return ds.map(lambda ex: {"image": ex["image"], "label": tf.gather(relabel, ex["label"])})


def plan(
    name: str,
    data_dir: str | None,
    spec: str,
    classes: tuple[int, ...] | None,
    examples_per_class: int | None,
    subset_seed: int,
) -> Plan:
    """Resolves a split spec of a TFDS builder into a Plan (reads labels if subsetting)."""
    builder = open_builder(name, data_dir)
    num_total = builder.info.features["label"].num_classes
    subsets.check_classes(classes, num_total, f"TFDS dataset {name!r}")
    split = splits.resolve(spec, split_size(builder, splits.split_name(spec)))
    kept = None
    if classes is not None or examples_per_class is not None:
        labels = _labels(builder, split.name, split.start, split.stop)
        kept, _ = subsets.select(labels, classes, num_total, examples_per_class, subset_seed)
    relabel = subsets.relabel_table(classes, num_total)
    return Plan(
        builder,
        split.name,
        split.start,
        split.stop,
        kept,
        relabel,
        len(classes) if classes else num_total,
    )
