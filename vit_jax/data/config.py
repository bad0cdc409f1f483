"""The dataset section of a run config: fields, defaults, and their validation.

The fields (`default_config` sets their defaults: Fashion-MNIST from idx files):

    source: Where examples come from: 'idx' (MNIST-format idx files, read into
        memory), 'folder' (DIR/<split>/<class>/*.jpg|jpeg|png) or 'tfds' (a
        TFDS builder prepared in the ArrayRecord format).
    name: TFDS builder name ('cifar10', 'imagenet2012', 'oxford_iiit_pet', ...), any
        image-classification builder with 'image' and 'label' features. Only for 'tfds'.
    data_dir: The idx directory, the image-folder root, or the TFDS data_dir. None
        means the source's default: DEFAULT_IDX_DIR for 'idx' (Debian package
        dataset-fashion-mnist), TFDS's own default for 'tfds'; 'folder' requires it.
    train_split: Split used by train_iterator, with TFDS slicing syntax for every
        source: 'train', 'train[:10%]', 'train[90%:]', 'train[100:-100]'.
    test_split: Split used for evaluation, same syntax.
    classes: None (all classes) or class ids to keep, relabelled 0..k-1 in the
        listed order: (5, 6, 7, 8, 9) -> 0..4.
    examples_per_class: None, or keep only the first n examples of each class of
        the train split after a shuffle seeded with subset_seed.
    subset_seed: Seed of that shuffle (fixed, so the subset does not change with the
        training seed).
    preprocessing: How a crop is resized to the model's resolution and normalised:
        'tf_bilinear' (tf.image.resize: bilinear, no antialiasing, float; how the
        published checkpoints were trained and evaluated) or 'pil_antialias' (PIL's
        antialiased bilinear rounded to uint8; what HF's and timm's processors
        compute), to [-1, 1]; or a whole spec such as a timm tower's,
        'pil_bicubic:mean=...:std=...:crop=0.875:mode=center', whose crop shapes
        evaluation only (vit_jax/data/preprocessing.py). '' (the default): init_from's
        own (a tower's, from its source's files), 'tf_bilinear' without one. Checkpoints
        the run writes record it.
    decode: How a training crop comes out of a JPEG (folder and tfds sources): 'full'
        (the whole file decoded, the Inception window sliced from it: the original
        vit_jax, the paper's presets) or 'crop' (the window alone, as big_vision's
        tf.image.decode_and_crop_jpeg: the AugReg presets; in 4:2:0 files its first and
        last columns differ). Evaluation decodes whole files (vit_jax/data/crop_decode.py).
    crop_min_area: Smallest crop area (fraction of the image) of the Inception crop.
    flip: Random horizontal flips in training.
    mixup: Beta(alpha, alpha) mixup within the local batch; 0 turns it off.
    randaugment: None, or (num_layers, magnitude) of big_vision's RandAugment on
        each training image after crop and flip (vit_jax/data/randaugment.py); the
        AugReg settings use (2, 0), (2, 10), (2, 15) and (2, 20).
    label_smoothing: One-hot targets become (1 - s) * onehot + s / num_classes.
    skip_corrupt: Skip images that do not decode (folder source; counted and
        logged) instead of raising an error that names the file.
    cache: Keep decoded images in memory (folder and tfds sources; idx always is); with
        decode='crop' the files' bytes, so that the pixels do not depend on it.
    threads: Threads that prepare batches ahead of the loop in this process; 0 means
        one per CPU core.
    workers: Grain worker processes that prepare batches (each with one thread);
        0 prepares them in this process, on `threads` threads.
    naflex: Each image at its own aspect ratio, as patches (vit_jax/data/naflex.py):
        `seq_lens` None (square images of config.image_size) or the lengths in
        patches, not counting a class token (training draws one per step; evaluation
        takes the largest); `tokens_per_batch` the patch slots of a step's batch,
        padding included, class tokens not (its global batch is tokens_per_batch //
        length, rounded down to a multiple of devices x accum_steps; 0: config.batch_size
        x the largest length). `preprocessing` then names the JPEG decode and the mean and std: the
        resize is big_vision's (antialiased bilinear); the training crop keeps the image's
        own aspect ratio up to the Inception jitter. config.image_size is then the grid
        of the stored position table (image_size / patch a side), resized to each image.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from ml_collections import config_dict

from vit_jax.base.problems import (
    Problem,
    integer,
    is_int,
    number,
    one_of,
    optional,
    raise_if_any,
    table_problems,
)
from vit_jax.data import crop_decode, preprocessing, randaugment, splits

SOURCES = ("idx", "folder", "tfds")
DEFAULT_IDX_DIR = "/usr/share/datasets/fashion-mnist"
# The recipe pretrains on the first five Fashion-MNIST classes, fine-tunes on the others.
FASHION_MNIST_HALVES = ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))


def default_config() -> ml_collections.ConfigDict:
    """Returns the dataset config with its defaults (Fashion-MNIST from idx files); the
    module's docstring says what each field means."""
    return ml_collections.ConfigDict(
        dict(
            source="idx",
            name="fashion_mnist",
            data_dir=config_dict.placeholder(str),
            train_split="train",
            test_split="test",
            classes=config_dict.placeholder(tuple),
            examples_per_class=config_dict.placeholder(int),
            subset_seed=0,
            preprocessing="",
            decode="full",
            crop_min_area=0.05,
            flip=True,
            mixup=0.0,
            randaugment=config_dict.placeholder(tuple),
            label_smoothing=0.0,
            skip_corrupt=False,
            cache=False,
            threads=0,
            workers=0,
            naflex=ml_collections.ConfigDict(
                dict(seq_lens=config_dict.placeholder(tuple), tokens_per_batch=0)
            ),
        )
    )


def _classes(ids: Any) -> str | None:
    ok = isinstance(ids, (tuple, list)) and ids and len(set(ids)) == len(ids)
    if ok and all(is_int(c) and c >= 0 for c in ids):
        return None
    return "expected None (all) or distinct class ids >= 0, e.g. (5, 6, 7, 8, 9)"


def _seq_lens(lens: Any) -> str | None:
    if isinstance(lens, (tuple, list)) and lens and all(is_int(n) and n >= 1 for n in lens):
        return None
    return "expected None (square images) or patches a row >= 1, e.g. (64, 128, 256)"


def _randaugment(args: Any) -> str | None:
    if not isinstance(args, (tuple, list)) or len(args) != 2:
        return "expected None or (num_layers, magnitude), e.g. (2, 15)"
    try:
        randaugment.check_args(*args)
    except ValueError as e:
        return str(e)
    return None


# The dataset section's table (base.problems): field -> rule.
FIELDS = {
    "source": one_of(SOURCES),
    "preprocessing": preprocessing.problem,
    "decode": one_of(crop_decode.DECODES),
    **dict.fromkeys(("train_split", "test_split"), splits.spec_rule),
    "classes": optional(_classes),
    "examples_per_class": optional(integer(1, " (or None: all)")),
    "subset_seed": integer(0),
    "crop_min_area": number(0, 1, low_open=True),
    "mixup": number(0, note=" (Beta concentration; 0 turns it off)"),
    "randaugment": optional(_randaugment),
    "label_smoothing": number(0, 1, high_open=True),
    **dict.fromkeys(("threads", "workers"), integer(0)),
}


NAFLEX = {
    "seq_lens": optional(_seq_lens),
    "tokens_per_batch": integer(0, " (0: batch_size x the largest length)"),
}


def problems(cfg: ml_collections.ConfigDict, prefix: str = "dataset.") -> list[Problem]:
    """Every field of a dataset config that cannot make sense (`FIELDS`, then what
    relates the source to its directory), from the config alone: nothing is read."""
    out = table_problems(cfg, FIELDS, prefix)
    if flex := cfg.get("naflex"):
        out += table_problems(flex, NAFLEX, f"{prefix}naflex.")
        if flex.seq_lens is not None and cfg.mixup:
            why = "mixup blends two images pixel by pixel; NaFlex images differ in shape: set 0"
            out.append(Problem(f"{prefix}mixup", cfg.mixup, why))
    if cfg.source == "tfds" and remote_tfds(cfg.data_dir):
        out.append(Problem(f"{prefix}data_dir", cfg.data_dir, REMOTE_TFDS))
    if cfg.source == "folder" and not cfg.data_dir:
        why = (
            "source 'folder' needs the folder DIR, with DIR/train/<class>/*.jpg and "
            "DIR/test/<class>/*.jpg"
        )
        out.append(Problem(f"{prefix}data_dir", cfg.data_dir, why))
    if cfg.decode == "crop" and cfg.source != "idx" and crop_decode.native() is None:
        out.append(Problem(f"{prefix}decode", cfg.decode, crop_decode.MISSING))
    return out


# Measured with array_record 0.8 and gcsfs: a TFDS dataset prepared as ArrayRecord in a
# gs:// data_dir lists, but reading a record never returns (ArrayRecord's reader has no
# object-store backend of its own). The idx and image-folder sources read gs:// directly.
REMOTE_TFDS = (
    "TFDS datasets are read by ArrayRecord, which cannot read from an object store: mount "
    "the bucket (e.g. gcsfuse) and pass the mount's path, or copy the prepared dataset to a "
    "local disk (gcloud storage cp -r gs://BUCKET/DATA_DIR/NAME DIR/) and pass DIR; image "
    "folders and idx files may stay on the bucket"
)


def remote_tfds(data_dir: str | None) -> bool:
    """Whether a TFDS data_dir is on an object store, where ArrayRecord cannot read."""
    return bool(data_dir) and str(data_dir).startswith(("gs://", "s3://"))


def validate(cfg: ml_collections.ConfigDict) -> None:
    """Raises a ConfigError (a ValueError) naming every bad field of a dataset config."""
    raise_if_any(problems(cfg), "dataset config")


def data_dir(cfg: ml_collections.ConfigDict) -> str | None:
    """The directory the source reads, with the per-source default applied."""
    if cfg.data_dir:
        return cfg.data_dir
    return DEFAULT_IDX_DIR if cfg.source == "idx" else None
