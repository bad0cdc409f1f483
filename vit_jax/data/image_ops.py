"""The 16 image ops of RandAugment (randaugment.py), each on one uint8 image [h, w, 3] as
big_vision's TF code computes it (big_vision/pp/autoaugment.py), in NumPy, PIL and OpenCV:

- Fill value 128 (big_vision's `replace`) for pixels that rotate, shear and translate move
  in from outside, and inside the cutout square. Geometry is TF's projective transform
  with nearest neighbour: output pixel (x, y) reads input round(A @ (x, y, 1)), rounding
  half away from zero; rotation about ((w - 1) / 2, (h - 1) / 2); shear not centred.
- Color, Contrast, Brightness and Sharpness are TF's blend: float32, truncated, clipped to
  [0, 255] only when extrapolating. Contrast's grey level is TF's constant
  min(h * w / 256, 255), not the mean grey (the histogram sum / 256 of the original code;
  196 at 224 px). Color's grey is tf.image.rgb_to_grayscale (0.2989, 0.587, 0.114, times
  255.5, truncated). Sharpness smooths with PIL's SMOOTH kernel [1 1 1; 1 5 1; 1 1 1] / 13,
  truncated, borders kept.
- Posterize's shift (8 - bits) is TF's, clamped to [0, 7]; Solarize's threshold wraps to
  uint8 as the TF constant does. Equalize is PIL's.

Sharpness divides the 3x3 sum by 13 exactly, where TF's float32 convolution (an FMA chain)
lands one level lower at some pixels whose sum is a multiple of 13 (that level, times the
blend factor, is the only difference). Every other op matched a TF re-typing of
big_vision's code (tfa's transform as ImageProjectiveTransformV3) bit for bit on random
and smooth images at 224x224 and 32x28, at the arguments of magnitudes 0 to 20.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from vit_jax.data import pixels

REPLACE = 128  # fill of rotate/shear/translate/cutout
_F32 = np.float32


# --- Pixel ops ---------------------------------------------------------------------------
# Ops that map each channel value through a table run as one OpenCV LUT (C; PIL's point()
# spends more time turning the table into Python ints than looking up); the tables are
# computed with the float32 arithmetic TF uses.


def _lut(image: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Per-channel lookup: lut uint8 [256] (all channels) or [3, 256]."""
    table = np.ascontiguousarray(np.broadcast_to(lut, (3, 256)).T).reshape(256, 1, 3)
    return pixels.cv2().LUT(np.ascontiguousarray(image), table)


def _blend_lut(degenerate: np.uint8, factor: float) -> np.ndarray:
    """blend(constant degenerate, x, factor) for every x.  -> uint8 [256]"""
    return blend(np.full(256, degenerate, np.uint8), np.arange(256, dtype=np.uint8), factor)


def blend(image1: np.ndarray, image2: np.ndarray, factor: float) -> np.ndarray:
    """TF's blend: image1 + factor * (image2 - image1) in float32, truncated to uint8;
    clipped to [0, 255] when extrapolating (factor outside [0, 1])."""
    a = image1.astype(_F32)
    out = image2.astype(_F32)
    out -= a
    out *= _F32(factor)
    out += a
    if not 0.0 < factor < 1.0:
        np.clip(out, 0.0, 255.0, out=out)
    return out.astype(np.uint8)


def autocontrast(image: np.ndarray) -> np.ndarray:
    """Each channel stretched so its min -> 0 and max -> 255 (float32, truncated)."""
    levels = np.arange(256, dtype=_F32)
    luts = np.empty((3, 256), np.uint8)
    for c, (lo, hi) in enumerate(Image.fromarray(image).getextrema()):
        if hi > lo:
            scale = _F32(255.0) / (_F32(hi) - _F32(lo))
            offset = -_F32(lo) * scale
            luts[c] = np.clip(levels * scale + offset, 0.0, 255.0).astype(np.uint8)
        else:
            luts[c] = np.arange(256)
    return _lut(image, luts)


def equalize(image: np.ndarray) -> np.ndarray:
    """Histogram equalisation per channel, PIL's ImageOps.equalize rule."""
    hists = np.asarray(Image.fromarray(image).histogram(), np.int64).reshape(3, 256)
    luts = np.empty((3, 256), np.uint8)
    for c, hist in enumerate(hists):
        nonzero = hist[hist != 0]
        step = (int(nonzero.sum()) - int(nonzero[-1])) // 255
        if step == 0:
            luts[c] = np.arange(256)
        else:
            lut = (np.cumsum(hist) + step // 2) // step
            luts[c] = np.clip(np.concatenate([[0], lut[:-1]]), 0, 255)
    return _lut(image, luts)


def invert(image: np.ndarray) -> np.ndarray:
    return 255 - image


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
    """Keeps the top `bits` bits, as big_vision's TF op does: the shift 8 - bits is a uint8
    there, clamped to 7 by TF's shift (bits 0 -> 1 bit), and a negative one (bits > 8,
    magnitude above 22.5) wraps to 255 first, so it keeps 1 bit too."""
    return image & np.uint8((0xFF << min((8 - bits) % 256, 7)) & 0xFF)


def solarize(image: np.ndarray, threshold: int) -> np.ndarray:
    """Pixels >= threshold inverted; threshold taken mod 256 as TF's uint8 constant is."""
    levels = np.arange(256, dtype=np.uint8)
    return _lut(image, np.where(levels < threshold % 256, levels, 255 - levels))


def solarize_add(image: np.ndarray, addition: int, threshold: int = 128) -> np.ndarray:
    """`addition` added (clipped) to pixels below `threshold`."""
    levels = np.arange(256)
    added = np.clip(levels + addition, 0, 255)
    return _lut(image, np.where(levels < threshold, added, levels).astype(np.uint8))


def grayscale(image: np.ndarray) -> np.ndarray:
    """tf.image.rgb_to_grayscale of uint8: weights (0.2989, 0.587, 0.114) on x / 255 in
    float32, times 255.5, truncated.  uint8 [h, w, 3] -> uint8 [h, w]"""
    f = image.astype(_F32)
    f *= _F32(1.0 / 255.0)
    g = f[..., 0] * _F32(0.2989)
    g += f[..., 1] * _F32(0.5870)
    g += f[..., 2] * _F32(0.1140)
    g *= _F32(255.5)
    return g.astype(np.uint8)


def color(image: np.ndarray, factor: float) -> np.ndarray:
    return blend(grayscale(image)[..., None], image, factor)


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
    """Blend towards the constant min(h * w / 256, 255) (big_vision's 'mean', which is the
    histogram's sum / 256: the pixel count, not the mean grey)."""
    h, w = image.shape[:2]
    level = np.uint8(min(max(_F32(h * w) / _F32(256.0), 0.0), 255.0))
    return _lut(image, _blend_lut(level, factor))


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
    return _lut(image, _blend_lut(np.uint8(0), factor))


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
    """Blend with the image smoothed by [1 1 1; 1 5 1; 1 1 1] / 13 (truncated; the one
    pixel border keeps the original: all of an image under 3 pixels a side)."""
    x = image.astype(np.uint16)
    total = 5 * x[1:-1, 1:-1]
    for dy, dx in ((0, 0), (0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (2, 2)):
        total += x[dy : dy + total.shape[0], dx : dx + total.shape[1]]
    smooth = image.copy()
    smooth[1:-1, 1:-1] = total // 13
    return blend(smooth, image, factor)


def cutout(image: np.ndarray, pad: int, row: int, col: int) -> np.ndarray:
    """Rows [row - pad, row + pad) x columns [col - pad, col + pad), clipped, set to 128
    (none for pad 0)."""
    out = image.copy()
    out[max(0, row - pad) : row + pad, max(0, col - pad) : col + pad] = REPLACE
    return out


def _nearest(v: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """std::round(v) (half away from zero) of float32 coordinates, and whether it falls in
    [0, n).  -> (int32 index, bool inside)"""
    inside = (v > -0.5) & (v < n - 0.5)  # -0.5 rounds to -1, n - 0.5 to n: outside
    fl = np.floor(v)
    index = fl.astype(np.int32)
    index += (v - fl) >= 0.5  # exact: v - floor(v) is representable; ties go up (v > 0)
    return index, inside


def affine(image: np.ndarray, a: tuple[float, ...]) -> np.ndarray:
    """Output (x, y) reads input (a0 x + a1 y + a2, a3 x + a4 y + a5) rounded half away
    from zero (float32, as TF), 128 where that falls outside the image."""
    h, w = image.shape[:2]
    a0, a1, a2, a3, a4, a5 = (_F32(v) for v in a)
    xs, ys = np.arange(w, dtype=_F32)[None, :], np.arange(h, dtype=_F32)[:, None]
    xi, x_in = _nearest(a0 * xs + a1 * ys + a2, w)  # [h, w]
    yi, y_in = _nearest(a3 * xs + a4 * ys + a5, h)
    index = yi * w
    index += xi
    index[~(x_in & y_in)] = h * w  # the fill pixel
    rgba = np.empty((h * w + 1, 4), np.uint8)  # one uint32 per pixel: a single gather
    rgba[:-1, :3] = image.reshape(h * w, 3)
    rgba[-1, :3] = REPLACE
    out = np.take(rgba.view(np.uint32)[:, 0], index)
    return np.ascontiguousarray(out.view(np.uint8).reshape(h, w, 4)[..., :3])


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
    """tfa.image.rotate (counter-clockwise for positive degrees) about the centre."""
    h, w = image.shape[:2]
    rad = _F32(degrees) * _F32(math.pi / 180.0)
    cos, sin = np.cos(rad), np.sin(rad)
    wm, hm = _F32(w - 1), _F32(h - 1)
    x_off = (wm - (cos * wm - sin * hm)) / _F32(2.0)
    y_off = (hm - (sin * wm + cos * hm)) / _F32(2.0)
    return affine(image, (cos, -sin, x_off, sin, cos, y_off))


def shear_x(image: np.ndarray, level: float) -> np.ndarray:
    return affine(image, (1.0, level, 0.0, 0.0, 1.0, 0.0))


def shear_y(image: np.ndarray, level: float) -> np.ndarray:
    return affine(image, (1.0, 0.0, 0.0, level, 1.0, 0.0))


def translate(image: np.ndarray, pixels: float, axis: int) -> np.ndarray:
    """Content moves left (axis 1) or up (axis 0) by `pixels`: output i reads input
    i + pixels along the axis (big_vision: translate by [-pixels, 0] or [0, -pixels])."""
    p = float(_F32(pixels))
    if p != int(p):
        a = (1.0, 0.0, p, 0.0, 1.0, 0.0) if axis == 1 else (1.0, 0.0, 0.0, 0.0, 1.0, p)
        return affine(image, a)
    p, n = int(p), image.shape[axis]
    out = np.full_like(image, REPLACE)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    if abs(p) < n:
        src[axis] = slice(max(p, 0), n + min(p, 0))
        dst[axis] = slice(max(-p, 0), n - max(p, 0))
        out[tuple(dst)] = image[tuple(src)]
    return out
