"""Study 4: augmentation and regularisation against data (AugReg, Steiner et al. 2021).

The AugReg paper finds that augmentation and regularisation are worth about ten times
the pretraining data (a ViT with AugReg on ImageNet-1k matches a plain one on the 10x
larger ImageNet-21k). In miniature: the small ViT of the other studies trained from
scratch on 100, 1k or 10k images of Fashion-MNIST (10, 100 or 1000 of each of the ten
classes: sizes 10x apart, as in the paper's claim) for the same number of steps, with
three of the AugReg settings of `vit_jax/configs/augreg.py`: `none` (no
regularisation), `light1` (RandAugment (2, 0), no mixup) and `medium2` (RandAugment
(2, 15), mixup 0.5), the two augmented ones with dropout = stochastic depth 0.1.
STUDIES.md reports the result:

    python studies/augreg.py --seeds=0,1,2 --workdir=workdirs/study_augreg
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence

if __package__ in (None, ""):  # `python studies/augreg.py`: import from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from studies import common  # noqa: E402

NAME = "augreg"
AUGS = ("none", "light1", "medium2")  # vit_jax.configs.augreg.SETTINGS names
REG = {"none": 0.0, "light1": 0.1, "medium2": 0.1}  # dropout = stochastic depth
SIZES = {"100": 10, "1k": 100, "10k": 1000}  # images per class of all ten classes
SETTINGS = tuple(f"{a}_{n}" for a in AUGS for n in SIZES)
STEPS = 300
LABELS = {"accuracy": "test", "train_accuracy": "train (clean)", "gap": "train - test"}


def parse_setting(setting: str) -> tuple[str, str]:
    """'medium2_5k' -> ('medium2', '5k')."""
    aug, size = setting.rsplit("_", 1)
    return aug, size


def config(setting: str, seed: int, quick: bool = False):
    """The ViT of studies 1-3 (4 layers of width 64 on 4x4 patches, class token, no
    pre-logits), Adam 2e-3 (40 warmup steps, linear decay, weight decay 0.03), batch 64,
    Inception crops (min area 0.5) and flips for every setting, STEPS steps whatever the
    subset's size; the AugReg setting adds mixup, RandAugment, dropout and stochastic
    depth."""
    from vit_jax.configs import augreg, fashion_mnist

    aug, size = parse_setting(setting)
    mixup, randaug = augreg.SETTINGS[aug]
    c = fashion_mnist.get_config("pretrain")
    c.dataset.classes = None  # all ten classes
    c.dataset.examples_per_class = SIZES[size]  # nested subsets, dataset.subset_seed 0
    c.dataset.mixup = mixup
    c.dataset.randaugment = randaug
    c.model.dropout = c.model.stochastic_depth = REG[aug]
    c.fewshot.datasets = ""
    c.model.representation_size = None
    c.batch_size = 64
    return common.schedule(c, STEPS, 100, seed, quick)


def train_accuracy(npz: str, c) -> float:
    """Accuracy of the final weights on the run's training subset, without augmentation
    (the eval preprocessing: the 28 px image as it is)."""
    from vit_jax import weights
    from vit_jax.evaluation import classify

    model, params, size = weights.load_model(npz)
    dataset = {k: c.dataset[k] for k in ("source", "name", "examples_per_class", "subset_seed")}
    split = c.dataset.train_split
    out = classify.evaluate(model, params, dataset, split, size, 500, progress=False)
    return out["top1"]


def cell(setting: str, seed: int, workdir: str, quick: bool) -> dict:
    c = config(setting, seed, quick)
    s = common.train_cell(c, workdir)
    train = train_accuracy(os.path.join(workdir, "final.npz"), c)
    print(f"clean training-subset accuracy: {train:.4f}", flush=True)
    return {
        "accuracy": s["accuracy"],
        "train_accuracy": train,
        "gap": train - s["accuracy"],
        "train_loss": s["train_loss"],
        "steps": s["steps"],
        "num_params": s["num_params"],
    }


def means(records: list[dict], metric: str = "accuracy") -> dict[str, float]:
    """{setting: mean of `metric` over seeds}."""
    return {s: common.mean_std(v)[0] for s, v in common.by_setting(records, metric).items()}


def none_equivalent(acc: float, curve: Sequence[tuple[int, float]]) -> float | None:
    """Images `none` would need for accuracy `acc`: `curve` is its (images, mean accuracy)
    points in size order, interpolated linearly in log(images) on the first rising
    segment that brackets `acc`. None when no segment does (below the smallest size or
    above the largest, or the curve never rises to it)."""
    for (n0, a0), (n1, a1) in zip(curve, curve[1:], strict=False):
        if a0 <= acc <= a1 and a1 > a0:
            t = (acc - a0) / (a1 - a0)
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return None


def summary(records: list[dict]) -> str:
    """Per augmented setting and size: the gain over `none` (mean ± std of the per-seed
    differences, in points) and the data `none` needs for the same mean accuracy."""
    values = {
        (r["setting"], r["seed"]): r["accuracy"] for r in records if r.get("accuracy") is not None
    }
    mean = means(records)
    curve = [(10 * n, mean[f"none_{k}"]) for k, n in SIZES.items() if f"none_{k}" in mean]
    lines = []
    for aug in AUGS[1:]:
        for k, n in SIZES.items():
            seeds = sorted(
                s for (st, s) in values if st == f"{aug}_{k}" and (f"none_{k}", s) in values
            )
            if not seeds:
                continue
            diffs = [100 * (values[f"{aug}_{k}", s] - values[f"none_{k}", s]) for s in seeds]
            m, sd = common.mean_std(diffs)
            worth = none_equivalent(mean[f"{aug}_{k}"], curve)
            if worth is not None:
                where = f"none needs about {worth:,.0f} images for it ({worth / (10 * n):.1f}x)"
            elif curve and mean[f"{aug}_{k}"] < min(a for _, a in curve):
                where = "below none at every size of the grid"
            elif curve and mean[f"{aug}_{k}"] < curve[0][1]:
                where = f"below none on {curve[0][0]:,} images"
            elif curve and mean[f"{aug}_{k}"] > max(a for _, a in curve):
                where = "above none at every size of the grid"
            else:
                where = "none reaches it at no size of the grid"
            lines.append(
                f"{aug} on {10 * n:,} images: {m:+.2f} ± {sd:.2f} points over none; {where}"
            )
    return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    for ax, metric in zip(axes, ("accuracy", "gap"), strict=True):
        values = common.by_setting(records, metric)
        for i, aug in enumerate(AUGS):
            pts = [
                (10 * n, values[f"{aug}_{k}"]) for k, n in SIZES.items() if f"{aug}_{k}" in values
            ]
            if not pts:
                continue
            common.error_bars(ax, pts, aug, f"C{i}")
        ax.set_xscale("log")
        ax.set_xlabel("training images (all ten classes)")
        ax.set_ylabel(
            f"{LABELS[metric]} accuracy (%)" if metric == "accuracy" else "train - test (points)"
        )
        ax.legend()
    fig.suptitle(
        f"Augmentation and regularisation against data: ViT 4x64, {STEPS} steps", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    metrics = ("accuracy", "train_accuracy", "gap")
    return common.run_study(NAME, SETTINGS, cell, argv, metrics, plot, LABELS, summary)


if __name__ == "__main__":
    main()
