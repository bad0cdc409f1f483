"""The one image preprocessing of the package: decode, crop, resize, normalise.

Training, evaluation, few-shot, `infer`, `evaluate` and the figures all read pixels
here, so one image file gives the same model input everywhere. A checkpoint's
preprocessing is one string (preprocessing.py: the resize, mean and std, the evaluation
crop); the resize methods:

  tf_bilinear    what the published checkpoints were trained and evaluated on (the
                 original vit_jax and big_vision input pipelines): JPEGs decoded as
                 `tf.io.decode_jpeg` does (libjpeg's integer-fast DCT), then
                 `tf.image.resize(x, size)`: bilinear at half-pixel centres, no
                 antialiasing, float output. OpenCV's INTER_LINEAR on float32 computes
                 the same formula (within 1e-5 of 255).
  pil_antialias  what HF's ViTImageProcessor (PIL backend) and timm compute: JPEGs decoded
                 as PIL does (the accurate integer DCT), then PIL's bilinear filter,
                 antialiased when shrinking (the filter widens with the scale), rounded
                 to uint8.
  pil_bicubic    the same with PIL's bicubic filter (timm's and transformers').

  decode     file or bytes -> uint8 [h, w, 3]: EXIF orientation applied, any PIL mode to
             RGB (alpha dropped, 16-bit scaled to 8). JPEGs in RGB or gray are decoded by
             simplejpeg (libjpeg-turbo, as PIL and TensorFlow: the same pixels for the
             same DCT, tests/test_pixels.py holds both); every other file and mode goes
             through PIL.
  fit        evaluation's resize to the model's size, by the string's crop and mode.
  normalize  [..., c] in [0, 255] -> float32 [..., 3] by mean and std, gray repeated.

Measured (BENCHMARKS.md, "Decoders"): none of the pip-installable decoders that bundle
their native code decodes a JPEG crop window faster than simplejpeg decodes the whole
file, and DCT-scaled decoding changes the pixels of both methods, so the whole file is
decoded and the window is a view (crop_decode.py decodes a training window alone, with
a native module of its own, where a config asks: the AugReg presets). PIL, simplejpeg and
OpenCV release the GIL: threads run all of this in parallel.
"""

from __future__ import annotations

import functools
import io
import math
import os

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# METHODS and PUBLISHED are read as pixels' too.
from vit_jax.data.preprocessing import HALF, METHODS, PUBLISHED, Preprocessing  # noqa: F401

# What PIL raises for a file that is not a readable image.
# (UnidentifiedImageError is an OSError.)
DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


@functools.cache
def cv2():
    """OpenCV, imported where first used (a config import need not load it)."""
    import cv2 as module  # noqa: PLC0415

    module.setNumThreads(1)  # the pipeline's own threads run images in parallel
    return module


Window = tuple[int, int, int, int]  # (y0, x0, height, width)


def check_method(method: str) -> str:
    """The resize (one of preprocessing.RESIZES) of the preprocessing string `method`; a
    ValueError naming the bad part otherwise."""
    return Preprocessing.parse(method).resize


def dtype_of(method: str) -> type:
    """The type of `method`'s resized pixels: float32 (tf_bilinear) or uint8 (PIL's)."""
    return np.float32 if check_method(method) == "tf_bilinear" else np.uint8


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB, as PIL's `convert('RGB')`: the alpha channel (and a palette's
    transparency) is dropped, the colour under it kept. That is what the pipelines the
    checkpoints meet elsewhere do to a file: TensorFlow's decode_png(channels=3), timm's
    loader, and transformers' `pipeline(...)(path)` (its load_image). 16-bit and float
    images are scaled to 8 bits (convert('RGB') would clip them to white)."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        array = np.asarray(image, dtype=np.float64)
        if image.mode != "F":
            array = array / 257.0  # 0..65535 onto 0..255
        elif array.size and array.max() <= 1.0:
            array = array * 255.0
        return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8)).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


# EXIF orientation -> the array operation that makes the image upright (as PIL's
# ImageOps.exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 270,
# 7 transverse, 8 rotate 90 counter-clockwise).
UPRIGHT = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: np.rot90(a, 1),
}


def orientation(data: bytes) -> int:
    """The EXIF orientation of a JPEG (1 without one): the first APP1 Exif segment's IFD0
    tag 0x0112, as PIL's getexif reads it, without opening the image (a tenth of the
    decode's time, in PIL)."""
    i = 2
    while data[i] == 0xFF:
        while data[i + 1] == 0xFF:  # fill bytes before a marker
            i += 1
        if data[i + 1] in (0xDA, 0xD9):  # the image data: no EXIF after it
            break
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if data[i + 1] == 0xE1 and data[i + 4 : i + 10] == b"Exif\0\0":
            tiff = data[i + 10 : i + 2 + length]
            order = "little" if tiff[:2] == b"II" else "big"
            ifd = int.from_bytes(tiff[4:8], order)
            for k in range(int.from_bytes(tiff[ifd : ifd + 2], order)):
                entry = tiff[ifd + 2 + 12 * k : ifd + 14 + 12 * k]
                if int.from_bytes(entry[:2], order) == 0x0112:
                    return int.from_bytes(entry[8:10], order)
            return 1
        i += 2 + length
    return 1


def _jpeg(data: bytes, method: str) -> np.ndarray | None:
    """A JPEG that PIL reads as RGB or L, decoded by simplejpeg with the method's DCT
    and made upright (uint8 [h, w, 3]); None for anything else (PIL's path)."""
    if data[:2] != b"\xff\xd8":
        return None
    import simplejpeg  # noqa: PLC0415 -- loaded with the first JPEG

    try:
        colorspace = simplejpeg.decode_jpeg_header(data)[2]
        if colorspace not in ("Gray", "YCbCr", "RGB"):  # CMYK, YCCK: PIL's conversion
            return None
        gray = colorspace == "Gray"
        turn = orientation(data)
        out = simplejpeg.decode_jpeg(
            data, colorspace="GRAY" if gray else "RGB", fastdct=method == "tf_bilinear"
        )
    except (ValueError, LookupError, RuntimeError):  # PIL's path (simplejpeg's KeyError too)
        return None
    out = np.repeat(out, 3, -1) if gray else out
    upright = UPRIGHT.get(turn)
    return out if upright is None else np.ascontiguousarray(upright(out))


def decode(source: str | os.PathLike | bytes, method: str = "pil_antialias") -> np.ndarray:
    """An image file (path) or its bytes -> uint8 [h, w, 3], upright and RGB; a JPEG
    decoded as `method`'s pipeline decodes it (tf_bilinear: TensorFlow's integer-fast
    DCT; pil_antialias: PIL's accurate one).

    Raises:
        FileNotFoundError: The path does not exist.
        ValueError: The data is not an image PIL can read (the message says why).
    """
    if not isinstance(source, (bytes, bytearray)):
        try:
            with open(source, "rb") as f:
                source = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"image not found: {source}") from None
        except IsADirectoryError:
            raise ValueError("it is a directory, not an image") from None
    fast = _jpeg(source, check_method(method))
    if fast is not None:
        return fast
    try:
        with Image.open(io.BytesIO(source)) as image:
            image.load()
            image = to_rgb(ImageOps.exif_transpose(image))
            return np.asarray(image, dtype=np.uint8)
    except UnidentifiedImageError:  # its words name Pillow's in-memory file
        raise ValueError("not an image file that Pillow reads (JPEG, PNG, ...)") from None
    except DECODE_ERRORS as e:
        raise ValueError(str(e) or type(e).__name__) from None


def resize(
    image: np.ndarray,
    size: tuple[int, int],
    method: str,
    window: Window | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Crops `window` (the whole image if None) and resizes it to `size` (H, W).

    uint8 [h, w, c] (c = 1 or 3) -> [H, W, c]: float32 in [0, 255] (tf_bilinear) or uint8
    (pil_antialias), written into `out` (of that shape and type) when given: a batch's
    slot, without another copy.
    """
    h, w, c = image.shape
    method = check_method(method)
    y0, x0, ch, cw = (0, 0, h, w) if window is None else (int(v) for v in window)
    crop = image[y0 : y0 + ch, x0 : x0 + cw]
    target = np.empty([size[0], size[1], c], dtype_of(method)) if out is None else out
    if (ch, cw) == tuple(size):  # either resize of a same-size window is the window
        target[...] = crop
    elif method == "tf_bilinear":
        cv = cv2()
        into = target[..., 0] if c == 1 else target
        got = cv.resize(crop.astype(np.float32), (size[1], size[0]), into, 0, 0, cv.INTER_LINEAR)
        if not np.shares_memory(got, target):  # OpenCV made its own (another layout)
            into[...] = got
    else:  # cropped first: PIL's resize(box=...) lets the filter read past the box's edges
        pil = Image.fromarray(image[..., 0] if c == 1 else image).crop((x0, y0, x0 + cw, y0 + ch))
        kind = Image.Resampling.BICUBIC if method == "pil_bicubic" else Image.Resampling.BILINEAR
        got = np.asarray(pil.resize((size[1], size[0]), kind))
        target[...] = got[..., None] if c == 1 else got
    return target


def mirror(image: np.ndarray) -> np.ndarray:
    """Flips [H, W, c] left to right, in place (no copy of the image)."""
    plane = image[..., 0] if image.shape[-1] == 1 else image  # OpenCV's [H, W] of one channel
    return cv2().flip(plane, 1, plane)


def to_uint8(images: np.ndarray) -> np.ndarray:
    """Resized images as uint8 for the augmentations that work on bytes (RandAugment):
    float values truncated, as big_vision's tf.cast after its resize."""
    return np.clip(images, 0, 255).astype(np.uint8)


def normalize(images: np.ndarray, in_place: bool = False, method: str = PUBLISHED) -> np.ndarray:
    """[..., c] in [0, 255] (c = 1 or 3; uint8 or float) -> float32 [..., 3]: (x / 255 -
    mean) / std of `method` (float32, as torchvision's ToTensor and Normalize), [-1, 1]
    as (x - 127.5) / 127.5 where both are 0.5.

    With `in_place`, float32 RGB images are normalised where they are (no new batch).
    """
    if not (in_place and images.dtype == np.float32 and images.shape[-1] == 3):
        images = images.astype(np.float32)
        images = np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images
    spec = Preprocessing.parse(method)
    if spec.mean == spec.std == HALF:
        images -= 127.5
        images /= 127.5
    else:
        images /= 255
        images -= np.asarray(spec.mean, np.float32)
        images /= np.asarray(spec.std, np.float32)
    return images


def fit(image: np.ndarray, size: tuple[int, int], method: str, out=None) -> np.ndarray:
    """Evaluation's resize (the module's docstring): uint8 [h, w, c] resized by `method`'s
    crop mode to floor(size / crop) and cut to the centre `size`, [H, W, c] of
    `dtype_of(method)` (written into `out` when given). The whole image, resized, where
    crop is 1 and the mode squash."""
    spec = Preprocessing.parse(method)
    if spec.whole:
        return resize(image, size, method, None, out)
    (h, w), mode = image.shape[:2], spec.crop_mode
    scale = [math.floor(n / spec.crop_fraction + 1e-6) for n in size]  # timm's scale_size
    if mode in ("center", "hf_center") and scale[0] == scale[1]:  # torchvision's Resize(n)
        short, long = sorted((h, w))
        big = (scale[0], int(scale[0] * long / short))
        scale = list(big if h <= w else big[::-1])
    elif mode != "squash":  # timm's ResizeKeepRatio: the shorter side (the longer: border)
        ratio = (max if mode == "border" else min)(h / scale[0], w / scale[1])
        scale = [round(h / ratio), round(w / ratio)]
    image = resize(image, scale, method)
    fill = [round(255 * m) for m in spec.mean] if mode == "border" else [0, 0, 0]
    target = np.empty([*size, image.shape[2]], image.dtype) if out is None else out
    target[...] = fill[: image.shape[2]]
    (ys, yt), (xs, xt) = (_span(n, m, mode) for n, m in zip(scale, size, strict=True))
    target[yt, xt] = image[ys, xs]
    return target


def _span(n: int, m: int, mode: str) -> tuple[slice, slice]:
    """(the source's, the target's) rows of a side of n pixels centred in one of m:
    torchvision's offset round(margin / 2) (half to even), transformers' floor."""
    margin = n - m
    if margin < 0:  # padded: torchvision's and transformers' floor(-margin / 2) before
        return slice(0, n), slice(-margin // 2, -margin // 2 + n)
    start = margin // 2 if mode == "hf_center" else round(margin / 2)
    return slice(start, start + m), slice(0, m)


def resize_batch(images: np.ndarray, boxes, size: tuple[int, int], method: str) -> np.ndarray:
    """`resize` of each same-size image [b, h, w, c] with its window (y0, x0, height,
    width) -> [b, H, W, c], float32 (tf_bilinear) or uint8 (pil_antialias)."""
    out = np.empty([len(images), *size, images.shape[-1]], dtype_of(method))
    for i, box in enumerate(np.asarray(boxes).tolist()):
        resize(images[i], size, method, box, out[i])
    return out
