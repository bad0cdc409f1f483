"""The class names of a head, kept with the weights in every format this package writes.

A model trained on an image folder predicts class indices in the order of the sorted
folder names; without the names a file's predictions are numbers. Each format says them
its own way, and every file this package writes says them when they are known:

  npz   one more entry, `vit_jax_labels`: a 0-d string array holding a JSON list, which
        the original code and timm's npz loader leave unread (like `vit_jax_numerics`)
  timm  safetensors metadata `labels`, the same JSON list
  hf    config.json's `id2label` (transformers' defaults LABEL_0, LABEL_1, ... name nothing)

Files without them (the published ones, other tools') give None: the commands then use
the ImageNet names for a 1000-class head, else 'class i'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from vit_jax.weights.errors import CheckpointError

NPZ_KEY = "vit_jax_labels"
TIMM_KEY = "labels"
_HF_DEFAULT = re.compile(r"LABEL_(\d+)")


def checked(labels: Sequence[str] | None, num_classes: int, source: str) -> list[str] | None:
    """`labels` as a list when they fit a head of `num_classes`: one distinct name each.

    Raises:
        ValueError: another number of names, or a name given twice (named with `source`).
    """
    if labels is None:
        return None
    names = [str(n) for n in labels]
    if len(names) != num_classes:
        raise ValueError(
            f"{source}: {len(names)} class names for a head of {num_classes} classes: give "
            "one a class"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"{source}: class names must differ; repeated: {', '.join(map(repr, twice[:5]))}"
        )
    return names


def to_npz(labels: Sequence[str] | None) -> dict[str, np.ndarray]:
    return {} if labels is None else {NPZ_KEY: np.array(json.dumps(list(labels)))}


def from_npz(arrays: dict[str, Any], source: str) -> list[str] | None:
    """Pops the entry from an .npz's arrays; its names (None without)."""
    entry = arrays.pop(NPZ_KEY, None)
    return None if entry is None else _json_list(str(entry), f"{source} ({NPZ_KEY})")


def to_timm_metadata(labels: Sequence[str] | None) -> dict[str, str]:
    return {} if labels is None else {TIMM_KEY: json.dumps(list(labels))}


def from_timm_metadata(metadata: dict[str, str], source: str) -> list[str] | None:
    entry = metadata.get(TIMM_KEY)
    return None if entry is None else _json_list(entry, f"{source} (metadata {TIMM_KEY})")


def from_hf_config(cfg: dict[str, Any]) -> list[str] | None:
    """config.json's id2label in class order; None where it holds transformers' defaults."""
    id2label = cfg.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        return None
    names = [str(id2label.get(str(i), id2label.get(i, ""))) for i in range(len(id2label))]
    if all(_HF_DEFAULT.fullmatch(n) and int(n[6:]) == i for i, n in enumerate(names)):
        return None
    return names


def _json_list(text: str, source: str) -> list[str]:
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{source} is not a JSON list of class names: {text[:80]!r}")
    return names
