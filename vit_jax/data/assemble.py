"""Each batch from its examples: `TrainBatch` (step -> this process's train batch) and
`EvalBatch` (batch number -> this process's eval batch), the `make(i)` that batches.py runs
ahead of the loop and pipeline.py's iterators hand out.

A training batch is the examples order.py assigns to this process at the step, loaded,
augmented (augment.py, and randaugment.py when dataset.randaugment is set) and stacked.
It is a pure function of (seed, step), so a run resumed at step s starts the same function
at s -- no iterator state to save. Each example's crop, flip and RandAugment draw from
(seed, step, its slot of the global batch), so no example's augmentation depends on
which others are made, or in what order.
"""

from __future__ import annotations

import dataclasses
import functools

import ml_collections
import numpy as np

from vit_jax.data import augment, folder_source, naflex, order, pixels, randaugment, tables
from vit_jax.data.batches import Batch


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
    lengths: naflex.Lengths | None = None  # NaFlex: each step's length and batch
    patch: int = 0  # NaFlex: the model's patch size

    def share(self, step: int) -> tuple[tables.Table, np.ndarray, slice, np.ndarray]:
        """(the table, the table indices [b] of this process's examples, the slots of the
        global batch they fill, their augmentation uniforms float64 [b, DRAWS])."""
        table = tables.open_table(self.cfg, self.split)
        g, first = self.global_batch, None
        if self.lengths is not None:
            g, first = self.lengths.batch_at(step), self.lengths.offset(step)
        index, slots = order.train_share(
            len(table),
            step,
            global_batch=g,
            process_index=self.process_index,
            process_count=self.process_count,
            seed=self.seed,
            first=first,
        )
        return table, index, slots, augment.step_draws(self.seed, step, g)[slots]

    def _randaugment(self, images: np.ndarray, step: int, first: int) -> np.ndarray:
        """RandAugment of resized images [n, h, w, c] (c = 1 or 3), those of the step's
        slots first, first + 1, ..., each with its own generator of (seed, step, slot).
        -> uint8 [n, h, w, 3]"""
        images = pixels.to_uint8(images)
        images = np.repeat(images, 3, -1) if images.shape[-1] == 1 else images
        for j, image in enumerate(images):
            rng = augment.generator(self.seed, augment.RANDAUG_SALT, step, first + j)
            images[j] = randaugment.randaugment(image, rng, *self.cfg.randaugment)
        return images

    def _naflex(self, step: int) -> Batch:
        """Each image cropped (Inception), resized to the step's length, flipped, as patches."""
        cfg, (table, index, slots, draws) = self.cfg, self.share(step)
        method, area, crop = cfg.preprocessing, cfg.crop_min_area, cfg.decode == "crop"
        x, labels = naflex.empty(len(index), self.lengths.length(step), self.patch), []
        for j, (i, u) in enumerate(zip(index, draws, strict=True)):
            window = functools.partial(augment.crop_window, u=u, min_area=area, own_aspect=True)
            image, label = tables.crop_of(table, int(i), method, window, crop)
            if cfg.randaugment is not None:  # on the resized image, as the square path; put flips
                size = naflex.size_for_sequence(*image.shape[:2], self.patch, x["valid"].shape[1])
                image = naflex.resize(image, size)[None]  # [1, H, W, c]
                image = self._randaugment(image, step, slots.start + j)[0]
            naflex.put(x, j, image, self.patch, cfg.flip and u[-1] < 0.5, method)
            labels.append(label)
        return {
            "image": x,
            "label": augment.one_hot(labels, table.num_classes, cfg.label_smoothing),
        }

    def __call__(self, step: int) -> Batch:
        try:
            return self._naflex(step) if self.lengths is not None else self._square(step)
        except folder_source.CorruptImageError as e:
            table, index = self.share(step)[:2]
            raise tables.every_bad(table, index, self.cfg.preprocessing, e) from None

    def _square(self, step: int) -> Batch:
        """Each image cropped (Inception), resized, flipped, RandAugmented, mixed up."""
        cfg = self.cfg
        table, index, slots, draws = self.share(step)
        method, area, hot = cfg.preprocessing, cfg.crop_min_area, False
        if table.images is not None:  # in memory, one size: the batch cropped and resized
            images, labels = table.images[index], table.labels[index]
            h, w = images.shape[1:3]
            boxes = [augment.crop_window(h, w, u, area) for u in draws]
            images = pixels.resize_batch(images, boxes, self.size, method)
            if cfg.flip:  # whole-batch operations: the per-image Python is the cost here
                mirror = draws[:, -1] < 0.5
                images[mirror] = images[mirror, :, ::-1]
        else:  # each file resized into its slot of the batch, flipped and normalised there
            dtype = pixels.dtype_of(method)
            hot = dtype == np.float32 and cfg.randaugment is None
            images, labels = np.empty([len(index), *self.size, 3], dtype), []
            crop = cfg.decode == "crop"
            for j, (i, u) in enumerate(zip(index, draws, strict=True)):
                window = functools.partial(augment.crop_window, u=u, min_area=area)
                image = tables.load(table, int(i), self.size, method, window, images[j], crop)
                labels.append(image[1])
                if cfg.flip and u[-1] < 0.5:
                    pixels.mirror(images[j])
                if hot:
                    pixels.normalize(images[j], in_place=True, method=method)
        if cfg.randaugment is not None:  # after crop, resize and flip, as big_vision
            images = self._randaugment(images, step, slots.start)
        batch = {
            "image": images if hot else pixels.normalize(images, in_place=True, method=method),
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
    patch: int = 0  # NaFlex: the model's patch size

    def __call__(self, number: int) -> Batch:
        start = self.lo + number * self.batch_size
        stop = min(start + self.batch_size, self.hi)  # slots from stop - start on: padding
        table = tables.open_table(self.cfg, self.split)
        labels = np.zeros([self.batch_size, table.num_classes], np.float32)  # padding: 0
        try:
            images = (self._naflex if self.patch else self._square)(table, start, stop, labels)
        except folder_source.CorruptImageError as e:
            raise tables.every_bad(table, range(start, stop), self.cfg.preprocessing, e) from None
        mask = (np.arange(self.batch_size) < stop - start).astype(np.float32)
        return {"image": images, "label": labels, "mask": mask}

    def _naflex(self, table: tables.Table, start: int, stop: int, labels: np.ndarray):
        """Each whole image resized to the largest of dataset.naflex.seq_lens, as patches;
        labels [b, K] set."""
        x = naflex.empty(self.batch_size, max(self.cfg.naflex.seq_lens), self.patch)
        x["valid"][:, 0] = True  # a padding row: one zero patch (no row is all padding)
        for j, i in enumerate(range(start, stop)):
            image, label = tables.crop_of(table, i, self.cfg.preprocessing)
            naflex.put(x, j, image, self.patch, method=self.cfg.preprocessing)
            labels[j, label] = 1.0
        return x

    def _square(self, table: tables.Table, start: int, stop: int, labels: np.ndarray):
        """Each image resized to self.size by the preprocessing's crop (`pixels.fit`: the
        whole image, unless it names one) and normalised; labels [b, K] set.
        -> float32 [b, H, W, 3]"""
        method, n = self.cfg.preprocessing, max(stop - start, 0)
        images = np.zeros([self.batch_size, *self.size, 3], np.float32)  # the padding: 0
        batched = table.images is not None and pixels.Preprocessing.parse(method).whole
        if batched and n:  # in memory, one size, whole images: resized as one batch
            whole = [(0, 0, *table.images.shape[1:3])] * n
            resized = pixels.resize_batch(table.images[start:stop], whole, self.size, method)
            images[:n] = pixels.normalize(resized, method=method)
            labels[np.arange(n), table.labels[start:stop]] = 1.0
        for j, i in enumerate(range(start, stop) if not batched else ()):
            image, label = tables.crop_of(table, i, method)
            if pixels.dtype_of(method) == np.float32:  # resized into its slot, normalised there
                pixels.fit(image, self.size, method, out=images[j])
                pixels.normalize(images[j], in_place=True, method=method)
            else:
                images[j] = pixels.normalize(pixels.fit(image, self.size, method), method=method)
            labels[j, label] = 1.0
        return images
