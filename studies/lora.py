"""Study 5: LoRA against full fine-tuning, in miniature (issue 41).

The recipe's pretrained model (`vit_jax.recipe`'s first part, seed 0, trained once in
DIR/pretrain) is fine-tuned as the recipe does (50 labelled examples of each of classes
5-9 at 40 px, SGD 0.03 with momentum, 200 steps), in full and with LoRA of rank 4 and 8
on query and value (the same optimizer and schedule); each seed draws its own adapters,
dropout and batches. The records hold the test accuracy, the trained parameters, the
step time (the loop's own, after compiling) and the bytes per device the compiler gives
for the step. STUDIES.md reports the result:

    python studies/lora.py --seeds=0,1,2 --workdir=workdirs/study_lora
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

if __package__ in (None, ""):  # `python studies/lora.py`: import from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from studies import common  # noqa: E402

NAME = "lora"
RANKS = {"full": 0, "lora_r4": 4, "lora_r8": 8}
SETTINGS = tuple(RANKS)
LABELS = {"accuracy": "test accuracy, 5-9", "step_ms": "ms a step", "mib": "MiB a device"}


def pretrained(root: str, quick: bool) -> str:
    """The recipe's pretraining, once for every cell: its final.npz."""
    from vit_jax.training import miniature

    workdir = os.path.join(root, "pretrain")
    config = miniature.part_config("pretrain", root)
    config.fewshot.datasets = ""
    common.train_cell(common.quick(config) if quick else config, workdir)
    return os.path.join(workdir, "final.npz")


def finetune_config(setting: str, seed: int, init_from: str, quick: bool = False):
    from vit_jax.configs import fashion_mnist

    c = fashion_mnist.get_config("finetune")
    c.init_from, c.seed = init_from, seed
    c.lora.rank = RANKS[setting]
    return common.quick(c) if quick else c


def cell(setting: str, seed: int, workdir: str, quick: bool) -> dict:
    import jax

    from vit_jax.training import planner

    root = os.path.dirname(os.path.dirname(workdir))
    config = finetune_config(setting, seed, pretrained(root, quick), quick)
    summary = common.train_cell(config, workdir)
    plan = planner.plan_on(config, jax.devices(), "cpu")
    return {
        "accuracy": summary["accuracy"],
        "trained_parameters": summary["trained_parameters"],
        "step_ms": 1000 * config.batch_size / summary["img_per_sec_per_device"],
        "mib": plan.total_bytes / 2**20,
        "param_mib": (plan.param_bytes + plan.optimizer_bytes) / 2**20,
    }


def plot(records: list[dict], path: str) -> None:
    """Accuracy of each setting: mean and spread over the seeds, each seed a dot."""
    title = "LoRA against full fine-tuning (the recipe's fine-tuning part)"
    common.bar_plot(records, path, SETTINGS, title)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    metrics = ("accuracy", "step_ms", "mib")
    return common.run_study(NAME, SETTINGS, cell, argv, metrics, plot, LABELS)


if __name__ == "__main__":
    main()
