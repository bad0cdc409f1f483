"""tf.data input pipelines for ViT training and evaluation.

Sources: MNIST-format idx files (the default, Fashion-MNIST from the Debian package
dataset-fashion-mnist), image folders, and TFDS builders. Layout:

  config.py         default_config() and its validation
  splits.py         'train[:10%]' slicing syntax, per-process ranges
  subsets.py        class subsets and per-class budgets on label arrays
  idx_source.py     idx file parsing
  folder_source.py  image-folder scanning, decoding, corrupt files
  tfds_source.py    TFDS builders as ordered record streams
  tables.py         random-access tables of the idx and folder sources
  preprocess.py     pure per-example / per-batch TF functions (crop, resize, flip, mixup)
  streams.py        which example sits at each position of a process's share
  pipeline.py       the public iterators and counts

Importing this package does not import TensorFlow: the config is plain, and the
iterators (and CorruptImageError) load the tf.data modules on first use, so models,
checkpoints and the jitted steps run where TensorFlow is absent.
"""

from __future__ import annotations

from typing import Any

from vit_jax.data.config import DEFAULT_IDX_DIR, default_config

_PIPELINE = ("eval_iterator", "num_classes", "num_examples", "train_iterator")

__all__ = ["DEFAULT_IDX_DIR", "CorruptImageError", "default_config", *_PIPELINE]


def __getattr__(name: str) -> Any:  # PEP 562: TensorFlow only when a pipeline is used
    if name in _PIPELINE:
        from vit_jax.data import pipeline

        return getattr(pipeline, name)
    if name == "CorruptImageError":
        from vit_jax.data.folder_source import CorruptImageError

        return CorruptImageError
    raise AttributeError(f"module 'vit_jax.data' has no attribute {name!r}")
