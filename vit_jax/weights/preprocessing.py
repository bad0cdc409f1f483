"""Which resize a file's weights expect: `vit_jax.data.pixels.METHODS`, kept with them.

A checkpoint is trained and evaluated on one preprocessing, 'tf_bilinear' (tf.image.resize,
the published files') or 'pil_antialias' (PIL's, HF's and timm's); fed the other, it sees
other pixels than its numbers were measured on. Each format says it its own way, and every
file this package writes says it, like the class names (labels.py):

  npz   one more entry, `vit_jax_preprocessing` (a 0-d string array), where the method is
        not the published files' tf_bilinear: files of the original's stay byte-for-byte
        what they were. Without it: tf_bilinear.
  timm  safetensors metadata `preprocessing`. Without it: pil_antialias (a file timm wrote:
        timm's transforms resize with PIL).
  hf    config.json's `vit_jax_preprocessing`. Without it: pil_antialias (transformers'
        image processors resize with PIL or torchvision, antialiased).

The commands use what the file says unless told otherwise (--preprocessing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vit_jax.data.pixels import METHODS, PUBLISHED
from vit_jax.weights.errors import CheckpointError

NPZ_KEY = "vit_jax_preprocessing"
TIMM_KEY = "preprocessing"
HF_KEY = "vit_jax_preprocessing"
OTHER_TOOLS = "pil_antialias"  # what timm's and transformers' processors compute


def _checked(method: Any, source: str) -> str:
    if method not in METHODS:
        raise CheckpointError(
            f"{source} names preprocessing {method!r}; this package computes {' or '.join(METHODS)}"
        )
    return str(method)


def to_npz(method: str | None) -> dict[str, np.ndarray]:
    if method is None or method == PUBLISHED:
        return {}
    return {NPZ_KEY: np.array(_checked(method, "the run"))}


def from_npz(arrays: dict[str, Any], source: str) -> str:
    """Pops the entry from an .npz's arrays; the method (the published files' without)."""
    entry = arrays.pop(NPZ_KEY, None)
    return PUBLISHED if entry is None else _checked(str(entry), f"{source} ({NPZ_KEY})")


def to_timm_metadata(method: str | None) -> dict[str, str]:
    return {} if method is None else {TIMM_KEY: _checked(method, "the model")}


def from_timm_metadata(metadata: dict[str, str], source: str) -> str:
    entry = metadata.get(TIMM_KEY)
    return OTHER_TOOLS if entry is None else _checked(entry, f"{source} (metadata {TIMM_KEY})")


def to_hf_config(method: str | None) -> dict[str, str]:
    return {} if method is None else {HF_KEY: _checked(method, "the model")}


def from_hf_config(cfg: dict[str, Any], source: str) -> str:
    entry = cfg.get(HF_KEY)
    return OTHER_TOOLS if entry is None else _checked(entry, f"{source} ({HF_KEY})")
