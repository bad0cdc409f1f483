"""The public input pipeline: class and example counts, train and eval iterators.

Batches are numpy dicts holding this process's share of the global batch:
``{'image': float32 [b, H, W, 3] in [-1, 1], 'label': float32 [b, K]}`` (+ 'mask'
float32 [b] in eval), b = global_batch // process_count. With dataset.naflex, 'image' is
a NaFlex dict (naflex.py: patches, coords, valid), each image at its own aspect ratio,
and a training step's global batch depends on its length (naflex.Lengths).

A function of the step number makes each step's whole batch (assemble.py's `TrainBatch`,
a pure function of (seed, step): a resumed run starts it at its step). `Batches`
(batches.py) runs it ahead of the loop on threads (PIL and NumPy release the GIL) or,
with dataset.workers > 0, in Grain's worker processes, and stops them when closed: a run
closes every iterator it opens.
"""

from __future__ import annotations

import math
import os

import ml_collections

from vit_jax.data import config as config_lib
from vit_jax.data import images, naflex, splits, tables
from vit_jax.data.assemble import EvalBatch, TrainBatch
from vit_jax.data.batches import Batches

_FOREVER = 2**62


def num_classes(cfg: ml_collections.ConfigDict) -> int:
    """Number of classes the model predicts: len(cfg.classes), else all of the dataset's."""
    config_lib.validate(cfg)
    return tables.open_table(cfg, cfg.train_split).num_classes


def class_names(cfg: ml_collections.ConfigDict) -> list[str] | None:
    """The names of the classes the model predicts, in label order (after dataset.classes),
    where the source names them (folders, TFDS, Fashion-MNIST); None elsewhere."""
    config_lib.validate(cfg)
    names = tables.open_table(cfg, cfg.train_split).class_names
    return None if names is None else list(names)


def num_examples(cfg: ml_collections.ConfigDict, split: str) -> int:
    """Examples of a split spec over all processes, after slicing and subsetting.

    Args:
        cfg: The dataset config.
        split: A split spec such as cfg.train_split or cfg.test_split;
            examples_per_class applies when it equals cfg.train_split.
    """
    config_lib.validate(cfg)
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


def _batches(make: TrainBatch | EvalBatch, indices: range, cfg: ml_collections.ConfigDict):
    return Batches(make, indices, cfg.threads or os.cpu_count() or 1, cfg.workers)


def train_iterator(
    cfg: ml_collections.ConfigDict,
    *,
    global_batch: int,
    image_size: int | tuple[int, int],
    seed: int,
    start_step: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
    patch_size: int = 0,
    batch_multiple: int = 1,
) -> Batches:
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
        patch_size: With dataset.naflex: the model's patch size.
        batch_multiple: With dataset.naflex: what every step's global batch is a multiple
            of (devices x accum_steps).

    Yields:
        {'image': float32 [b, H, W, 3] in [-1, 1], 'label': float32 [b, K]} with
        b = global_batch // process_count; labels are one-hot, smoothed and mixed as
        configured. With dataset.naflex, 'image' is a NaFlex dict and b varies by step.
    """
    config_lib.validate(cfg)
    index, count, _ = _processes(global_batch, process_index, process_count)
    if not num_examples(cfg, cfg.train_split):
        raise ValueError(
            "the train split has no examples after slicing and class subsetting; check "
            "dataset.train_split, dataset.classes and dataset.examples_per_class."
        )
    size = images.parse_image_size(image_size)
    patch = _naflex_patch(cfg, patch_size)
    lengths = _lengths(cfg, global_batch, math.lcm(batch_multiple, count), seed) if patch else None
    make = TrainBatch(cfg, cfg.train_split, size, seed, global_batch, index, count, lengths, patch)
    batches = _batches(make, range(start_step, _FOREVER), cfg)
    batches.lengths = lengths
    return batches


def _naflex_patch(cfg: ml_collections.ConfigDict, patch_size: int) -> int:
    """The patch size NaFlex batches are cut with; 0 for square images (no dataset.naflex)."""
    if cfg.naflex.seq_lens is None:
        return 0
    if patch_size < 1:
        raise ValueError("dataset.naflex needs the model's patch size: pass patch_size")
    return patch_size


def _lengths(cfg, global_batch: int, multiple: int, seed: int) -> naflex.Lengths:
    """A NaFlex run's length schedule; every length gets a batch."""
    lengths = naflex.Lengths.of(cfg.naflex, global_batch, multiple, seed)
    if why := lengths.too_few():
        raise ValueError(f"dataset.naflex.tokens_per_batch={lengths.tokens_per_batch} is {why}")
    return lengths


def eval_iterator(
    cfg: ml_collections.ConfigDict,
    split: str,
    *,
    global_batch: int,
    image_size: int | tuple[int, int],
    process_index: int | None = None,
    process_count: int | None = None,
    patch_size: int = 0,
) -> Batches:
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
        patch_size: With dataset.naflex: the model's patch size ('image' is then a NaFlex
            dict at the largest of dataset.naflex.seq_lens).

    Yields:
        {'image': float32 [b, H, W, 3] (with dataset.naflex a NaFlex dict: 'patches'
        [b, N, P*P*3], 'coords' [b, N, 2], 'valid' [b, N]), 'label': float32 one-hot [b, K]
        (no smoothing), 'mask': float32 [b], 1 for real examples and 0 for padding}.
    """
    config_lib.validate(cfg)
    index, count, b = _processes(global_batch, process_index, process_count)
    n = num_examples(cfg, split)
    lo, hi = splits.process_range(n, index, count)
    num_batches = math.ceil(math.ceil(n / count) / b)
    patch = _naflex_patch(cfg, patch_size)
    make = EvalBatch(cfg, split, images.parse_image_size(image_size), lo, hi, b, patch)
    return _batches(make, range(num_batches), cfg)
