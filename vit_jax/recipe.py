"""The paper's recipe in miniature, on the embedded Fashion-MNIST (the README's main job).

    python -m vit_jax.recipe --workdir=workdirs/recipe

1. pretrain a small ViT on classes 0-4 at 28 px (Adam, tanh pre_logits head),
   probing its frozen representation with linear few-shot accuracy on all ten classes;
2. fine-tune it on a few labelled examples of classes 5-9 at 40 px: position
   embeddings interpolated on their grid, pre_logits dropped, new zero head, SGD;
3. train the same model from scratch on that subset with the same settings;
and print both accuracies. Settings: configs/fashion_mnist.py. Each part resumes
from its own workdir, so an interrupted recipe picks up where it stopped.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from configs import fashion_mnist  # noqa: E402
from vit_jax import train  # noqa: E402
from vit_jax.evaluate import fewshot  # noqa: E402

flags.DEFINE_string("workdir", "workdirs/recipe", "one subdirectory per part goes here")
flags.DEFINE_integer("examples_per_class", 50, "labelled examples of each class 5-9")


def run(workdir: str, examples_per_class: int = 50, overrides: dict | None = None) -> dict:
    """Runs the three parts; returns and writes (workdir/recipe.json) the accuracies."""
    results = {}
    for part in ("pretrain", "finetune", "scratch"):
        config = fashion_mnist.get_config(part)
        if part != "pretrain":
            config.dataset.examples_per_class = examples_per_class
        if part == "finetune":
            config.init_from = os.path.join(workdir, "pretrain", "final.npz")
        for key, value in (overrides or {}).get(part, {}).items():
            config[key] = value
        print(f"\n=== {part} ===", flush=True)
        results[part] = train.run(config, os.path.join(workdir, part))
    summary = {
        "pretrain_accuracy_classes_0_4": results["pretrain"]["accuracy"],
        "finetuned_accuracy_classes_5_9": results["finetune"]["accuracy"],
        "scratch_accuracy_classes_5_9": results["scratch"]["accuracy"],
        "examples_per_class": examples_per_class,
        **{k: v for k, v in results["pretrain"].items() if k.startswith(fewshot.PREFIX)},
    }
    with open(os.path.join(workdir, "recipe.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [
        "",
        "pretrained on classes 0-4 (28 px): test accuracy "
        f"{summary['pretrain_accuracy_classes_0_4']:.4f}",
    ]
    for row in fewshot.by_dataset(summary).values():
        accs = "/".join(f"{acc:.3f}" for acc in row.values())
        lines.append(f"  linear {'/'.join(map(str, row))}-shot on all ten classes: {accs}")
    lines += [
        f"classes 5-9 from {examples_per_class} labelled examples each (40 px):",
        f"  fine-tuned from the pretrained ViT: {summary['finetuned_accuracy_classes_5_9']:.4f}",
        f"  trained from scratch:               {summary['scratch_accuracy_classes_5_9']:.4f}",
    ]
    print("\n".join(lines), flush=True)
    return summary


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    run(flags.FLAGS.workdir, flags.FLAGS.examples_per_class)


if __name__ == "__main__":
    app.run(main)
