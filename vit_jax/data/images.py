"""Reading images for the commands: paths, sizes, RGB conversion, class names.

Every command that takes image files (classify, few-shot on folders, figures) reads
them here, through the input pipeline's own preprocessing (pixels.py): EXIF
orientation, any PIL mode to RGB, resize to the model's resolution by the checkpoint's
preprocessing (its resize, evaluation crop, mean and std: preprocessing.py); or, with
`load_naflex`, each image at its own aspect ratio as NaFlex patches (naflex.py).

Where ``vit_jax/data/imagenet_classes.txt`` came from: line i is the first WordNet
lemma (underscores as spaces) of the i-th ImageNet-1k synset in the order of
tensorflow-datasets' ``imagenet2012`` labels (synset ids sorted, the standard
class index 0..999). The synset -> lemma mapping is
``timm/data/_info/imagenet_synset_to_lemma.txt`` from the PyPI package timm
1.0.31 (Apache-2.0); its ``imagenet_synsets.txt`` lists the same 1000 synsets in
the same order as tfds. The two names that are shared by two classes were made
unique by hand: 134 ``crane (bird)``, 517 ``crane (machine)``, and 639 ``tank
suit`` (the second lemma of that synset; 638 stays ``maillot``).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vit_jax.base import store
from vit_jax.data import naflex, pixels

IMAGENET_CLASSES_FILE = "imagenet_classes.txt"


def parse_image_size(value: int | str | Sequence[int] | None) -> tuple[int, int] | None:
    """Turns ``384``, ``"384"``, ``"384,512"`` or ``(384, 512)`` into ``(H, W)``.

    Args:
      value: A side length, ``"H,W"`` / ``"HxW"``, a pair, or None.

    Returns:
      ``(H, W)``, or None when ``value`` is None or empty.

    Raises:
      ValueError: If the value is not one or two positive integers.
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            sizes = [int(p) for p in value.replace("x", ",").split(",")]
        except ValueError:
            raise ValueError(f"image size {value!r} is not N or H,W") from None
    elif isinstance(value, (int, np.integer)):
        sizes = [int(value)]
    else:
        sizes = [int(v) for v in value]
    if len(sizes) == 1:
        sizes = sizes * 2
    if len(sizes) != 2 or min(sizes) <= 0:
        raise ValueError(f"image size {value!r} must be one or two positive integers")
    return sizes[0], sizes[1]


def load_image(path: str, image_size: tuple[int, int], method: str) -> np.ndarray:
    """Reads one image file as the model's input, as the input pipeline's evaluation does.

    `pixels.decode` (EXIF orientation, any mode to RGB, alpha dropped), `pixels.fit` (the
    whole image resized to ``image_size``, the aspect ratio not kept, unless `method`
    names a crop), then `pixels.normalize` by its mean and std.

    Args:
      path: Image file in any format PIL reads.
      image_size: ``(H, W)`` of the result.
      method: A checkpoint's `preprocessing` string (preprocessing.py).

    Returns:
      ``[H, W, 3]`` float32 array (in ``[-1, 1]`` for mean and std 0.5).

    Raises:
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If ``path`` is not a readable image.
    """

    def read(source: Any) -> np.ndarray:
        fitted = pixels.fit(pixels.decode(source, method), image_size, method)
        return pixels.normalize(fitted, method=method)

    return _read(path, read)


def _read(path: str, decode: Callable[[Any], np.ndarray]) -> np.ndarray:
    """`decode(path or its bytes)`, a remote file read first; its errors name the file."""
    source = store.path(path).read_bytes() if store.is_remote(path) else path
    try:
        return decode(source)
    except ValueError as e:
        raise ValueError(f"cannot read image {path}: {e}") from None


def load_images(paths: Sequence[str], image_size: tuple[int, int], method: str) -> np.ndarray:
    """Reads image files as one batch (see `load_image`).

    Args:
      paths: Image files.
      image_size: ``(H, W)`` every image is resized to.
      method: A checkpoint's `preprocessing` string.

    Returns:
      ``[N, H, W, 3]`` float32 array, N = ``len(paths)``.

    Raises:
      FileNotFoundError: If a file does not exist (the message names it).
      ValueError: If a file is not a readable image (the message names it).
    """
    images = np.zeros((len(paths), *image_size, 3), np.float32)
    for i, path in enumerate(paths):
        images[i] = load_image(path, image_size, method)
    return images


def load_naflex(
    paths: Sequence[str], patch_size: int, seq_len: int, method: str
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Reads image files as one NaFlex batch, each at its own aspect ratio (naflex.put: the
    largest size whose grid of `patch_size` patches fits `seq_len`, antialiased).

    Args:
      paths: Image files, decoded as `load_image` does.
      patch_size: The model's patch side in pixels.
      seq_len: Patches a row.
      method: The checkpoint's preprocessing: with NaFlex its JPEG decode, mean and std.

    Returns:
      (the batch {'patches' [N, seq_len, P*P*3], 'coords' [N, seq_len, 2], 'valid'
      [N, seq_len]}, each image's grid (rows, columns) [N, 2]).
    """
    batch = naflex.empty(len(paths), seq_len, patch_size)
    grids = np.zeros((len(paths), 2), np.int64)
    for i, path in enumerate(paths):
        image = _read(path, lambda s: pixels.decode(s, method))
        grids[i] = naflex.put(batch, i, image, patch_size, method=method)
    return batch, grids


def check_images_exist(paths: Sequence[str]) -> None:
    """Fails early, before a checkpoint is loaded, on image paths that are not files.

    Raises:
      ValueError: If ``paths`` is empty.
      FileNotFoundError: Naming the missing files.
    """
    if not paths:
        raise ValueError("no images given: pass paths=[PATH, ...]")
    missing = [p for p in paths if not store.path(p).is_file()]
    if missing:
        raise FileNotFoundError("image not found: " + ", ".join(missing))


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names, index i on line i (see the module doc)."""
    here = importlib.resources.files("vit_jax.data")
    return here.joinpath(IMAGENET_CLASSES_FILE).read_text("utf-8").splitlines()


def class_names(
    num_classes: int, labels_file: str | None = None, stored: Sequence[str] | None = None
) -> list[str]:
    """Names for the classes of a head with ``num_classes`` outputs.

    Args:
      num_classes: Width of the classification head.
      labels_file: Optional text file with one class name a line (trailing
        blank lines are ignored).
      stored: The names the checkpoint itself holds, if any.

    Returns:
      The labels file's lines if given; else `stored`; else the ImageNet-1k names
      for 1000 classes; else ``["class 0", "class 1", ...]``.

    Raises:
      ValueError: If the labels file's line count differs from ``num_classes``.
      FileNotFoundError: If the labels file does not exist.
    """
    if labels_file:
        try:
            text = store.path(labels_file).read_text(encoding="utf-8")
            names = [line.strip() for line in text.rstrip().splitlines()]
        except FileNotFoundError:
            raise FileNotFoundError(f"labels file not found: {labels_file}") from None
        if len(names) != num_classes:
            raise ValueError(
                f"labels file {labels_file} has {len(names)} lines but the model has "
                f"{num_classes} classes"
            )
        return names
    if stored is not None:
        return list(stored)
    if num_classes == 1000:
        return imagenet_class_names()
    return [f"class {i}" for i in range(num_classes)]
