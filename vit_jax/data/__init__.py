"""The input pipeline for ViT training and evaluation, on Grain; no TensorFlow.

Sources: MNIST-format idx files (the default, Fashion-MNIST from the Debian package
dataset-fashion-mnist), image folders, and TFDS datasets prepared as ArrayRecord (read
by `tfds.data_source`). Every source is a random-access table, so a batch is a pure
function of (seed, step): a resumed run reads what an uninterrupted run reads, and each
process reads only its share. Layout:

  config.py         default_config() and its validation
  splits.py         'train[:10%]' slicing syntax, per-process ranges
  subsets.py        class subsets and per-class budgets on label arrays
  idx_source.py     idx file parsing
  folder_source.py  image-folder scanning, decoding, corrupt files
  tfds_source.py    TFDS datasets through tfds.data_source (ArrayRecord)
  tables.py         the random-access tables of the three sources
  preprocessing.py  a checkpoint's preprocessing string: resize, mean and std, eval crop
  pixels.py         the one preprocessing: decode, crop, resize (tf_bilinear,
                    pil_antialias or pil_bicubic), normalise
  crop_decode.py    a JPEG's training crop decoded alone, as big_vision (_crop_decode.c)
  augment.py        Inception crop, flip, mixup, label smoothing, seeded per step
  randaugment.py    big_vision's RandAugment (the AugReg recipes): which op, at what argument
  image_ops.py      its 16 ops, each as big_vision's TF code computes it, NumPy and PIL
  naflex.py         each image at its own aspect ratio: big_vision's resize_to_sequence,
                    patches; a NaFlex run's length per step
  order.py          which example sits at each position of a process's share
  assemble.py       each batch from its examples: loaded, augmented, stacked
  pipeline.py       the public iterators and counts
  batches.py        Grain running them ahead of the loop
  images.py         image files for the commands (infer, figures), class names

Training, evaluation, few-shot, `infer`, `evaluate` and the figures read pixels through
pixels.py, so one image file gives the same model input everywhere.
"""

from __future__ import annotations

from typing import Any

from vit_jax.data.config import DEFAULT_IDX_DIR, default_config

_PIPELINE = ("class_names", "eval_iterator", "num_classes", "num_examples", "train_iterator")

__all__ = ["DEFAULT_IDX_DIR", "CorruptImageError", "decode_crop", "default_config", *_PIPELINE]


def __getattr__(name: str) -> Any:  # PEP 562: Grain and PIL only when a pipeline is used
    if name in _PIPELINE:
        from vit_jax.data import pipeline

        return getattr(pipeline, name)
    if name == "CorruptImageError":
        from vit_jax.data.folder_source import CorruptImageError

        return CorruptImageError
    if name == "decode_crop":
        from vit_jax.data.crop_decode import decode_crop

        return decode_crop
    raise AttributeError(f"module 'vit_jax.data' has no attribute {name!r}")
