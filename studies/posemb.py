"""Study 1: position embeddings (the paper's Appendix D.4, Table 8), in miniature.

The same small ViT trained from scratch on all of Fashion-MNIST with no position
information, learned 1D, learned 2D (row and column tables) and fixed sin-cos 2D
position embeddings; nothing else changes. STUDIES.md reports the result:

    python studies/posemb.py --seeds=0,1,2 --workdir=workdirs/study_posemb
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

if __package__ in (None, ""):  # `python studies/posemb.py`: import from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from studies import common  # noqa: E402

NAME = "posemb"
SETTINGS = ("none", "learned", "learned_2d", "sincos_2d")  # model.posemb values


def config(posemb: str, seed: int, quick: bool = False, steps: int = 400):
    """4 layers of width 64 on 4x4 patches of 28 px images (7x7 tokens), class token;
    Adam at 2e-3, batch 64, 400 steps (about half an epoch)."""
    from vit_jax.configs import fashion_mnist

    c = fashion_mnist.get_config("pretrain")
    c.dataset.classes = None  # all ten classes
    c.fewshot.datasets = ""
    c.model.representation_size = None
    c.model.posemb = posemb
    c.batch_size = 64
    return common.schedule(c, steps, 100, seed, quick)


def cell(setting: str, seed: int, workdir: str, quick: bool) -> dict:
    s = common.train_cell(config(setting, seed, quick), workdir)
    return {"accuracy": s["accuracy"], "steps": s["steps"], "num_params": s["num_params"]}


def plot(records: list[dict], path: str) -> None:
    common.bar_plot(
        records, path, SETTINGS, "Position embeddings: ViT 4x64, Fashion-MNIST, 400 steps"
    )


def main(argv: Sequence[str] | None = None) -> list[dict]:
    return common.run_study(NAME, SETTINGS, cell, argv, plot=plot)


if __name__ == "__main__":
    main()
