"""The dataset section of a run config: fields, defaults, and their validation."""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from vit_jax.base.problems import Problem, integer, is_int, number, one_of, raise_if_any
from vit_jax.data import pixels, randaugment, splits

SOURCES = ("idx", "folder", "tfds")
DECODERS = ("host", "dali")
DEFAULT_IDX_DIR = "/usr/share/datasets/fashion-mnist"
# The recipe pretrains on the first five Fashion-MNIST classes, fine-tunes on the others.
FASHION_MNIST_HALVES = ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))


def default_config() -> ml_collections.ConfigDict:
    """Returns the dataset config with its defaults (Fashion-MNIST from idx files).

    Fields:
        source: Where examples come from: 'idx' (MNIST-format idx files, read into
            memory), 'folder' (DIR/<split>/<class>/*.jpg|jpeg|png) or 'tfds' (a prepared
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
        preprocessing: How a crop is resized to the model's resolution:
            'tf_bilinear' (tf.image.resize: bilinear, no antialiasing, float; how the
            published checkpoints were trained and evaluated) or 'pil_antialias' (PIL's
            antialiased bilinear rounded to uint8; what HF's and timm's processors
            compute). Checkpoints the run writes record it (vit_jax/data/pixels.py).
        crop_min_area: Smallest crop area (fraction of the image) of the Inception crop.
        flip: Random horizontal flips in training.
        mixup: Beta(alpha, alpha) mixup within the local batch; 0 turns it off.
        randaugment: None, or (num_layers, magnitude) of big_vision's RandAugment on
            each training image after crop and flip (vit_jax/data/randaugment.py); the
            AugReg settings use (2, 0), (2, 10), (2, 15) and (2, 20).
        label_smoothing: One-hot targets become (1 - s) * onehot + s / num_classes.
        skip_corrupt: Skip images that do not decode (folder source; counted and
            logged) instead of raising an error that names the file.
        cache: Keep decoded images in memory (folder and tfds sources; idx always is).
        decoder: Where images are decoded, cropped and resized: 'host' (this process's
            CPU cores) or 'dali' (NVIDIA DALI: nvJPEG on each local GPU, DALI's CPU
            decoder without one; files only, no RandAugment; vit_jax/data/dali.py).
        threads: Threads that prepare batches ahead of the loop in this process; 0 means
            one per CPU core.
        workers: Grain worker processes that prepare batches (each with one thread);
            0 prepares them in this process, on `threads` threads.
    """
    return ml_collections.ConfigDict(
        {
            "source": "idx",
            "name": "fashion_mnist",
            "data_dir": config_dict.placeholder(str),
            "train_split": "train",
            "test_split": "test",
            "classes": config_dict.placeholder(tuple),
            "examples_per_class": config_dict.placeholder(int),
            "subset_seed": 0,
            "preprocessing": "tf_bilinear",
            "crop_min_area": 0.05,
            "flip": True,
            "mixup": 0.0,
            "randaugment": config_dict.placeholder(tuple),
            "label_smoothing": 0.0,
            "skip_corrupt": False,
            "cache": False,
            "decoder": "host",
            "threads": 0,
            "workers": 0,
        }
    )


def problems(cfg: ml_collections.ConfigDict, prefix: str = "dataset.") -> list[Problem]:
    """Every field of a dataset config that cannot make sense (`vit_jax.base.problems`),
    from the config alone: nothing is read."""
    out: list[Problem] = []
    one_of(out, f"{prefix}source", cfg.source, SOURCES)
    one_of(out, f"{prefix}preprocessing", cfg.preprocessing, pixels.METHODS)
    one_of(out, f"{prefix}decoder", cfg.decoder, DECODERS)
    if cfg.decoder == "dali":
        out.extend(_dali_problems(cfg, prefix))
    if cfg.source == "tfds" and remote_tfds(cfg.data_dir):
        out.append(Problem(f"{prefix}data_dir", cfg.data_dir, REMOTE_TFDS))
    if cfg.source == "folder" and not cfg.data_dir:
        out.append(
            Problem(
                f"{prefix}data_dir",
                cfg.data_dir,
                "source 'folder' needs the folder DIR, with DIR/train/<class>/*.jpg and "
                "DIR/test/<class>/*.jpg",
            )
        )
    for field in ("train_split", "test_split"):
        try:
            splits.check_spec(cfg[field])
        except ValueError as e:
            out.append(Problem(f"{prefix}{field}", cfg[field], str(e)))
    classes = cfg.get("classes")
    if classes is not None:
        ids = list(classes) if isinstance(classes, (tuple, list)) else None
        if not ids or any(not is_int(c) or c < 0 for c in ids) or len(set(ids)) != len(ids):
            out.append(
                Problem(
                    f"{prefix}classes",
                    classes,
                    "expected None (all) or distinct class ids >= 0, e.g. (5, 6, 7, 8, 9)",
                )
            )
    if cfg.get("examples_per_class") is not None:
        integer(out, f"{prefix}examples_per_class", cfg.examples_per_class, 1, " (or None: all)")
    integer(out, f"{prefix}subset_seed", cfg.subset_seed, 0)
    number(out, f"{prefix}crop_min_area", cfg.crop_min_area, 0, 1, low_open=True)
    number(out, f"{prefix}mixup", cfg.mixup, 0, note=" (Beta concentration; 0 turns it off)")
    randaug = cfg.get("randaugment")
    if randaug is not None:
        if not isinstance(randaug, (tuple, list)) or len(randaug) != 2:
            why = "expected None or (num_layers, magnitude), e.g. (2, 15)"
        else:
            try:
                randaugment.check_args(*randaug)
                why = None
            except ValueError as e:
                why = str(e)
        if why:
            out.append(Problem(f"{prefix}randaugment", randaug, why))
    number(out, f"{prefix}label_smoothing", cfg.label_smoothing, 0, 1, high_open=True)
    for field in ("threads", "workers"):
        integer(out, f"{prefix}{field}", cfg[field], 0)
    return out


def _dali_problems(cfg: ml_collections.ConfigDict, prefix: str) -> list[Problem]:
    """What decoder 'dali' does not take: it decodes files, with the tf_bilinear resize."""
    out, host = [], "; or set dataset.decoder=host"
    if cfg.source == "idx" or cfg.cache:
        field, value = ("source", cfg.source) if cfg.source == "idx" else ("cache", cfg.cache)
        why = "decoder 'dali' decodes image files; these images are in memory already" + host
        out.append(Problem(f"{prefix}{field}", value, why))
    if cfg.get("randaugment") is not None:
        why = "RandAugment runs on the host (PIL/NumPy), not in DALI: unset it" + host
        out.append(Problem(f"{prefix}randaugment", cfg.randaugment, why))
    if cfg.preprocessing != "tf_bilinear":
        why = "DALI resizes as tf.image.resize does: set dataset.preprocessing=tf_bilinear" + host
        out.append(Problem(f"{prefix}preprocessing", cfg.preprocessing, why))
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
