"""Image folders: ``DIR/<split>/<class>/*.jpg|jpeg|png``, class ids by sorted class name.

Corrupt files. tf.data cannot catch a decoding error inside the pipeline, and the
error it raises does not say which file failed. Two paths keep errors nameable:

* skip_corrupt=False, cache=False (default): files are read and decoded lazily in the
  pipeline (a JPEG only inside its training crop window). When a batch fails, the
  iterator re-decodes that batch's files one by one (``find_corrupt``) and raises
  ``CorruptImageError`` naming the file.
* skip_corrupt=True or cache=True: every file is decoded once up front by a parallel
  tf.data pass (``decode_all``) that drops failing files with ``ignore_errors`` and
  reports which were dropped. With skip_corrupt they are left out of the split,
  counted and logged; otherwise the first one is named in a ``CorruptImageError``.
  The pass costs one decode of the split (minutes for ImageNet-sized folders).

Grayscale and RGBA files decode to RGB (``tf.io.decode_image(channels=3)``).
"""

from __future__ import annotations

import os
import re

import numpy as np

from vit_jax.data import preprocess
from vit_jax.data._tf import tf

EXTENSIONS = (".jpg", ".jpeg", ".png")


class CorruptImageError(ValueError):
    """An image file that does not decode."""


def corrupt_error(path: str, detail: str) -> CorruptImageError:
    return CorruptImageError(
        f"image {path} does not decode ({detail}). Replace or delete the file, or set "
        "--config.dataset.skip_corrupt=True to leave unreadable files out (they are counted "
        "and logged)."
    )


def list_classes(split_dir: str) -> list[str]:
    """Sorted class directory names of one split directory."""
    if not os.path.isdir(split_dir):
        raise FileNotFoundError(
            f"image folder split {split_dir} does not exist; expected {split_dir}/<class>/*.jpg "
            "(one directory per class)."
        )
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    if not classes:
        found = sorted(os.listdir(split_dir))[:10]
        raise ValueError(
            f"image folder split {split_dir} has no class directories (found {found}); "
            f"expected {split_dir}/<class>/*.jpg, one directory per class."
        )
    return classes


def check_same_classes(root: str, split_names: list[str]) -> list[str]:
    """Class names shared by all the splits; a ValueError if they differ."""
    found = {name: list_classes(os.path.join(root, name)) for name in split_names}
    first, classes = split_names[0], found[split_names[0]]
    for name in split_names[1:]:
        if found[name] != classes:
            only_first = sorted(set(classes) - set(found[name]))
            only_other = sorted(set(found[name]) - set(classes))
            raise ValueError(
                f"image folder {root}: splits {first!r} and {name!r} have different classes "
                f"(only in {first}: {only_first}; only in {name}: {only_other}). Class ids come "
                "from the sorted class names, so both splits need the same class directories."
            )
    return classes


def scan_split(root: str, name: str, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """File paths (sorted by class, then file name) and class ids of one split.

    Returns:
        (paths str [N], labels int64 [N]).
    """
    paths, labels = [], []
    for label, class_name in enumerate(classes):
        class_dir = os.path.join(root, name, class_name)
        files = sorted(f for f in os.listdir(class_dir) if f.lower().endswith(EXTENSIONS))
        if not files:
            raise ValueError(
                f"class directory {class_dir} has no images (expected *.jpg, *.jpeg or *.png; "
                f"found {sorted(os.listdir(class_dir))[:10]}). Add images or remove the "
                "directory from every split."
            )
        paths += [os.path.join(class_dir, f) for f in files]
        labels += [label] * len(files)
    return np.asarray(paths, dtype=object), np.asarray(labels, np.int64)


def decode(path: tf.Tensor) -> tf.Tensor:
    """Reads and decodes one file.  # uint8 [h, w, 3]"""
    return preprocess.decode(tf.io.read_file(path))


def find_corrupt(paths: list[str]) -> list[tuple[str, str]]:
    """Decodes files one by one in eager mode: [(path, error message)] of those that fail."""
    bad = []
    for path in paths:
        try:
            decode(tf.constant(path))
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
            message = re.sub(r"\{\{[^}]*\}\}|\[Op:.*", "", e.message.splitlines()[0])
            bad.append((path, message.strip()))
    return bad


def decode_all(paths: np.ndarray, keep_images: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    """Decodes every file once with a parallel tf.data pass that drops failures.

    Args:
        paths: Files to decode.  # [N]
        keep_images: Return the decoded images (for the in-memory cache).

    Returns:
        (ok, images): positions of the files that decode, ascending  # [M]
        and, with keep_images, their uint8 images [h, w, 3] (else an empty list).
    """
    ds = tf.data.Dataset.from_tensor_slices((np.arange(len(paths)), paths.astype(str)))

    def load(i, path):
        image = decode(path)
        return i, (image if keep_images else tf.shape(image))  # the shape forces the decode

    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).ignore_errors()
    ok, images = [], []
    for i, image in ds.as_numpy_iterator():
        ok.append(i)
        if keep_images:
            images.append(image)
    return np.asarray(ok, np.int64), images


def image_store(images: list[np.ndarray]):
    """An in-memory random-access loader for images of varying sizes.

    Images are packed into one flat uint8 buffer; the loader slices image i out of it.

    Returns:
        load(index int64 scalar tensor) -> uint8 [h, w, 3].
    """
    shapes = np.asarray([im.shape for im in images], np.int64).reshape(-1, 3)  # [N, 3]
    ends = np.cumsum(np.prod(shapes, axis=1))
    starts = ends - np.prod(shapes, axis=1)
    flat = tf.constant(np.concatenate([im.reshape(-1) for im in images]) if images else [])
    flat = tf.cast(flat, tf.uint8)
    shapes_t, starts_t, ends_t = (tf.constant(a) for a in (shapes, starts, ends))

    def load(index: tf.Tensor) -> tf.Tensor:
        image = flat[starts_t[index] : ends_t[index]]
        return tf.reshape(image, shapes_t[index])

    return load
