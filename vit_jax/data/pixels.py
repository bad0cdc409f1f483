"""The one image preprocessing of the package: decode, resize, [-1, 1].

Training, evaluation, few-shot, `infer`, `evaluate` and the figures all read pixels
through these functions, so one image file gives the same model input everywhere:

  decode     file or bytes -> uint8 [h, w, 3]: EXIF orientation applied, any PIL mode
             to RGB (alpha dropped, 16-bit scaled to 8).
  resize     uint8 [h, w, c] -> uint8 [H, W, c]: PIL's bilinear filter, antialiased
             when shrinking (the filter widens with the scale), rounded to uint8 -- what
             PIL-based pipelines (HF's ViTImageProcessor, timm) compute.
  normalize  uint8 [..., c] -> float32 [..., 3] in [-1, 1]: (x - 127.5) / 127.5, gray
             channels repeated.

PIL releases the GIL while it decodes and resizes, so threads run these in parallel.
"""

from __future__ import annotations

import functools
import io
import os

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# What PIL raises for a file that is not a readable image.
DECODE_ERRORS = (
    UnidentifiedImageError,
    OSError,
    SyntaxError,
    ValueError,
    Image.DecompressionBombError,
)


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB, as PIL's `convert('RGB')`: the alpha channel (and a palette's
    transparency) is dropped, the colour under it kept. That is what the pipelines the
    checkpoints meet elsewhere do to a file: TensorFlow's decode_png(channels=3), timm's
    loader, and transformers' `pipeline(...)(path)` (its load_image). 16-bit and float
    images are scaled to 8 bits (convert('RGB') would clip them to white)."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        array = np.asarray(image, dtype=np.float64) / 257.0  # 0..65535 onto 0..255
        return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8)).convert("RGB")
    if image.mode == "F":
        array = np.asarray(image, dtype=np.float64)
        if array.size and array.max() <= 1.0:
            array = array * 255.0
        return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8)).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def decode(source: str | os.PathLike | bytes) -> np.ndarray:
    """An image file (path) or its bytes -> uint8 [h, w, 3], upright and RGB.

    Raises:
        FileNotFoundError: The path does not exist.
        ValueError: The data is not an image PIL can read (the message says why).
    """
    where = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    try:
        with Image.open(where) as image:
            image.load()
            image = to_rgb(ImageOps.exif_transpose(image))
            return np.asarray(image, dtype=np.uint8)
    except FileNotFoundError:
        raise FileNotFoundError(f"image not found: {source}") from None
    except IsADirectoryError:
        raise ValueError("it is a directory, not an image") from None
    except DECODE_ERRORS as e:
        raise ValueError(str(e) or type(e).__name__) from None


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """PIL bilinear resize.  uint8 [h, w, c] (c = 1 or 3) -> uint8 [H, W, c]

    The same size returns the image unchanged (a copy).
    """
    h, w, c = image.shape
    if (h, w) == tuple(size):
        return image.copy()
    pil = Image.fromarray(image[..., 0] if c == 1 else image)
    out = np.asarray(pil.resize((size[1], size[0]), Image.Resampling.BILINEAR))
    return out[..., None] if c == 1 else out


def normalize(images: np.ndarray) -> np.ndarray:
    """uint8 [..., c] (c = 1 or 3) -> float32 [..., 3] in [-1, 1]."""
    x = (images.astype(np.float32) - 127.5) / 127.5
    return np.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x


# ---- PIL's bilinear resize for batches of same-size images, in NumPy ---------------
# Pillow's Resample.c, 8 bits per channel: per output pixel, filter taps over the
# input (support 1, widened by the scale when shrinking) normalised to sum 1 and stored
# as fixed-point ints with 22 fractional bits; a horizontal pass rounded to uint8, then
# a vertical pass. Reproduced here exactly (integer sums, exact in float64 matmuls), so
# resize_batch equals `resize` on each image, bit for bit (tests/test_data.py holds it
# to PIL), at a fraction of PIL's per-call cost for small images.
_PRECISION_BITS = 22


@functools.lru_cache(maxsize=65536)
def _pil_coefficients(length: int, out: int) -> np.ndarray:
    """Fixed-point weights that resize an axis of `length` pixels to `out`.  # [out, length]"""
    scale = length / out
    filterscale = max(scale, 1.0)
    support = filterscale  # the bilinear filter's support is 1
    weights = np.zeros([out, length], np.float64)
    for o in range(out):
        center = (o + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), length)
        taps = [max(0.0, 1.0 - abs((x - center + 0.5) / filterscale)) for x in range(lo, hi)]
        total = 0.0
        for w in taps:  # summed in Pillow's order
            total += w
        for j, w in enumerate(taps):
            k = w / total if total != 0.0 else w
            weights[o, lo + j] = int((0.5 if k >= 0 else -0.5) + k * (1 << _PRECISION_BITS))
    return weights


def _round(s: np.ndarray) -> np.ndarray:
    """Fixed-point sums -> uint8 values (as float64), rounded and clipped as Pillow does:
    (s + 2^21) >> 22, capped at 255 (the weights are positive: no negative sums)."""
    s += 1 << (_PRECISION_BITS - 1)
    s *= 1.0 / (1 << _PRECISION_BITS)  # a power of two: exact
    np.floor(s, out=s)
    return np.minimum(s, 255.0, out=s)


@functools.lru_cache(maxsize=1024)
def _weight_table(length: int, out: int) -> np.ndarray:
    """Weights of every crop length 0..length of an axis, left-aligned.  # [length + 1, out, length]

    Row n resizes a crop of n pixels to `out` (Pillow's coefficients), or copies it
    (fixed-point identity) when n == out, as Pillow skips that pass.
    """
    table = np.zeros([length + 1, out, length])
    for n in range(1, length + 1):
        weights = np.eye(n) * (1 << _PRECISION_BITS) if n == out else _pil_coefficients(n, out)
        table[n, :, :n] = weights
    return table


def _weights(starts: np.ndarray, lengths: np.ndarray, length: int, out: int) -> np.ndarray:
    """Per-example weights for the crops [start, start + n) of an axis.  # [b, out, length]"""
    left = _weight_table(length, out)[lengths]  # [b, out, length], crop at 0
    source = np.arange(length)[None] - starts[:, None]  # [b, length]: position in the crop
    inside = (source >= 0) & (source < lengths[:, None])
    shifted = np.take_along_axis(left, np.clip(source, 0, length - 1)[:, None], axis=2)
    return shifted * inside[:, None]


def _horizontal(x: np.ndarray, wx: np.ndarray) -> np.ndarray:
    """[b, c, h, w], weights [b, W, w] -> [b, c, h, W]"""
    return _round(x @ wx[:, None].transpose(0, 1, 3, 2))


def _vertical(x: np.ndarray, wy: np.ndarray) -> np.ndarray:
    """[b, c, h, w], weights [b, H, h] -> [b, c, H, w]"""
    return _round(wy[:, None] @ x)


def _order(ch: int, cw: int, size: tuple[int, int]) -> str:
    """Which pass Pillow runs first for a crop of ch x cw: 'hv', 'vh', or '' (unknown).

    Pillow 13 picks the order by a rule its Python side does not show; measured on 5000
    random sizes (tests/test_data.py keeps checking): a growing height always goes
    horizontal-first, a shrinking height with a growing width vertical-first; where both
    shrink, the order varies, and those crops are resized by PIL itself.
    """
    out_h, out_w = size
    if ch == out_h or cw == out_w or ch < out_h:
        return "hv"
    return "vh" if cw < out_w else ""


def resize_batch(images: np.ndarray, boxes: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Crops and resizes each image exactly as `resize(image[y0:y0+h, x0:x0+w], size)`.

    Args:
        images: Same-size images.  # uint8 [b, h, w, c]
        boxes: Crop of each image: (y0, x0, height, width).  # int [b, 4]
        size: (H, W) of the results.

    Returns:
        uint8 [b, H, W, c].
    """
    b, h, w, c = images.shape
    out_h, out_w = size
    boxes = np.asarray(boxes, np.int64).reshape(b, 4)
    wy = _weights(boxes[:, 0], boxes[:, 2], h, out_h)  # [b, H, h]
    wx = _weights(boxes[:, 1], boxes[:, 3], w, out_w)  # [b, W, w]
    orders = np.asarray([_order(ch, cw, size) for ch, cw in boxes[:, 2:].tolist()])
    out = np.empty([b, out_h, out_w, c], np.uint8)
    x = images.transpose(0, 3, 1, 2).astype(np.float64)  # [b, c, h, w]: BLAS matmuls
    hv, vh = orders == "hv", orders == "vh"
    if hv.any():
        y = _vertical(_horizontal(x[hv], wx[hv]), wy[hv])  # rounded to uint8 in between
        out[hv] = y.transpose(0, 2, 3, 1)
    if vh.any():
        y = _horizontal(_vertical(x[vh], wy[vh]), wx[vh])
        out[vh] = y.transpose(0, 2, 3, 1)
    for i in np.flatnonzero(orders == ""):
        y0, x0, ch, cw = (int(v) for v in boxes[i])
        out[i] = resize(images[i, y0 : y0 + ch, x0 : x0 + cw], size)
    return out
