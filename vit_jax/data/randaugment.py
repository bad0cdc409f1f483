"""RandAugment of the AugReg recipes, on one uint8 image, in NumPy (no TensorFlow, no JAX).

    out = randaugment(image, rng, num_layers=2, magnitude=15)  # uint8 [h, w, 3] -> same

The source: big_vision `big_vision/pp/autoaugment.py`, `distort_image_with_randaugment`
(google-research/big_vision, itself forked from tensorflow/tpu's EfficientNet code), the
`randaug(N, M)` op of the AugReg configs (big_vision/configs/vit_i1k.py). This module is
its policy: which op each layer applies, at what argument. The ops themselves, each as
big_vision's TF code computes it, are image_ops.py. Its semantics, kept here where they
differ from torchvision/timm:

- Each of `num_layers` layers picks one of the 16 ops of OPS uniformly and always applies
  it: big_vision draws a probability in [0.2, 0.8] per op but never uses it (no op takes
  a `prob` argument), so there is no "apply with probability p" and no separate identity
  op. Magnitude M (float, usually 0..20) maps with M / 10, the same for every op.
- Rotate +-30 M/10 degrees, ShearX/Y +-0.3 M/10, TranslateX/Y +-100 M/10 *pixels* (not a
  fraction of the size: at M >= 3 a 28 px image is translated out entirely), each sign
  50/50. Cutout: a (2 * int(40 M/10)) square, clipped at the borders, centred on a pixel
  drawn uniformly.
- Color/Contrast/Brightness/Sharpness blend with factor 1.8 M/10 + 0.1 (so 0.1 at M=0:
  light1's randaug(2, 0) is "actually not nothing").
- Posterize keeps int(4 M/10) bits: one bit at M=0 (TF's shift is clamped), four at 10,
  six at 15, eight (identity) at 20. Solarize's threshold int(256 M/10) wraps to uint8: 0
  at M = 0, 10 and 20 (every pixel inverted), 128 at 15. SolarizeAdd adds int(110 M/10)
  below 128, clipped. AutoContrast, Equalize and Invert ignore M.

Deliberate difference: the random numbers (NumPy, not TF's stream); each call draws a
fixed 4 * num_layers uniforms from `rng` (op, sign, cutout row, cutout column per layer),
used or not, so a generator seeded from (seed, step, example) gives the same image on
resume.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from vit_jax.data import image_ops

MAX_LEVEL = 10.0
TRANSLATE_CONST = 100  # pixels at M = 10
CUTOUT_CONST = 40  # half side at M = 10


class _Args(NamedTuple):
    """What big_vision's level_to_arg makes of one magnitude, for every op."""

    level: float  # M / 10
    signed: float  # level, negated for half the draws (rotate, shear, translate)
    factor: float  # 1.8 level + 0.1 (the blends)
    row: int  # the cutout centre
    col: int


# big_vision's available_ops, in its order (the op index is drawn over it), and level_to_arg.
_OPS = {
    "AutoContrast": lambda x, a: image_ops.autocontrast(x),
    "Equalize": lambda x, a: image_ops.equalize(x),
    "Invert": lambda x, a: image_ops.invert(x),
    "Rotate": lambda x, a: image_ops.rotate(x, a.signed * 30.0),
    "Posterize": lambda x, a: image_ops.posterize(x, int(a.level * 4)),
    "Solarize": lambda x, a: image_ops.solarize(x, int(a.level * 256)),
    "Color": lambda x, a: image_ops.color(x, a.factor),
    "Contrast": lambda x, a: image_ops.contrast(x, a.factor),
    "Brightness": lambda x, a: image_ops.brightness(x, a.factor),
    "Sharpness": lambda x, a: image_ops.sharpness(x, a.factor),
    "ShearX": lambda x, a: image_ops.shear_x(x, a.signed * 0.3),
    "ShearY": lambda x, a: image_ops.shear_y(x, a.signed * 0.3),
    "TranslateX": lambda x, a: image_ops.translate(x, a.signed * TRANSLATE_CONST, axis=1),
    "TranslateY": lambda x, a: image_ops.translate(x, a.signed * TRANSLATE_CONST, axis=0),
    "Cutout": lambda x, a: image_ops.cutout(x, int(a.level * CUTOUT_CONST), a.row, a.col),
    "SolarizeAdd": lambda x, a: image_ops.solarize_add(x, int(a.level * 110)),
}
OPS = tuple(_OPS)


def _check(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3:
        raise ValueError(
            f"randaugment: expected a uint8 numpy array [h, w, 3], got "
            f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}"
        )
    if image.shape[2] != 3:
        raise ValueError(
            f"randaugment: image has {image.shape[2]} channels {image.shape}; tile grayscale "
            "to RGB first (np.repeat(image, 3, axis=-1)): the ops assume RGB"
        )


def apply_op(
    image: np.ndarray, name: str, magnitude: float, negate: bool = False, row: int = 0, col: int = 0
) -> np.ndarray:
    """One op of OPS at `magnitude`, as big_vision's level_to_arg maps it. `negate` flips
    the sign of rotate/shear/translate; (row, col) is the cutout centre."""
    if name not in _OPS:
        raise ValueError(f"randaugment: unknown op {name!r}; the ops are {', '.join(OPS)}")
    level = magnitude / MAX_LEVEL
    args = _Args(level, -level if negate else level, level * 1.8 + 0.1, row, col)
    return _OPS[name](image, args)


def check_args(num_layers: int, magnitude: float) -> None:
    """Raises ValueError naming a bad (num_layers, magnitude)."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
        raise ValueError(f"randaugment num_layers={num_layers!r}: expected an int >= 0 (AugReg 2)")
    if isinstance(magnitude, bool) or not isinstance(magnitude, (int, float)):
        raise ValueError(f"randaugment magnitude={magnitude!r}: expected a number (AugReg: 0..20)")
    if not 0 <= magnitude <= 30:
        raise ValueError(f"randaugment magnitude={magnitude}: expected 0 <= M <= 30 (AugReg 0..20)")


def randaugment(
    image: np.ndarray, rng: np.random.Generator, num_layers: int, magnitude: float
) -> np.ndarray:
    """big_vision's randaug(num_layers, magnitude) of one image.  uint8 [h, w, 3] -> same.

    Draws exactly 4 * num_layers uniforms from `rng` whatever ops are picked.
    """
    check_args(num_layers, magnitude)
    _check(image)
    h, w = image.shape[:2]
    u = rng.random((num_layers, 4))  # op, sign, cutout row, cutout column
    for op_u, sign_u, row_u, col_u in u:
        name = OPS[min(int(op_u * len(OPS)), len(OPS) - 1)]
        # big_vision keeps the sign when floor(u + 0.5) is 1, i.e. u >= 0.5.
        where = int(row_u * h), int(col_u * w)
        image = apply_op(image, name, float(magnitude), sign_u < 0.5, *where)
    return image


__all__ = ["OPS", "apply_op", "check_args", "randaugment"]
