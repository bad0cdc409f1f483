"""Classify images with a ViT checkpoint and print the top-k classes.

    python -m vit_jax.infer --model=ViT-B_16 --checkpoint=ViT-B_16.npz \\
        --image=cat.jpg --image=dog.png [--image_size=384] [--labels=FILE] \\
        [--top_k=5] [--batch_size=32]

The number of classes is read from the checkpoint's head. With 1000 classes the
names are the ImageNet-1k ones shipped in ``vit_jax/imagenet_classes.txt``; any
other head needs ``--labels`` (one name a line) or is printed as ``class i``.
Without ``--image_size`` the images are resized to the resolution the
checkpoint's position embeddings were made for.

Where ``vit_jax/imagenet_classes.txt`` came from: line i is the first WordNet
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
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from PIL import Image, ImageOps, UnidentifiedImageError

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
        parts = value.replace("x", ",").split(",")
        try:
            sizes = [int(p) for p in parts]
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


def _to_rgb(image: Image.Image) -> Image.Image:
    """Converts any PIL mode to RGB; transparency is composited on white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (
        image.mode in ("P", "L", "RGB") and "transparency" in image.info
    ):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        # 16-bit (or 32-bit int) grayscale: scale 0..65535 onto 0..255.
        array = np.asarray(image, dtype=np.float64) / 257.0
        return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8)).convert("RGB")
    if image.mode == "F":
        array = np.asarray(image, dtype=np.float64)
        if array.size and array.max() <= 1.0:
            array = array * 255.0
        return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8)).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV.


def load_image(path: str, image_size: tuple[int, int]) -> np.ndarray:
    """Reads one image file as the model's input.

    The image is turned upright by its EXIF orientation, converted to RGB
    (grayscale, palette, CMYK, 16-bit; transparent pixels over white), resized
    to ``image_size`` with bilinear interpolation (no crop, so the aspect ratio
    is not kept) and scaled as ``(x - 127.5) / 127.5``.

    Args:
      path: Image file in any format PIL reads.
      image_size: ``(H, W)`` of the result.

    Returns:
      ``[H, W, 3]`` float32 array in ``[-1, 1]``.

    Raises:
      FileNotFoundError: If ``path`` does not exist.
      ValueError: If ``path`` is not a readable image.
    """
    height, width = image_size
    try:
        with Image.open(path) as image:
            image.load()
            image = ImageOps.exif_transpose(image)
            image = _to_rgb(image)
            image = image.resize((width, height), Image.Resampling.BILINEAR)
            array = np.asarray(image, dtype=np.float32)
    except FileNotFoundError:
        raise FileNotFoundError(f"image not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"cannot read image {path}: it is a directory") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot read image {path}: {e}") from None
    return (array - 127.5) / 127.5


def load_images(paths: Sequence[str], image_size: tuple[int, int]) -> np.ndarray:
    """Reads image files as one batch (see `load_image`).

    Args:
      paths: Image files.
      image_size: ``(H, W)`` every image is resized to.

    Returns:
      ``[N, H, W, 3]`` float32 array in ``[-1, 1]``, N = ``len(paths)``.

    Raises:
      FileNotFoundError: If a file does not exist (the message names it).
      ValueError: If a file is not a readable image (the message names it).
    """
    height, width = image_size
    images = np.zeros((len(paths), height, width, 3), np.float32)
    for i, path in enumerate(paths):
        images[i] = load_image(path, (height, width))
    return images


def check_images_exist(paths: Sequence[str]) -> None:
    """Fails early, before a checkpoint is loaded, on image paths that are not files.

    Raises:
      ValueError: If ``paths`` is empty.
      FileNotFoundError: Naming the missing files.
    """
    if not paths:
        raise ValueError("no images given: pass --image=PATH (repeat for more)")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError("image not found: " + ", ".join(missing))


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names, index i on line i (see the module doc)."""
    text = importlib.resources.files("vit_jax").joinpath(IMAGENET_CLASSES_FILE).read_text("utf-8")
    return text.splitlines()


def class_names(num_classes: int, labels_file: str | None = None) -> list[str]:
    """Names for the classes of a head with ``num_classes`` outputs.

    Args:
      num_classes: Width of the classification head.
      labels_file: Optional text file with one class name a line (trailing
        blank lines are ignored).

    Returns:
      The labels file's lines if given; else the ImageNet-1k names for 1000
      classes; else ``["class 0", "class 1", ...]``.

    Raises:
      ValueError: If the labels file's line count differs from ``num_classes``.
      FileNotFoundError: If the labels file does not exist.
    """
    if labels_file:
        try:
            with open(labels_file, encoding="utf-8") as f:
                names = [line.strip() for line in f.read().rstrip().splitlines()]
        except FileNotFoundError:
            raise FileNotFoundError(f"labels file not found: {labels_file}") from None
        if len(names) != num_classes:
            raise ValueError(
                f"labels file {labels_file} has {len(names)} lines but the model has "
                f"{num_classes} classes"
            )
        return names
    if num_classes == 1000:
        return imagenet_class_names()
    return [f"class {i}" for i in range(num_classes)]


def predict(model: Any, params: Any, images: np.ndarray, batch_size: int = 32) -> np.ndarray:
    """Class probabilities (softmax of the logits) for a stack of images.

    The images go through one jitted ``model.apply`` in batches of
    ``min(batch_size, N)``; the last partial batch is padded to that shape (so
    it compiles once) and the padding is dropped.

    Args:
      model: Flax module whose ``apply({'params': params}, x, train=False)``
        gives logits ``[B, K]``.
      params: The model's parameters.
      images: ``[N, H, W, 3]`` float32 in ``[-1, 1]``.
      batch_size: Most images per forward pass.

    Returns:
      ``[N, K]`` float32 probabilities; each row sums to 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    images = np.asarray(images, np.float32)
    n = images.shape[0]
    if n == 0:
        raise ValueError("no images to classify")
    batch = min(batch_size, n)

    @jax.jit
    def probabilities(p: Any, x: jax.Array) -> jax.Array:
        logits = model.apply({"params": p}, x, train=False)
        return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

    outputs = []
    for start in range(0, n, batch):
        chunk = images[start : start + batch]
        valid = chunk.shape[0]
        if valid < batch:
            pad = np.zeros((batch - valid,) + chunk.shape[1:], chunk.dtype)
            chunk = np.concatenate([chunk, pad])
        outputs.append(np.asarray(probabilities(params, chunk))[:valid])
    return np.concatenate(outputs).astype(np.float32)


def top_k(probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most probable classes of each row, most probable first.

    Args:
      probs: ``[N, K]`` probabilities (or any scores).
      k: How many classes; more than K gives K. Ties go to the lower index.

    Returns:
      ``(indices, values)``, both ``[N, min(k, K)]``.
    """
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    probs = np.asarray(probs)
    k = min(k, probs.shape[-1])
    indices = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return indices, np.take_along_axis(probs, indices, axis=-1)


def format_predictions(
    paths: Sequence[str], indices: np.ndarray, values: np.ndarray, names: Sequence[str]
) -> str:
    """One block per image: its path, then one line per class, e.g.

    ::

      cat.jpg
         1. tabby                       81.23%  (class 281)
         2. tiger cat                   10.02%  (class 282)
    """
    width = max((len(names[i]) for i in np.ravel(indices)), default=0)
    blocks = []
    for path, row_idx, row_val in zip(paths, indices, values, strict=True):
        lines = [str(path)]
        for rank, (i, p) in enumerate(zip(row_idx, row_val, strict=True), start=1):
            lines.append(f"  {rank:2d}. {names[i]:<{width}}  {100 * p:6.2f}%  (class {i})")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def run(
    model_name: str,
    checkpoint_path: str,
    image_paths: Sequence[str],
    image_size: int | str | Sequence[int] | None = None,
    labels_file: str | None = None,
    k: int = 5,
    batch_size: int = 32,
    out: TextIO | None = None,
) -> list[list[tuple[str, float]]]:
    """Loads a checkpoint, classifies the images and prints the top-k of each.

    Args:
      model_name: Variant for `vit_jax.models.get_model` (e.g. ``ViT-B_16``); the
        head width, pooling and representation layer come from the checkpoint.
      checkpoint_path: ``.npz`` checkpoint in the published layout.
      image_paths: Image files.
      image_size: Input resolution (``N`` or ``(H, W)``); None: the one the
        checkpoint's position embeddings were made for.
      labels_file: Optional class names, one a line.
      k: Classes shown per image.
      batch_size: Images per forward pass.
      out: Where to print; None: stdout.

    Returns:
      For each image, its top-k ``(class name, probability)`` pairs.
    """
    check_images_exist(image_paths)

    from vit_jax import checkpoint

    params = checkpoint.load_npz(checkpoint_path)
    names = class_names(checkpoint.num_classes(params), labels_file)
    # get_model(model_name, num_classes=K) plus what the file implies (a pre_logits
    # representation layer, gap pooling), so e.g. ImageNet-21k files keep pre_logits.
    model = checkpoint.make_model_for(params, model_name)
    size = parse_image_size(image_size) or tuple(checkpoint.native_image_size(params, model))
    images = load_images(image_paths, size)
    # As load_pretrained(checkpoint_path, model, size, reset_head=False), without re-reading.
    params = checkpoint.adapt(params, model, size, reset_head=False, source=str(checkpoint_path))
    probs = predict(model, params, images, batch_size)
    indices, values = top_k(probs, k)
    print(format_predictions(image_paths, indices, values, names), file=out or sys.stdout)
    return [
        [(names[i], float(p)) for i, p in zip(row_idx, row_val, strict=True)]
        for row_idx, row_val in zip(indices, values, strict=True)
    ]


def define_flags() -> None:
    """Defines the command's flags (only when run as a command, so importing
    this module never clashes with other modules' flags)."""
    flags.DEFINE_string("model", "ViT-B_16", "Model variant, e.g. ViT-B_16, R50+ViT-B_16, B/16.")
    flags.DEFINE_string("checkpoint", None, "Checkpoint .npz (published layout).", required=True)
    flags.DEFINE_multi_string("image", None, "Image file; repeat for more.", required=True)
    flags.DEFINE_string(
        "image_size", None, "Input resolution N or H,W; default: the checkpoint's own."
    )
    flags.DEFINE_string("labels", None, "Class names, one a line (default: ImageNet for 1000).")
    flags.DEFINE_integer("top_k", 5, "Classes printed per image.", lower_bound=1)
    flags.DEFINE_integer("batch_size", 32, "Images per forward pass.", lower_bound=1)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    try:
        run(f.model, f.checkpoint, f.image, f.image_size, f.labels, f.top_k, f.batch_size)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
