"""A JPEG's training crop decoded as big_vision decodes it: only the window.

big_vision's `decode_jpeg_and_inception_crop` (the AugReg recipes) calls
`tf.image.decode_and_crop_jpeg`, which asks libjpeg-turbo for the window alone: its left
edge aligned down to the iMCU, the rows above skipped, nothing below decoded. 4:2:0
upsampling then treats the window's edges as the image's, so its first and last columns
differ from a whole decode sliced afterwards (the original vit_jax's `tf.slice`, the
paper's presets; up to 14 levels). `_crop_decode.c` makes TensorFlow's libjpeg calls, so
the window's pixels are that op's, bit for bit (tests/test_crop_decode.py), and the rows
below the window cost nothing. Built where libjpeg-turbo's headers were at install
(setup.py); `dataset.decode='crop'` refuses to start without it (`MISSING`).

Everything else decodes as `pixels.decode` does, then is sliced, with its errors: another
format, a JPEG that does not reach its end marker (a truncated file; bytes after the
marker are ignored, as by every decoder), one libjpeg finds corrupt or
warns about. An EXIF orientation is applied as there: the upright window is mapped to the
stored image, decoded, then turned upright. TensorFlow ignores EXIF; the window of an
unrotated file is its window.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vit_jax.data import pixels

DECODES = ("full", "crop")  # dataset.decode: a training crop from the whole image, or alone
MISSING = (
    "decoding only the crop window needs vit_jax's native module vit_jax.data._crop_decode, "
    "not built in this install (it needs libjpeg-turbo's headers): apt-get install "
    "libjpeg62-turbo-dev (dnf install libjpeg-turbo-devel), then reinstall vit_jax "
    "(pip install -e . in its checkout); or set dataset.decode='full'"
)


def native():
    """The C decoder, or None where it was not built (no libjpeg headers at install)."""
    try:
        import vit_jax.data._crop_decode as module  # noqa: PLC0415 -- optional: setup.py
    except ImportError:
        return None
    return module


def _box(window, h: int, w: int) -> pixels.Window:
    """`window` (or what it picks for an h x w image), checked to lie inside."""
    y0, x0, ch, cw = (int(v) for v in (window(h, w) if callable(window) else window))
    if min(y0, x0) < 0 or min(ch, cw) <= 0 or y0 + ch > h or x0 + cw > w:
        raise ValueError(f"crop window {(y0, x0, ch, cw)} is not inside the {h}x{w} image")
    return y0, x0, ch, cw


def _stored(box: pixels.Window, turn: int, h: int, w: int) -> pixels.Window:
    """The upright image's window in the stored h x w image: EXIF orientations 5-8 store it
    transposed, and each but 1 and 5 flips rows or columns (pixels.UPRIGHT)."""
    y0, x0, ch, cw = box
    rows, cols = (w, h) if turn >= 5 else (h, w)  # the upright image's size
    y0 = rows - y0 - ch if turn in (3, 4, 7, 8) else y0
    x0 = cols - x0 - cw if turn in (2, 3, 6, 7) else x0
    return (x0, y0, cw, ch) if turn >= 5 else (y0, x0, ch, cw)


def _whole(data: bytes) -> bool:
    """Whether a JPEG's segments and scans run whole to its end marker (EOI): a truncated
    file's do not. Bytes after the marker are allowed, as every decoder ignores them (a
    motion photo appends its video), so the end marker is found by walking the markers."""
    i = 2
    while i + 2 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xD9:
            return True
        if marker == 0xFF or 0xD0 <= marker <= 0xD7:  # a fill byte; a restart marker
            i += 1 if marker == 0xFF else 2
            continue
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xDA:  # a scan: its entropy-coded data runs to the next marker
            i = _next_marker(data, i)
    return False


def _next_marker(data: bytes, i: int) -> int:
    """Where the first marker from `i` starts (len(data) if none): in entropy-coded data
    0xFF is followed by a stuffed 0 or a restart marker, which are not the end."""
    while (i := data.find(b"\xff", i)) >= 0 and i + 1 < len(data):
        if data[i + 1] != 0 and not 0xD0 <= data[i + 1] <= 0xD7:
            return i
        i += 2
    return len(data)


def _header(data: bytes) -> tuple[int, int, int] | None:
    """(height, width, EXIF orientation) of a whole JPEG; None for anything else (a
    truncated JPEG lacks its end marker)."""
    if data[:2] != b"\xff\xd8" or (data[-2:] != b"\xff\xd9" and not _whole(data)):
        return None
    import simplejpeg  # noqa: PLC0415 -- loaded with the first JPEG, as in pixels

    try:
        return (*simplejpeg.decode_jpeg_header(data)[:2], pixels.orientation(data))
    except (ValueError, LookupError, RuntimeError):  # pixels.decode names what is wrong
        return None


def decode_crop(
    data: bytes,
    window: pixels.Window | Callable[[int, int], pixels.Window],
    method: str = "tf_bilinear",
) -> np.ndarray:
    """A JPEG's window as `tf.image.decode_and_crop_jpeg` decodes it (channels=3; the DCT of
    `method`: tf_bilinear's integer-fast, as that op's default); other files decoded whole
    by `pixels.decode`, then sliced. The GIL is released while decoding.

    Args:
        data: The file's bytes.
        window: (top, left, height, width) in the upright image, or a function of the
            upright image's (height, width) that returns one (an Inception crop).
        method: One of pixels.METHODS: the JPEG DCT.

    Returns:
        uint8 [height, width, 3].

    Raises:
        ValueError: Data that is not an image (pixels.decode's message), or a window that
            is not inside it.
        RuntimeError: The native module was not built (`MISSING` says how to build it).
    """
    module, fast = native(), pixels.check_method(method) == "tf_bilinear"
    if module is None:
        raise RuntimeError(MISSING)
    header = _header(data)
    if header is not None:
        h, w, turn = header
        turn = turn if turn in pixels.UPRIGHT else 1  # as pixels.decode: 9, 61, ... as stored
        box = _box(window, *((w, h) if turn >= 5 else (h, w)))
        y0, x0, ch, cw = _stored(box, turn, h, w)
        try:
            raw = module.decode(data, y0, x0, ch, cw, fast)
        except ValueError:  # corrupt, or a warning: decoded below, as before, errors and all
            pass
        else:
            crop = np.frombuffer(raw, np.uint8).reshape(ch, cw, 3)
            upright = pixels.UPRIGHT.get(turn)
            return crop if upright is None else np.ascontiguousarray(upright(crop))
    image = pixels.decode(data, method)
    y0, x0, ch, cw = _box(window, *image.shape[:2]) if header is None else box
    return image[y0 : y0 + ch, x0 : x0 + cw]
