"""Study 2: class token or global average pooling (the paper's Appendix D.3, Figure 9).

The same small ViT with a class token ('token') or with the mean of the patch
tokens ('gap') as the image representation, each trained at four Adam learning
rates; the summary picks each head's best learning rate (mean over seeds) and shows
pooling at the token's best one. STUDIES.md reports the result:

    python studies/classifier.py --seeds=0,1,2 --workdir=workdirs/study_classifier
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

if __package__ in (None, ""):  # `python studies/classifier.py`: import from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from studies import common  # noqa: E402

NAME = "classifier"
HEADS = ("token", "gap")
LRS = ("3e-4", "1e-3", "3e-3", "1e-2")  # 1e-2 added when 3e-3 was best for both heads
SETTINGS = tuple(f"{head}_lr{lr}" for head in HEADS for lr in LRS)


def parse_setting(setting: str) -> tuple[str, float]:
    """'gap_lr1e-3' -> ('gap', 0.001)."""
    head, lr = setting.split("_lr")
    return head, float(lr)


def config(setting: str, seed: int, quick: bool = False):
    """Study 1's model and data (4 layers of width 64, 7x7 tokens of 28 px images,
    batch 64) for 200 Adam steps, with the head and learning rate of `setting`."""
    from studies import posemb

    head, lr = parse_setting(setting)
    c = posemb.config("learned", seed, quick, steps=200)
    c.model.classifier = head
    c.optimizer.lr = lr
    return c


def cell(setting: str, seed: int, workdir: str, quick: bool) -> dict:
    s = common.train_cell(config(setting, seed, quick), workdir)
    return {"accuracy": s["accuracy"], "steps": s["steps"], "num_params": s["num_params"]}


def best(records: list[dict]) -> dict[str, str]:
    """{head: its setting of highest mean accuracy over seeds}."""
    means = {s: common.mean_std(v)[0] for s, v in common.by_setting(records, "accuracy").items()}
    out = {}
    for head in HEADS:
        mine = {s: m for s, m in means.items() if parse_setting(s)[0] == head}
        if mine:
            out[head] = max(mine, key=mine.get)
    return out


def summary(records: list[dict]) -> str:
    """The three comparisons of the paper's Figure 9, mean ± std over seeds (in %)."""
    values = common.by_setting(records, "accuracy")
    chosen = best(records)
    lines = []
    for head, setting in chosen.items():
        m, s = common.mean_std([100 * v for v in values[setting]])
        lines.append(f"{head} at its best lr ({setting}): {m:.2f} ± {s:.2f}")
    if "token" in chosen:
        same = "gap_lr" + chosen["token"].split("_lr")[1]
        if same in values:
            m, s = common.mean_std([100 * v for v in values[same]])
            lines.append(f"gap at the token's best lr ({same}): {m:.2f} ± {s:.2f}")
    return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = common.by_setting(records, "accuracy")
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    for i, head in enumerate(HEADS):
        pts = [(float(lr), values[f"{head}_lr{lr}"]) for lr in LRS if f"{head}_lr{lr}" in values]
        if not pts:
            continue
        common.error_bars(ax, pts, head, f"C{i}")
        for lr, vals in pts:
            ax.plot([lr] * len(vals), [100 * v for v in vals], ".", color=f"C{i}", ms=3)
    ax.set_xscale("log")
    ax.set_xlabel("Adam learning rate")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Class token or average pooling: ViT 4x64, 200 steps", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    return common.run_study(NAME, SETTINGS, cell, argv, plot=plot, summary=summary)


if __name__ == "__main__":
    main()
