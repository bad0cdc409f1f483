"""The public input pipeline: class and example counts, train and eval iterators.

Batches are numpy dicts holding this process's share of the global batch:
``{'image': float32 [b, H, W, 3] in [-1, 1], 'label': float32 [b, K]}`` (+ 'mask'
float32 [b] in eval), b = global_batch // process_count.

A function of the step number makes each step's whole batch (`TrainBatch`): the
examples order.py assigns to this process, loaded, augmented (augment.py, and
randaugment.py when dataset.randaugment is set) and stacked. The batch is a pure
function of (seed, step), so a run resumed at step s starts the same function at s --
no iterator state to save. `Batches` runs it ahead of the loop on threads (PIL and
NumPy release the GIL) or, with dataset.workers > 0, in Grain's worker processes, and
stops them when closed: a run closes every iterator it opens, so none outlives it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterator

import grain
import ml_collections
import numpy as np

from vit_jax.data import augment, order, pixels, randaugment, splits, tables
from vit_jax.data import config as config_lib

Batch = dict[str, np.ndarray]
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


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """step -> this process's train batch (a picklable callable for Grain's workers)."""

    cfg: ml_collections.ConfigDict
    split: str
    size: tuple[int, int]
    seed: int
    global_batch: int
    process_index: int
    process_count: int

    def share(self, step: int) -> tuple[tables.Table, np.ndarray, slice, np.ndarray]:
        """(the table, the table indices [b] of this process's examples, the slots of the
        global batch they fill, their augmentation uniforms float64 [b, DRAWS])."""
        table = tables.open_table(self.cfg, self.split)
        index, slots = order.train_share(
            len(table),
            step,
            global_batch=self.global_batch,
            process_index=self.process_index,
            process_count=self.process_count,
            seed=self.seed,
        )
        return table, index, slots, augment.step_draws(self.seed, step, self.global_batch)[slots]

    def __call__(self, step: int) -> Batch:
        cfg = self.cfg
        table, index, slots, draws = self.share(step)
        method = cfg.preprocessing
        dtype = pixels.dtype_of(method)
        hot = dtype == np.float32 and cfg.randaugment is None  # normalised in its slot
        images, labels = np.empty([len(index), *self.size, 3], dtype), []
        for j, (i, u) in enumerate(zip(index, draws, strict=True)):
            window = functools.partial(augment.crop_window, u=u, min_area=cfg.crop_min_area)
            labels.append(tables.load(table, int(i), self.size, method, window, images[j])[1])
            if cfg.flip and u[-1] < 0.5:
                pixels.mirror(images[j])
            if hot:
                pixels.normalize(images[j], in_place=True)
        if cfg.randaugment is not None:  # after crop, resize and flip, as big_vision
            images = pixels.to_uint8(images)
            for j, slot in enumerate(range(slots.start, slots.stop)):
                rng = augment.generator(self.seed, augment.RANDAUG_SALT, step, slot)
                images[j] = randaugment.randaugment(images[j], rng, *cfg.randaugment)
        batch = {
            "image": images if hot else pixels.normalize(images, in_place=True),
            "label": augment.one_hot(labels, table.num_classes, cfg.label_smoothing),
        }
        if cfg.mixup > 0:
            augment.mixup(batch, self.seed, step, cfg.mixup)
        return batch


@dataclasses.dataclass(frozen=True)
class EvalBatch:
    """batch number -> this process's eval batch, padded with mask 0 past its share."""

    cfg: ml_collections.ConfigDict
    split: str
    size: tuple[int, int]
    lo: int
    hi: int
    batch_size: int

    def rows(self, number: int) -> tuple[tables.Table, int, int]:
        """(the table, the first and past-the-last example of batch `number`); the batch's
        slots from stop - start on are padding."""
        start = self.lo + number * self.batch_size
        return tables.open_table(self.cfg, self.split), start, min(start + self.batch_size, self.hi)

    def __call__(self, number: int) -> Batch:
        table, start, stop = self.rows(number)
        images = np.zeros([self.batch_size, *self.size, 3], np.float32)  # zero padding
        labels = np.zeros([self.batch_size, table.num_classes], np.float32)
        method = self.cfg.preprocessing
        for j, i in enumerate(range(start, stop)):
            if pixels.dtype_of(method) == np.float32:  # resized into its slot, normalised there
                label = tables.load(table, i, self.size, method, out=images[j])[1]
                pixels.normalize(images[j], in_place=True)
            else:
                image, label = tables.load(table, i, self.size, method)
                images[j] = pixels.normalize(image)
            labels[j, label] = 1.0
        mask = (np.arange(self.batch_size) < stop - start).astype(np.float32)
        return {"image": images, "label": labels, "mask": mask}


class Batches(Iterator[Batch]):
    """`make(i)` for each i of `indices`, prepared ahead of the consumer; `close()` (or
    the end of a `with` block, or the last batch taken) stops the work and waits for it,
    so that no thread or process of the pipeline outlives it.

    With `workers` = 0, `threads` threads each prepare whole batches, at most
    2 x threads ahead (PIL and NumPy release the GIL). With `workers` > 0, Grain's
    worker processes prepare them (`mp_prefetch`), each on one thread.
    """

    def __init__(self, make: Callable[[int], Batch], indices: range, threads: int, workers: int):
        self._grain = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._queue: collections.deque[concurrent.futures.Future] = collections.deque()
        if workers > 0:
            from absl import flags  # noqa: PLC0415

            if not flags.FLAGS.is_parsed():  # Grain reads its absl flags (defaults will do)
                flags.FLAGS.mark_as_parsed()
            ds = grain.MapDataset.range(indices.start, indices.stop).map(make)
            options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
            ds = ds.to_iter_dataset(options)
            self._grain = iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers)))
            return
        self._make, self._indices, self._ahead = make, iter(indices), 2 * threads
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "vit_jax-batches")
        self._fill()

    def _fill(self) -> None:
        while len(self._queue) < self._ahead and (i := next(self._indices, None)) is not None:
            self._queue.append(self._pool.submit(self._make, i))

    def __next__(self) -> Batch:
        if self._grain is not None:
            return next(self._grain)
        if self._pool is None or not self._queue:
            self.close()
            raise StopIteration
        batch = self._queue.popleft().result()  # an error in make() is raised here
        self._fill()
        return batch

    def close(self) -> None:
        """Cancels the batches not started, waits for the running ones; idempotent."""
        if self._grain is not None:
            self._grain.close()  # stops and joins the worker processes
            self._grain = None
        if self._pool is not None:
            for future in self._queue:
                future.cancel()
            self._queue.clear()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # an iterator dropped unclosed: stop, without waiting
        if getattr(self, "_pool", None) is not None:
            for future in self._queue:
                future.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
        if getattr(self, "_grain", None) is not None:
            self._grain.close()


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

    Yields:
        {'image': float32 [b, H, W, 3] in [-1, 1], 'label': float32 [b, K]} with
        b = global_batch // process_count; labels are one-hot, smoothed and mixed as
        configured.
    """
    config_lib.validate(cfg)
    index, count, _ = _processes(global_batch, process_index, process_count)
    if not num_examples(cfg, cfg.train_split):
        raise ValueError(
            "the train split has no examples after slicing and class subsetting; check "
            "dataset.train_split, dataset.classes and dataset.examples_per_class."
        )
    size = splits.image_size_hw(image_size)
    make = TrainBatch(cfg, cfg.train_split, size, seed, global_batch, index, count)
    return _batches(make, range(start_step, _FOREVER), cfg)


def eval_iterator(
    cfg: ml_collections.ConfigDict,
    split: str,
    *,
    global_batch: int,
    image_size: int | tuple[int, int],
    process_index: int | None = None,
    process_count: int | None = None,
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

    Yields:
        {'image': float32 [b, H, W, 3], 'label': float32 one-hot [b, K] (no smoothing),
        'mask': float32 [b], 1 for real examples and 0 for padding}.
    """
    config_lib.validate(cfg)
    index, count, b = _processes(global_batch, process_index, process_count)
    n = num_examples(cfg, split)
    lo, hi = splits.process_range(n, index, count)
    num_batches = math.ceil(math.ceil(n / count) / b)
    make = EvalBatch(cfg, split, splits.image_size_hw(image_size), lo, hi, b)
    return _batches(make, range(num_batches), cfg)
