"""The shipped presets: config files that the wheel installs, reachable by name.

    python -m vit_jax.main --config=fashion_mnist:tiny --workdir=DIR
    python -m vit_jax.main --config=finetune:b16,cifar10 --workdir=DIR
    python -m vit_jax.main --config=augreg:b16,imagenet2012,medium2 --workdir=DIR
    python -m vit_jax.main --config=path/to/my_config.py:arg --workdir=DIR

  common.py         base(): every field of a run config, with its default
  finetune.py       the paper's fine-tuning of published checkpoints (MODEL,DATASET)
  pretrain.py       the paper's pretraining from scratch (MODEL,DATASET)
  augreg.py         the AugReg recipes: RandAugment, mixup, dropout (MODEL,DATASET,SETTING)
  fashion_mnist.py  the embedded Fashion-MNIST: the recipe's parts, a full run, tiny

A user's own config file starts from `vit_jax.configs.common.base(model)`.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import ml_collections

PRESETS = ("finetune", "pretrain", "augreg", "fashion_mnist")
_DIR = Path(__file__).resolve().parent


def resolve(spec: str) -> str:
    """'NAME[:ARG]' of a preset -> 'PATH[:ARG]' of its file in the installed package;
    a path to an existing file (a user's config) is returned as it is.

    Raises:
      ValueError: neither a preset nor an existing file, naming the presets.
    """
    name, sep, arg = spec.partition(":")
    if os.path.isfile(name):
        return spec
    if name.endswith(".py") and os.path.basename(name)[:-3] in PRESETS and "/" not in name:
        name = name[:-3]
    if name in PRESETS:
        return f"{_DIR / (name + '.py')}{sep}{arg}"
    raise ValueError(
        f"--config={spec}: {name!r} is neither a config file nor a preset; presets: "
        f"{', '.join(PRESETS)} (e.g. --config=fashion_mnist:tiny), or pass a path to "
        "your own config file (PATH.py[:ARG])"
    )


def preset_argv(argv: list[str]) -> list[str]:
    """argv with a preset name in --config turned into the path of its installed file
    (what config_flags reads): the commands that take --config rewrite their argv so."""
    out = list(argv)
    for i, a in enumerate(out):
        if a.startswith("--config="):
            out[i] = "--config=" + resolve(a[len("--config=") :])
        elif a == "--config" and i + 1 < len(out):
            out[i + 1] = resolve(out[i + 1])
    return out


def get(spec: str) -> ml_collections.ConfigDict:
    """The config of a preset 'NAME[:ARG]' (e.g. 'fashion_mnist:tiny'), in-process."""
    name, _, arg = spec.partition(":")
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: the presets are {', '.join(PRESETS)}")
    module = importlib.import_module(f"vit_jax.configs.{name}")
    return module.get_config(arg) if arg else module.get_config()
