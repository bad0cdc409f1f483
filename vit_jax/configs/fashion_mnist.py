"""Fashion-MNIST from the Debian package: the paper's recipe in miniature, and a full run.

The recipe (the README's first command; about 3 minutes on 2 CPU cores):

    python -m vit_jax.recipe --workdir=workdirs/recipe

pretrains a small ViT on classes 0-4 at 28 px (Adam, pre_logits head), fine-tunes it
on 50 labelled examples of each of classes 5-9 at 40 px (position embeddings
interpolated from 7x7 to 10x10, new zero head, SGD), and trains the same model from
scratch on that subset for comparison. Each part on its own:

    python -m vit_jax.main --config=fashion_mnist:pretrain --workdir=workdirs/fm_pre
    python -m vit_jax.main --config=fashion_mnist:finetune --workdir=workdirs/fm_ft \
        --config.init_from=workdirs/fm_pre/final.npz
    python -m vit_jax.main --config=fashion_mnist:scratch --workdir=workdirs/fm_scratch

All of Fashion-MNIST from scratch (figures in BENCHMARKS.md):

    python -m vit_jax.main --config=fashion_mnist:full --workdir=workdirs/fm_full

`tiny` is a seconds-long setting for tests.
"""

from __future__ import annotations

from vit_jax.configs.common import base
from vit_jax.data.config import FASHION_MNIST_HALVES

FIRST, SECOND = FASHION_MNIST_HALVES
ARGS = ("pretrain", "finetune", "scratch", "full", "tiny")


def small_vit(c, width=64, depth=4, heads=4, mlp=128, patch=4):
    c.model.update(
        name="Ti/4", width=width, depth=depth, num_heads=heads, mlp_dim=mlp, patch_size=patch
    )
    return c


def get_config(arg: str = "pretrain"):
    c = small_vit(base("Ti/4"))
    c.dataset.source = "idx"
    c.dataset.crop_min_area = 0.5  # 28 px images: milder crops than ImageNet's 5%
    c.batch_size = c.eval_batch_size = 256
    c.log_every = 25
    if arg == "pretrain":
        c.dataset.classes = FIRST
        c.image_size = 28
        c.batch_size = 128
        c.total_steps = 400
        c.model.representation_size = 64
        c.optimizer.update(name="adam", lr=2e-3, warmup_steps=40, decay="linear", weight_decay=0.03)
        c.eval_every = c.checkpoint_every = 200
        # The paper's cheap probe of a pretraining run: linear few-shot accuracy on all
        # ten classes (five never seen with labels) at each evaluation, with the settings
        # `python -m vit_jax.fewshot` defaults to, so that the command on final.npz prints
        # the numbers of the last evaluation.
        c.fewshot.update(datasets="fashion_mnist", batch_size=256)
    elif arg in ("finetune", "scratch"):
        c.dataset.classes = SECOND
        c.dataset.examples_per_class = 50
        c.image_size = 40
        c.batch_size = 64
        c.total_steps = 200
        c.log_every = 20
        c.optimizer.warmup_steps = 20  # otherwise the base's SGD: lr 0.03, momentum 0.9, cosine
        c.eval_every = c.checkpoint_every = 200
        c.init_from = "pretrain/final.npz" if arg == "finetune" else ""
    elif arg == "full":
        # 307k parameters; mean-pooled tokens, MLP ratio 4 as in the paper, label
        # smoothing and milder crops: 18 epochs, about 45 minutes alone on 2 CPU cores,
        # 90.3% test accuracy (BENCHMARKS.md).
        c = small_vit(c, width=64, depth=6, heads=4, mlp=256, patch=4)
        c.model.classifier = "gap"
        c.dataset.crop_min_area = 0.85
        c.dataset.label_smoothing = 0.1
        c.image_size = 28
        c.batch_size = 128
        c.total_steps = 8400  # 18 epochs
        c.optimizer.update(name="adam", lr=2e-3, warmup_steps=500, weight_decay=0.05)
        c.log_every = 200
        c.eval_every = c.checkpoint_every = 1200
    elif arg == "tiny":
        c = small_vit(c, width=32, depth=2, heads=2, mlp=64, patch=7)
        c.dataset.train_split, c.dataset.test_split = "train[:512]", "test[:256]"
        c.image_size = 28
        c.batch_size = c.eval_batch_size = 64
        c.total_steps = 20
        c.log_every = 5
        c.eval_every = c.checkpoint_every = 10
        c.optimizer.update(name="adam", lr=3e-3, warmup_steps=2, decay="linear")
        c.progress_bars = False
    else:
        raise ValueError(f"--config=fashion_mnist:{arg}: expected one of {', '.join(ARGS)}")
    return c
