"""The paper's recipe in miniature, on the embedded Fashion-MNIST, as one library call.

1. pretrain a small ViT on classes 0-4 at 28 px (Adam, tanh pre_logits head),
   probing its frozen representation with linear few-shot accuracy on all ten classes;
2. fine-tune it on a few labelled examples of classes 5-9 at 40 px: position
   embeddings interpolated on their grid, pre_logits dropped, new zero head, SGD;
3. train the same model from scratch on that subset with the same settings.
Settings: vit_jax/configs/fashion_mnist.py. Each part runs in its own subdirectory of
the workdir and resumes from it, so an interrupted recipe picks up where it stopped,
and a finished one is left as it is (each part says it has nothing to do; recipe.json
is not rewritten).
The command is `python -m vit_jax.recipe` (the README's main job).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any

from vit_jax.base import files, store
from vit_jax.base.problems import is_int
from vit_jax.configs import fashion_mnist
from vit_jax.evaluation import fewshot
from vit_jax.training import check, train

PARTS = ("pretrain", "finetune", "scratch")


def part_config(part: str, workdir: str | os.PathLike, examples_per_class: int = 50) -> Any:
    """The config of one part; the fine-tuning part starts from the pretrained final.npz."""
    config = fashion_mnist.get_config(part)
    if part != "pretrain":
        config.dataset.examples_per_class = examples_per_class
    if part == "finetune":
        config.init_from = str(store.path(workdir) / "pretrain" / "final.npz")
    return config


def run(
    workdir: str | os.PathLike, examples_per_class: int = 50, overrides: dict | None = None
) -> dict:
    """Runs the three parts; returns and writes (workdir/recipe.json) the accuracies.
    Finished parts are not run again (train.run returns their stored summaries).

    Args:
      workdir: one subdirectory per part goes here.
      examples_per_class: labelled examples of each of classes 5-9.
      overrides: {part: {config field: value}}, e.g. shorter runs for tests; a nested
        field is named with dots ('optimizer.lr').
    """
    if not is_int(examples_per_class) or examples_per_class < 1:
        raise check.ConfigError(
            [check.Problem("examples_per_class", examples_per_class, "expected an integer >= 1")]
        )
    parts = {}
    for part in PARTS:
        config = part_config(part, workdir, examples_per_class)
        config.update_from_flattened_dict((overrides or {}).get(part, {}))  # 'optimizer.lr'
        parts[part] = config
    found = []  # all three checked before the first trains; the fine-tuning part
    for part, config in parts.items():  # starts from a file the pretraining part writes
        try:
            check.check(config, init_from_later=part == "finetune")
        except check.ConfigError as e:
            found += [dataclasses.replace(p, field=f"{part}: {p.field}") for p in e.problems]
    if found:
        raise check.ConfigError(found, "recipe's configs")
    results = {}
    for part, config in parts.items():
        print(f"\n=== {part} ===", flush=True)
        results[part] = train.run(config, store.path(workdir) / part)
    summary = {
        "pretrain_accuracy_classes_0_4": results["pretrain"]["accuracy"],
        "finetuned_accuracy_classes_5_9": results["finetune"]["accuracy"],
        "scratch_accuracy_classes_5_9": results["scratch"]["accuracy"],
        "examples_per_class": examples_per_class,
        **{k: v for k, v in results["pretrain"].items() if k.startswith(fewshot.PREFIX)},
    }
    path = store.path(workdir) / "recipe.json"
    with contextlib.suppress(OSError, ValueError):  # unreadable: written again
        if json.loads(path.read_text()) == summary:  # a rerun of a finished recipe
            return summary
    with files.atomic_write(path, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    return summary


def report(summary: dict) -> str:
    """The lines the command prints at the end."""
    n = summary["examples_per_class"]
    lines = [
        "",
        "pretrained on classes 0-4 (28 px): test accuracy "
        f"{summary['pretrain_accuracy_classes_0_4']:.4f}",
    ]
    for row in fewshot.by_dataset(summary).values():
        accs = "/".join(f"{acc:.3f}" for acc in row.values())
        lines.append(f"  linear {'/'.join(map(str, row))}-shot on all ten classes: {accs}")
    lines += [
        f"classes 5-9 from {n} labelled examples each (40 px):",
        f"  fine-tuned from the pretrained ViT: {summary['finetuned_accuracy_classes_5_9']:.4f}",
        f"  trained from scratch:               {summary['scratch_accuracy_classes_5_9']:.4f}",
    ]
    return "\n".join(lines)
