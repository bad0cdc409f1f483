"""The public input pipeline: class and example counts, train and eval iterators.

Batches are numpy dicts holding this process's share of the global batch:
``{'image': float32 [b, H, W, 3] in [-1, 1], 'label': float32 [b, K]}`` (+ 'mask'
float32 [b] in eval), b = global_batch // process_count. See streams.py for how
positions map to examples (determinism, exact resume, per-process shares).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import ml_collections
import numpy as np

from vit_jax.data import config as config_lib
from vit_jax.data import folder_source, preprocess, splits, streams, tables, tfds_source
from vit_jax.data._tf import tf

Batch = dict[str, np.ndarray]


def _plan(cfg: ml_collections.ConfigDict, spec: str) -> tfds_source.Plan:
    classes = None if cfg.classes is None else tuple(cfg.classes)
    epc = cfg.examples_per_class if spec == cfg.train_split else None
    return tfds_source.plan(cfg.name, cfg.data_dir, spec, classes, epc, cfg.subset_seed)


def num_classes(cfg: ml_collections.ConfigDict) -> int:
    """Number of classes the model predicts: len(cfg.classes), else all of the dataset's."""
    config_lib.validate(cfg)
    if cfg.source == "tfds":
        return _plan(cfg, cfg.train_split).num_classes
    return tables.open_table(cfg, cfg.train_split).num_classes


def num_examples(cfg: ml_collections.ConfigDict, split: str) -> int:
    """Examples of a split spec over all processes, after slicing and subsetting.

    Args:
        cfg: The dataset config.
        split: A split spec such as cfg.train_split or cfg.test_split;
            examples_per_class applies when it equals cfg.train_split.
    """
    config_lib.validate(cfg)
    if cfg.source == "tfds":
        return _plan(cfg, split).size
    return len(tables.open_table(cfg, split))


def _processes(
    global_batch: int, process_index: int | None, process_count: int | None
) -> tuple[int, int, int]:
    """(process_index, process_count, local batch), defaulting to jax's processes."""
    if process_index is None or process_count is None:
        import jax  # noqa: PLC0415 -- only needed when the caller does not say.

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, {process_count}).")
    if global_batch < process_count or global_batch % process_count:
        raise ValueError(
            f"global_batch={global_batch} does not split evenly over {process_count} processes; "
            f"use a multiple of {process_count}."
        )
    return process_index, process_count, global_batch // process_count


def _finish(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_optimization.map_fusion = True  # load + preprocess in one map
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def _train_dataset(
    cfg: ml_collections.ConfigDict,
    *,
    global_batch: int,
    image_size: int | tuple[int, int],
    seed: int,
    start_step: int,
    process_index: int | None,
    process_count: int | None,
) -> tf.data.Dataset:
    """The batched train tf.data pipeline of this process (see train_iterator)."""
    index, count, b = _processes(global_batch, process_index, process_count)
    shares = dict(
        global_batch=global_batch,
        process_index=index,
        process_count=count,
        start_step=start_step,
        seed=seed,
    )
    batched = False  # whether the stream yields whole shares of a step already
    if cfg.source == "tfds":
        plan = _plan(cfg, cfg.train_split)
        k = plan.num_classes
        ds = streams.tfds_train(plan, shuffle_buffer=cfg.shuffle_buffer, cache=cfg.cache, **shares)
    else:
        table = tables.open_table(cfg, cfg.train_split)
        k, batched = table.num_classes, table.images is not None
        ds = streams.table_train(table, **shares)
    size = preprocess.image_size_hw(image_size)
    augment = preprocess.train_batch if batched else preprocess.train_image

    def example(ex):  # one example, or one share of a step if batched
        image = augment(ex["image"], ex["seed"], size, cfg.crop_min_area, cfg.flip)
        label = preprocess.one_hot(ex["label"], k, cfg.label_smoothing)
        return {"image": image, "label": label, "step": ex["step"]}

    ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if not batched:
        ds = ds.batch(b, drop_remainder=True)
    if cfg.mixup > 0:
        mix_key = preprocess.key(seed, preprocess.MIXUP_SALT)
        mix_seed = lambda batch: preprocess.seeds(mix_key, batch["step"][0])
        ds = ds.map(lambda batch: preprocess.mixup(batch, mix_seed(batch), cfg.mixup))
    return _finish(ds.map(lambda batch: {"image": batch["image"], "label": batch["label"]}))


def train_iterator(
    cfg: ml_collections.ConfigDict,
    *,
    global_batch: int,
    image_size: int | tuple[int, int],
    seed: int,
    start_step: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[Batch]:
    """Infinite training batches of this process's share, a pure function of (cfg, seed, step).

    Args:
        cfg: The dataset config (default_config()).
        global_batch: Batch size over all processes; a multiple of process_count.
        image_size: Target size, int or (height, width).
        seed: Run seed: the shuffle, crops, flips and mixup weights all derive from it.
        start_step: First step to yield. The iterator started at k yields exactly the
            batches the iterator started at 0 yields from step k on (exact resume).
        process_index: This process, default jax.process_index().
        process_count: Number of processes, default jax.process_count().

    Yields:
        {'image': float32 [b, H, W, 3] in [-1, 1], 'label': float32 [b, K]} with
        b = global_batch // process_count; labels are one-hot, smoothed and mixed as
        configured.
    """
    config_lib.validate(cfg)
    ds = _train_dataset(
        cfg,
        global_batch=global_batch,
        image_size=image_size,
        seed=seed,
        start_step=start_step,
        process_index=process_index,
        process_count=process_count,
    )
    index, count, _ = _processes(global_batch, process_index, process_count)

    def indices(step: int) -> np.ndarray:
        n = num_examples(cfg, cfg.train_split)
        shares = dict(global_batch=global_batch, process_index=index, process_count=count)
        step_t = tf.constant(step, tf.int64)
        return streams.table_positions(n, step_t, seed=seed, **shares)[0].numpy()

    return _iterate(cfg, cfg.train_split, ds, start_step, indices)


def eval_iterator(
    cfg: ml_collections.ConfigDict,
    split: str,
    *,
    global_batch: int,
    image_size: int | tuple[int, int],
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[Batch]:
    """One pass over a split: each example exactly once over all processes.

    Every process yields the same number of batches; the tail is padded to full batches
    with zero images and labels whose 'mask' is 0.

    Args:
        cfg: The dataset config.
        split: Split spec, e.g. cfg.test_split.
        global_batch: Batch size over all processes; a multiple of process_count.
        image_size: Target size, int or (height, width); images are only resized.
        process_index: This process, default jax.process_index().
        process_count: Number of processes, default jax.process_count().

    Yields:
        {'image': float32 [b, H, W, 3], 'label': float32 one-hot [b, K] (no smoothing),
        'mask': float32 [b], 1 for real examples and 0 for padding}.
    """
    config_lib.validate(cfg)
    index, count, b = _processes(global_batch, process_index, process_count)
    if cfg.source == "tfds":
        source = _plan(cfg, split)
        ds = streams.tfds_eval(source, index, count)
    else:
        source = tables.open_table(cfg, split)
        ds = streams.table_eval(source, index, count)
    k, size = source.num_classes, preprocess.image_size_hw(image_size)

    def example(ex):
        image = preprocess.eval_image(ex["image"], size)
        return {"image": image, "label": preprocess.one_hot(ex["label"], k), "mask": 1.0}

    ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    padding = {"image": tf.zeros([*size, 3]), "label": tf.zeros([k]), "mask": 0.0}
    num_batches = math.ceil(math.ceil(num_examples(cfg, split) / count) / b)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(padding).repeat())
    ds = _finish(ds.take(num_batches * b).batch(b))
    share_lo, share_hi = splits.process_range(num_examples(cfg, split), index, count)

    def indices(batch: int) -> np.ndarray:
        return np.arange(share_lo + batch * b, min(share_lo + (batch + 1) * b, share_hi))

    return _iterate(cfg, split, ds, 0, indices)


def _iterate(cfg, split: str, ds: tf.data.Dataset, first: int, indices) -> Iterator[Batch]:
    """Yields ds as numpy; a folder image that fails to decode is named in the error.

    Args:
        indices: batch number -> table positions it reads (folder source only).
    """
    iterator = ds.as_numpy_iterator()
    batch_number = first
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
            if cfg.source != "folder":
                raise
            table = tables.open_table(cfg, split)
            bad = folder_source.find_corrupt(list(table.paths[indices(batch_number)]))
            bad = bad or folder_source.find_corrupt(list(table.paths))
            if not bad:
                raise
            raise folder_source.corrupt_error(*bad[0]) from e
        yield batch
        batch_number += 1
