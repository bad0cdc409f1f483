"""Pretrain a ViT from scratch with the paper's settings (Table 3, Appendix B.1).

    python -m vit_jax.main --config=configs/pretrain.py:b16,imagenet21k \
        --workdir=workdirs/b16_i21k \
        --config.dataset.data_dir=/path/to/tfds

Adam (b1 0.9, b2 0.999), batch 4096, 10k linear warmup steps, decoupled weight
decay (scaled by the learning rate, kernels only) of 0.03 on ImageNet-21k and 0.3
on ImageNet (0.1 on JFT-300M), linear decay (cosine on ImageNet), dropout 0.1,
gradient clipping at norm 1 on ImageNet, a tanh pre_logits layer of width D.
Learning rate 1e-3 (ImageNet-21k, 90 epochs) and 3e-3 (ImageNet, 300 epochs).
The result is then fine-tuned with configs/vit.py (--config.init_from=WORKDIR/final.npz).
"""

from __future__ import annotations

from configs.common import base
from configs.vit import MODELS
from vit_jax.models import variant_config

# TFDS name, train split, test split, epochs, lr, weight decay, decay, dropout, clip
DATASETS = {
    "imagenet21k": (
        "imagenet21k",
        "train[:99%]",
        "train[99%:]",
        90,
        1e-3,
        0.03,
        "linear",
        0.1,
        0.0,
    ),
    "imagenet2012": (
        "imagenet2012",
        "train[:99%]",
        "validation",
        300,
        3e-3,
        0.3,
        "cosine",
        0.1,
        1.0,
    ),
}
TRAIN_EXAMPLES = {"imagenet21k": 14_197_122, "imagenet2012": 1_281_167}


def get_config(arg: str = "b16,imagenet21k"):
    model, dataset = arg.split(",")
    if model not in MODELS or dataset not in DATASETS:
        raise ValueError(
            f"configs/pretrain.py:{arg}: expected MODEL,DATASET with MODEL in "
            f"{sorted(MODELS)} and DATASET in {sorted(DATASETS)}"
        )
    name, (tfds_name, train, test, epochs, lr, wd, decay, dropout, clip) = (
        MODELS[model],
        DATASETS[dataset],
    )
    c = base(name)
    c.dataset.source, c.dataset.name = "tfds", tfds_name
    c.dataset.train_split, c.dataset.test_split = train, test
    c.dataset.shuffle_buffer = 250_000
    c.image_size = 224
    c.batch_size = c.eval_batch_size = 4096
    c.total_steps = epochs * TRAIN_EXAMPLES[dataset] // c.batch_size
    c.model.representation_size = variant_config(name)["width"]
    c.model.dropout = dropout
    c.optimizer.update(
        name="adam",
        lr=lr,
        warmup_steps=10_000,
        decay=decay,
        b1=0.9,
        b2=0.999,
        weight_decay=wd,
        grad_clip=clip,
    )
    c.eval_every = c.checkpoint_every = 5000
    return c
