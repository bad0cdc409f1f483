"""Study 3: data size against inductive bias (the paper's Section 4.3, Figures 3-4).

A small ViT and a small hybrid (a ResNet root and one bottleneck unit under a
shallower ViT) of similar compute are pretrained on 1k, 5k or 30k images of
Fashion-MNIST classes 0-4 for the same number of steps. Their frozen
representation is then probed with linear 10-shot accuracy on classes 5-9 (never
seen in pretraining), and each is fine-tuned on 50 labelled examples per class of
classes 5-9. STUDIES.md reports the result:

    python studies/datasize.py --seeds=0,1,2 --workdir=workdirs/study_datasize
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

if __package__ in (None, ""):  # `python studies/datasize.py`: import from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from studies import common  # noqa: E402

NAME = "datasize"
MODELS = ("vit", "hybrid")
SIZES = {"1k": 200, "5k": 1000, "30k": 6000}  # images per class of classes 0-4
SETTINGS = tuple(f"{m}_{n}" for m in MODELS for n in SIZES)
SECOND = (5, 6, 7, 8, 9)
SHOTS = 10
LABELS = {
    "accuracy": "10-shot linear, 5-9",
    "finetune_accuracy": "fine-tuned 50/class, 5-9",
    "pretrain_accuracy": "pretrain test, 0-4",
}


def set_model(c, model: str):
    """ViT: 4 layers of width 64 on 4x4 patches (7x7 tokens of a 28 px image).
    Hybrid: ResNet root (conv 7x7/2, max-pool 3x3/2) and one bottleneck unit (256
    channels), 1x1 patches of its 7x7 map, 2 layers of width 64: 1.24x the ViT's
    forward FLOPs (20.6 M against 16.7 M per image), 176k parameters against 145k."""
    if model == "hybrid":
        c.model.update(name="R+Ti/4", depth=2, patch_size=1)
        c.model.resnet_stages = (1,)
    return c


def pretrain_config(setting: str, seed: int, quick: bool = False):
    """The recipe's pretraining (classes 0-4, 28 px, Adam 2e-3, tanh pre-logits of
    width 64) on a subset, 200 steps of batch 64 whatever its size."""
    from vit_jax.configs import fashion_mnist

    model, size = setting.split("_")
    c = set_model(fashion_mnist.get_config("pretrain"), model)
    c.dataset.examples_per_class = SIZES[size]  # drawn with dataset.subset_seed 0
    c.fewshot.datasets = ""  # probed after training, on classes 5-9 only
    c.batch_size = 64
    return common.schedule(c, 200, 100, seed, quick)


def finetune_config(setting: str, seed: int, init_from: str, quick: bool = False):
    """The recipe's fine-tuning (SGD 0.03 with momentum, cosine, new zero head) on 50
    examples of each of classes 5-9, kept at 28 px and shortened to 60 steps."""
    from vit_jax.configs import fashion_mnist

    c = set_model(fashion_mnist.get_config("finetune"), setting.split("_")[0])
    c.init_from = init_from
    c.image_size = 28
    c.optimizer.warmup_steps = 6
    c = common.schedule(c, 60, 30, seed, quick)
    if quick:
        c.dataset.examples_per_class = 8
    return c


def fewshot_accuracy(npz: str, seed: int, quick: bool = False) -> float:
    """Linear 10-shot accuracy of the frozen pre-logits on classes 5-9 (the test split's
    5000 images); the 10 examples per class are drawn with `seed`."""
    from vit_jax import weights
    from vit_jax.evaluation import fewshot

    model, params, _ = weights.load_model(npz, head=False)
    dataset = {"source": "idx", "name": "fashion_mnist_5_9", "classes": SECOND}
    dataset["preprocessing"] = common.PREPROCESSING
    if quick:
        dataset.update(train_split="train[:512]", test_split="test[:128]")
    evaluator = fewshot.FewShotEvaluator([dataset], (SHOTS,), seed=seed, image_size=28)
    return evaluator.run(model, params)[fewshot.metric_name("fashion_mnist_5_9", SHOTS)]


def cell(setting: str, seed: int, workdir: str, quick: bool) -> dict:
    pre = common.train_cell(pretrain_config(setting, seed, quick), os.path.join(workdir, "pre"))
    npz = os.path.join(workdir, "pre", "final.npz")
    few = fewshot_accuracy(npz, seed, quick)
    print(f"linear {SHOTS}-shot accuracy on classes 5-9: {few:.4f}", flush=True)
    ft_config = finetune_config(setting, seed, npz, quick)
    ft = common.train_cell(ft_config, os.path.join(workdir, "finetune"))
    return {
        "accuracy": few,
        "finetune_accuracy": ft["accuracy"],
        "pretrain_accuracy": pre["accuracy"],
        "num_params": pre["num_params"],
        "pretrain_seconds": pre["wall_seconds"],
    }


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    for ax, metric in zip(axes, ("accuracy", "finetune_accuracy"), strict=True):
        values = common.by_setting(records, metric)
        for i, model in enumerate(MODELS):
            cells = [(n, f"{model}_{n}") for n in SIZES]
            pts = [(5 * SIZES[n], values[s]) for n, s in cells if s in values]
            if not pts:
                continue
            common.error_bars(ax, pts, model, f"C{i}")
        ax.set_xscale("log")
        ax.set_xlabel("pretraining images (classes 0-4)")
        ax.set_ylabel(f"{LABELS[metric]} (%)")
        ax.legend()
    fig.suptitle("Data size against inductive bias: 200 pretraining steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    metrics = ("accuracy", "finetune_accuracy", "pretrain_accuracy")
    return common.run_study(NAME, SETTINGS, cell, argv, metrics, plot, LABELS)


if __name__ == "__main__":
    main()
