"""The AugReg recipes: "How to train your ViT? Data, Augmentation, and Regularization in
Vision Transformers" (Steiner et al. 2021, arXiv:2106.10270), as in big_vision's
big_vision/configs/vit_i1k.py.

    python -m vit_jax.main --config=augreg:b16,imagenet2012,medium2 --workdir=DIR \
        --config.dataset.data_dir=/path/to/tfds

ARG is MODEL,DATASET,SETTING[,REG]. SETTING names the augmentation (mixup's Beta
concentration and RandAugment (layers, magnitude), vit_jax/data/randaugment.py):

    none     0.0  -          light1   0.0  (2, 0)    light2   0.2  (2, 10)
    medium1  0.2  (2, 15)    medium2  0.5  (2, 15)   strong1  0.5  (2, 20)
    strong2  0.8  (2, 20)

REG is dropout = stochastic depth, 0.0 or 0.1; by default 0.1 for B/32, B/16 and L/16
on ImageNet-1k (where the paper's Figure 4 finds it helps them; the released i1k
checkpoints use it) and 0.0 otherwise (the released ImageNet-21k checkpoints). Every
setting: Adam (b1 0.9, b2 0.999), lr 1e-3, batch 4096, 10k linear warmup steps, cosine
decay, weight decay 0.1 (decoupled, times the learning rate: 1e-4 per step at the peak,
big_vision's wd=1e-4), gradient clipping at norm 1, 224 px, a pre_logits layer, 300
epochs on ImageNet-1k (93,835 steps) and ImageNet-21k (1,039,828 steps).

What `b16,imagenet2012,strong2` should reach: the paper's Figure 4 (ImageNet-1k from
scratch, 300 epochs) puts B/16 with AugReg around 79% top-1, several points above the
plain ViT recipe; its released checkpoint from that grid,
B_16-i1k-300ep-lr_0.001-aug_strong2-wd_0.1-do_0.1-sd_0.1, scores 79.15% top-1 on the
ImageNet validation set after the paper's 20k-step fine-tune at 224 px (timm's
vit_base_patch16_224.augreg_in1k, results-imagenet.csv). big_vision's vit_i1k.py picks
medium2 for S/16, B/32, B/16 and L/16, light1 for Ti/16 and light2 for S/32.

`tiny[,SETTING]` (default medium2) is a seconds-long run on the embedded Fashion-MNIST
(fashion_mnist:tiny's model and steps with the setting's mixup and RandAugment and
dropout = stochastic depth 0.1) for tests.
"""

from __future__ import annotations

from vit_jax.configs import fashion_mnist, pretrain
from vit_jax.configs.common import MODELS

# SETTING -> (mixup concentration, RandAugment (num_layers, magnitude) or None).
SETTINGS = {
    "none": (0.0, None),
    "light1": (0.0, (2, 0)),  # "Actually not nothing!" (big_vision): see randaugment.py
    "light2": (0.2, (2, 10)),
    "medium1": (0.2, (2, 15)),
    "medium2": (0.5, (2, 15)),
    "strong1": (0.5, (2, 20)),
    "strong2": (0.8, (2, 20)),
}
REGS = (0.0, 0.1)
EPOCHS = 300
WEIGHT_DECAY = 0.1
DATASETS = {
    name: pretrain.DATASETS[name] for name in ("imagenet2012", "imagenet21k")
}  # their splits and sizes; the paper's optimizer replaces the ViT paper's
REGULARIZED = ("b32", "b16", "l16")  # REG 0.1 by default on imagenet2012


def _usage(arg: str, why: str) -> ValueError:
    return ValueError(
        f"--config=augreg:{arg}: {why}; expected MODEL,DATASET,SETTING[,REG] with MODEL in "
        f"{sorted(MODELS)}, DATASET in {sorted(DATASETS)}, SETTING in {', '.join(SETTINGS)}, "
        "REG 0.0 or 0.1 (e.g. augreg:b16,imagenet2012,medium2), or tiny[,SETTING]"
    )


def _regularize(c, setting: str, reg: float):
    mixup, randaug = SETTINGS[setting]
    c.dataset.mixup = mixup
    c.dataset.randaugment = randaug
    c.model.dropout = c.model.stochastic_depth = reg
    return c


def _tiny(arg: str, setting: str):
    if setting not in SETTINGS:
        raise _usage(arg, f"unknown SETTING {setting!r}")
    c = fashion_mnist.get_config("tiny")
    return _regularize(c, setting, 0.1)


def get_config(arg: str = "b16,imagenet2012,medium2"):
    parts = arg.split(",")
    if parts[0] == "tiny" and len(parts) <= 2:
        return _tiny(arg, parts[1] if len(parts) == 2 else "medium2")
    if len(parts) not in (3, 4):
        raise _usage(arg, "wrong number of parts")
    model, dataset, setting = parts[:3]
    if model not in MODELS or dataset not in DATASETS or setting not in SETTINGS:
        raise _usage(arg, "unknown MODEL, DATASET or SETTING")
    default_reg = 0.1 if dataset == "imagenet2012" and model in REGULARIZED else 0.0
    try:
        reg = float(parts[3]) if len(parts) == 4 else default_reg
    except ValueError:
        reg = -1.0
    if reg not in REGS:
        raise _usage(arg, f"REG {parts[3]!r} is not 0.0 or 0.1")
    # The pretraining preset's dataset, model (pre_logits) and cadence; AugReg's optimizer.
    c = pretrain.get_config(f"{model},{dataset}")
    ds = DATASETS[dataset]
    c.total_steps = EPOCHS * ds.train_examples // c.batch_size
    c.optimizer.update(
        name="adam", lr=1e-3, warmup_steps=10_000, decay="cosine",
        weight_decay=WEIGHT_DECAY, grad_clip=1.0,
    )  # fmt: skip
    return _regularize(c, setting, reg)


__all__ = ["DATASETS", "SETTINGS", "get_config"]
