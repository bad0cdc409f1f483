"""The preprocessing a checkpoint expects, as one string that configs, flags, files and
run records carry, parsed here into `Preprocessing` (pixels.py computes it):

  RESIZE[:mean=R,G,B][:std=R,G,B][:crop=F][:mode=MODE]
  e.g. pil_bicubic:mean=0.48145466,0.4578275,0.40821073:std=0.26862954,0.26130258,0.27577711

  RESIZE     tf_bilinear, pil_antialias or pil_bicubic (pixels.py).
  mean, std  one number or three: pixels (x / 255 - mean) / std; 0.5 (the default) is
             [-1, 1], computed as (x - 127.5) / 127.5.
  crop, mode evaluation's input at the model's size S (timm's `transforms_imagenet_eval`;
             training's crops are augment.py's): squash (the default) resizes both sides
             to floor(S / crop); center the shorter side, keeping the aspect ratio (as
             torchvision's Resize(n): the longer int(n * long / short)); border the longer
             (timm's ResizeKeepRatio, rounded); then the centre S is cut, at torchvision's
             offset round(margin / 2), half to even, and padded with 0 (border: with
             round(255 * mean)). hf_center is center at transformers' offset,
             floor(margin / 2). crop defaults to 1: the whole image, squashed to S.

Today's two strings, 'tf_bilinear' and 'pil_antialias', are whole specs (everything
else at its default) and print back as themselves. `from_timm_cfg` and
`from_hf_processor` write the string of timm's pretrained_cfg and of transformers'
preprocessor_config.json; where they disagree for the same weights, the file at hand
says what its weights expect.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

METHODS = ("tf_bilinear", "pil_antialias")  # the package's first two strings, whole specs
RESIZES = (*METHODS, "pil_bicubic")
MODES = ("squash", "center", "hf_center", "border")
# What a file that records no method was made with: the published .npz files (the
# original code's tf.image.resize); timm and HF files come from tools whose processors
# compute PIL's antialiased resize.
PUBLISHED = "tf_bilinear"
GRAMMAR = (
    f"RESIZE[:mean=R,G,B][:std=R,G,B][:crop=F][:mode=MODE], RESIZE {'|'.join(RESIZES)}, "
    f"MODE {'|'.join(MODES)}"
)
KEYS = {"mean": "mean", "std": "std", "crop": "crop_fraction", "mode": "crop_mode"}
HALF = (0.5, 0.5, 0.5)


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """A preprocessing string, parsed (the module's docstring); `str` writes it back."""

    resize: str = PUBLISHED
    mean: tuple[float, ...] = HALF
    std: tuple[float, ...] = HALF
    crop_fraction: float = 1.0  # timm's crop_pct
    crop_mode: str = "squash"

    def __post_init__(self):
        for name in ("mean", "std"):  # one number or three, as floats
            value = getattr(self, name)
            value = tuple(map(float, value if isinstance(value, (list, tuple)) else [value]))
            object.__setattr__(self, name, value * 3 if len(value) == 1 else value)
        bad = {
            f"resize {self.resize!r}": self.resize in RESIZES,
            f"mean {self.mean}": len(self.mean) == 3,
            f"std {self.std}": len(self.std) == 3 and min(self.std) > 0,
            f"crop {self.crop_fraction}": self.crop_fraction > 0,
            f"mode {self.crop_mode!r}": self.crop_mode in MODES,
        }
        if not all(bad.values()):
            raise ValueError(", ".join(k for k, ok in bad.items() if not ok))

    @classmethod
    @functools.cache
    def parse(cls, text: str) -> Preprocessing:
        """The spec of `text` ('': unset, the published checkpoints' resize until a run
        resolves it to its init_from's); a one-line ValueError naming the bad part and
        the grammar."""
        resize, *parts = (text or PUBLISHED).split(":")
        if resize not in RESIZES:  # the first word: named as when there were two
            why = f"is not one of {' or '.join(RESIZES)}" + (f" (in {text!r})" if parts else "")
            raise ValueError(f"preprocessing {resize!r} {why}; expected {GRAMMAR}")
        fields = {}
        try:
            for key, _, value in (part.partition("=") for part in parts):
                if key not in KEYS or KEYS[key] in fields:
                    raise ValueError(f"{key!r} is not one of {'|'.join(KEYS)}=VALUE, each once")
                fields[KEYS[key]] = _field(key, value)
            return cls(resize, **fields)
        except ValueError as e:
            raise ValueError(f"preprocessing {text!r}: {e}; expected {GRAMMAR}") from None

    def __str__(self) -> str:
        parts = [self.resize]
        for key, name in KEYS.items():
            value = getattr(self, name)
            if value != self.__dataclass_fields__[name].default:
                parts.append(
                    f"{key}={','.join(map(str, value)) if key in ('mean', 'std') else value}"
                )
        return ":".join(parts)

    @property
    def whole(self) -> bool:
        """Whether evaluation resizes the whole image to the model's size (crop 1, squash)."""
        return self.crop_fraction == 1 and self.crop_mode == "squash"


def _field(key: str, value: str) -> str | float | tuple[float, ...]:
    """The value of one KEY=VALUE of a preprocessing string."""
    if key == "mode":
        return value
    try:
        numbers = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise ValueError(f"{key}={value} is not numbers") from None
    if key == "crop" and len(numbers) != 1:
        raise ValueError(f"crop={value} is not one number")
    return numbers[0] if key == "crop" else numbers


def problem(text: object) -> str | None:
    """Why `text` is no preprocessing string, None where it is one (a config rule)."""
    try:
        Preprocessing.parse(text if isinstance(text, str) else repr(text))
    except ValueError as e:
        return str(e)
    return None


# timm's interpolation names and PIL's Resampling numbers (transformers' `resample`).
TIMM_RESIZES = {"bilinear": "pil_antialias", "bicubic": "pil_bicubic"}
PIL_RESIZES = {2: "pil_antialias", 3: "pil_bicubic"}


def from_timm_cfg(cfg: dict[str, Any]) -> str:
    """The string of a timm model's `pretrained_cfg` (its `mean`, `std`, `interpolation`,
    `crop_pct` and `crop_mode`, with `timm.data.resolve_data_config`'s defaults: 0.875,
    center), as timm's eval transform computes it on PIL images.

    Raises:
        ValueError: an interpolation or input size this package does not compute.
    """
    how, channels = cfg.get("interpolation", "bilinear"), cfg.get("input_size", (3,))[0]
    if how not in TIMM_RESIZES or channels != 3:
        expected = " or ".join(TIMM_RESIZES)
        raise ValueError(f"timm's {how!r} on {channels} channels: expected {expected} on 3")
    mean, std = cfg.get("mean", (0.485, 0.456, 0.406)), cfg.get("std", (0.229, 0.224, 0.225))
    crop, mode = float(cfg.get("crop_pct") or 0.875), cfg.get("crop_mode") or "center"
    return str(Preprocessing(TIMM_RESIZES[how], mean, std, crop, mode))


def to_timm_cfg(text: str | None, size: tuple[int, int], channels: int = 3) -> dict[str, Any]:
    """timm's `pretrained_cfg` keys for a string (None: the package's default), the inverse
    of `from_timm_cfg`: tf_bilinear is written as timm's 'bilinear' (PIL's), hf_center as
    'center'; `size` (H, W) is the input_size."""
    p = Preprocessing.parse(text or PUBLISHED)
    how = {v: k for k, v in TIMM_RESIZES.items()}.get(p.resize, "bilinear")
    mode = "center" if p.crop_mode == "hf_center" else p.crop_mode
    pixels = dict(input_size=(channels, *size), interpolation=how, mean=p.mean, std=p.std)
    return dict(pixels, crop_pct=p.crop_fraction, crop_mode=mode)


def from_hf_processor(cfg: dict[str, Any]) -> str:
    """The string of transformers' `preprocessor_config.json` (`resample`, `image_mean`,
    `image_std`, `do_normalize`, `do_rescale`, `rescale_factor`, `size` and
    `do_center_crop` with `crop_size`), as its PIL backend computes it: `size`
    {shortest_edge} then the centre crop_size is hf_center, {height, width} squash.

    Raises:
        ValueError: a resample filter this package does not compute.
    """
    how = cfg.get("resample", 2)
    if how not in PIL_RESIZES:
        raise ValueError(f"resample {how!r}: this package computes PIL's 2 (bilinear) or 3")
    scale = 255 * (cfg.get("rescale_factor", 1 / 255) if cfg.get("do_rescale", True) else 1)
    scale = 1.0 if math.isclose(scale, 1.0) else scale  # x * r: x / 255 with mean and std / 255r
    mean, std = cfg.get("image_mean", HALF), cfg.get("image_std", HALF)
    mean, std = (mean, std) if cfg.get("do_normalize", True) else (0.0, 1.0)
    size, crop = cfg.get("size", {}), cfg.get("crop_size") or {}
    side = size.get("shortest_edge") or size.get("height", 0) if isinstance(size, dict) else size
    crop = crop.get("height", side) if isinstance(crop, dict) else crop
    fraction = crop / side if cfg.get("do_center_crop") and side else 1.0
    mode = "hf_center" if isinstance(size, dict) and "shortest_edge" in size else "squash"
    spec = Preprocessing(PIL_RESIZES[how], mean, std, fraction, mode)  # mean, std: 3 floats
    mean, std = (tuple(v / scale for v in values) for values in (spec.mean, spec.std))
    return str(dataclasses.replace(spec, mean=mean, std=std))
