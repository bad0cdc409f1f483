"""The AugReg recipes: "How to train your ViT? Data, Augmentation, and Regularization in
Vision Transformers" (Steiner et al. 2021, arXiv:2106.10270), as big_vision trains them
(big_vision/configs/vit_i1k.py and vit_i21k.py).

    python -m vit_jax.main --config=augreg:b16,imagenet2012,medium2 --workdir=DIR \
        --config.dataset.data_dir=/path/to/tfds

ARG is MODEL,DATASET,SETTING[,REG]. SETTING names the augmentation (mixup's Beta
concentration and RandAugment (layers, magnitude), vit_jax/data/randaugment.py):

    none     0.0  -          light1   0.0  (2, 0)    light2   0.2  (2, 10)
    medium1  0.2  (2, 15)    medium2  0.5  (2, 15)   strong1  0.5  (2, 20)
    strong2  0.8  (2, 20)

big_vision's default SETTING per model (its configs' comment: "a good average between
30ep and 300ep"): ImageNet-1k Ti/16 light1, S/32 medium1, S/16, B/32, B/16 and L/16
medium2; ImageNet-21k Ti/16 and S/32 none, S/16 light1, B/32 and B/16 light2, L/16
medium2. Here SETTING is always named.

Point by point, big_vision's value and this preset's:

    option               big_vision                     here
    loss                 sigmoid_xent                   sigmoid_xent (loss)
    head bias at init    -6.9 (i1k), -10 (i21k)         same (model.head_bias_init)
    head kernel at init  zeros                          zeros
    optimizer            scale_by_adam, b1 .9, b2 .999  adam, same
    Adam's first moment  bfloat16 (mu_dtype)            bfloat16 (optimizer.mu_dtype)
    lr, warmup, decay    1e-3, 10k steps, cosine        same
    weight decay         1e-4 per step (wd, decoupled)  0.1 x lr: 1e-4 at the peak
    gradient clipping    global norm 1                  same
    batch, resolution    4096, 224 px                   same
    train split (i1k)    train[:99%], 300 epochs        same: 92,897 steps
    train split (i21k)   full[51200:], 300 epochs       train[:99%], 300 epochs of it
    mixup                one Beta(a, a) weight per      same, without the fold
                         batch, folded to max(w, 1-w),  (equal in distribution: see
                         partner = the batch rolled     data/augment.py's mixup)
    training crop        decode_and_crop_jpeg: only     same, bit-exact (tests;
                         the window is decoded          dataset.decode='crop')
    RandAugment          2 layers, magnitude 0-20       same ops, bit-exact (tests)
    Posterize above 22.5 1 bit (TF's shift wraps)       same
    pooling (i21k)       'gap' in vit_i21k.py           class token, as the released
                                                        AugReg files have
    dropout, stoch depth none in the configs            0.1 for B/32, B/16, L/16 on
                                                        i1k (REG below)

REG is dropout = stochastic depth, 0.0 or 0.1; by default 0.1 for B/32, B/16 and L/16
on ImageNet-1k and 0.0 otherwise. big_vision's configs set none ("does NOT include
regularization ... shown to help with B/32, B/16, L/16 models in the paper (Figure
4)"); the released ImageNet-1k checkpoints of those models were trained with it (their
names end in do_0.1-sd_0.1) and the released ImageNet-21k ones without (do_0.0-sd_0.0):
this preset follows the released files, and `,0.0` gives big_vision's config.

What `b16,imagenet2012,strong2` should reach: the paper's Figure 4 (ImageNet-1k from
scratch, 300 epochs) puts B/16 with AugReg around 79% top-1, several points above the
plain ViT recipe; its released checkpoint from that grid,
B_16-i1k-300ep-lr_0.001-aug_strong2-wd_0.1-do_0.1-sd_0.1, scores 79.15% top-1 on the
ImageNet validation set after the paper's 20k-step fine-tune at 224 px (timm's
vit_base_patch16_224.augreg_in1k, results-imagenet.csv).

`tiny[,SETTING]` (default medium2) is a seconds-long run on the embedded Fashion-MNIST
(fashion_mnist:tiny's model and steps with the setting's mixup and RandAugment,
dropout = stochastic depth 0.1, the sigmoid loss with the head's bias at -log(10), and
the bfloat16 first moment) for tests.
"""

from __future__ import annotations

import math

from vit_jax.configs import fashion_mnist, pretrain
from vit_jax.configs.common import MODELS
from vit_jax.data import splits

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
HEAD_BIAS = {"imagenet2012": -6.9, "imagenet21k": -10.0}  # big_vision's init_head_bias


def _usage(arg: str, why: str) -> ValueError:
    return ValueError(
        f"--config=augreg:{arg}: {why}; expected MODEL,DATASET,SETTING[,REG] with MODEL in "
        f"{sorted(MODELS)}, DATASET in {sorted(DATASETS)}, SETTING in {', '.join(SETTINGS)}, "
        "REG 0.0 or 0.1 (e.g. augreg:b16,imagenet2012,medium2), or tiny[,SETTING]"
    )


def _augreg(c, setting: str, reg: float, head_bias: float):
    """`c` with the setting's augmentation, REG, and big_vision's loss and Adam state."""
    mixup, randaug = SETTINGS[setting]
    c.dataset.mixup = mixup
    c.dataset.randaugment = randaug
    c.dataset.decode = "crop"  # big_vision's decode_jpeg_and_inception_crop
    c.model.dropout = c.model.stochastic_depth = reg
    c.loss = "sigmoid_xent"
    c.model.head_bias_init = head_bias
    c.optimizer.mu_dtype = "bfloat16"
    return c


def _tiny(arg: str, setting: str):
    if setting not in SETTINGS:
        raise _usage(arg, f"unknown SETTING {setting!r}")
    c = fashion_mnist.get_config("tiny")
    return _augreg(c, setting, 0.1, round(-math.log(10), 2))  # -log(classes), as -6.9


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
    # The pretraining preset's dataset, model (pre_logits), cadence and optimizer (Adam,
    # 10k warmup steps), with AugReg's learning rate, decay, weight decay and clipping.
    c = pretrain.get_config(f"{model},{dataset}")
    train = splits.resolve(c.dataset.train_split, DATASETS[dataset].train_examples)  # train[:99%]
    c.total_steps = EPOCHS * train.size // c.batch_size
    c.optimizer.update(lr=1e-3, decay="cosine", weight_decay=WEIGHT_DECAY, grad_clip=1.0)
    return _augreg(c, setting, reg, HEAD_BIAS[dataset])


__all__ = ["DATASETS", "SETTINGS", "get_config"]
