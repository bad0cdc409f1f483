"""Fine-tune a published checkpoint, with the paper's fine-tuning settings.

    python -m vit_jax.main --config=configs/vit.py:b16,cifar10 --workdir=workdirs/b16_cifar10 \
        --config.init_from=/path/to/ViT-B_16.npz --config.dataset.data_dir=/path/to/tfds

SGD with momentum 0.9, batch 512, no weight decay, gradient clipping at norm 1,
500 warmup steps then cosine decay; 10k steps on CIFAR, 20k on ImageNet, 500 on
Pets and Flowers; resolution 384 (512 for L/16, 518 for H/14). The paper sweeps the
learning rate over {0.001, 0.003, 0.01, 0.03}; 0.03 is the default here. Expected
(paper, ImageNet-21k pretraining): ViT-B/16 on CIFAR-10 about 98.1%, ViT-L/16 on
ImageNet 85.3% (at 512).

MODEL is one of the keys of MODELS; DATASET one of DATASETS.
"""

from __future__ import annotations

from configs.common import base

MODELS = {
    "ti16": "ViT-Ti_16",
    "s16": "ViT-S_16",
    "s32": "ViT-S_32",
    "b8": "ViT-B_8",
    "b16": "ViT-B_16",
    "b32": "ViT-B_32",
    "l16": "ViT-L_16",
    "l32": "ViT-L_32",
    "h14": "ViT-H_14",
    "r_ti16": "R+ViT-Ti_16",
    "r26_s32": "R26+ViT-S_32",
    "r26_b32": "R26+ViT-B_32",
    "r50_b16": "R50+ViT-B_16",
    "r50_l32": "R50+ViT-L_32",
}
# TFDS name, train split, test split, fine-tuning steps
DATASETS = {
    "cifar10": ("cifar10", "train[:98%]", "test", 10_000),
    "cifar100": ("cifar100", "train[:98%]", "test", 10_000),
    "imagenet2012": ("imagenet2012", "train[:99%]", "validation", 20_000),
    "oxford_iiit_pet": ("oxford_iiit_pet", "train[:90%]", "test", 500),
    "oxford_flowers102": ("oxford_flowers102", "train", "test", 500),
}
RESOLUTION = {"ViT-L_16": 512, "ViT-H_14": 518}


def get_config(arg: str = "b16,cifar10"):
    model, dataset = arg.split(",")
    if model not in MODELS or dataset not in DATASETS:
        raise ValueError(
            f"configs/vit.py:{arg}: expected MODEL,DATASET with MODEL in "
            f"{sorted(MODELS)} and DATASET in {sorted(DATASETS)}"
        )
    name = MODELS[model]
    c = base(name)
    tfds_name, train, test, steps = DATASETS[dataset]
    c.init_from = f"{name}.npz"
    c.dataset.source = "tfds"
    c.dataset.name, c.dataset.train_split, c.dataset.test_split = tfds_name, train, test
    c.dataset.shuffle_buffer = 50_000 if dataset != "imagenet2012" else 250_000
    c.image_size = RESOLUTION.get(name, 384)
    c.total_steps = steps
    c.optimizer.update(
        name="sgd",
        lr=0.03,
        warmup_steps=min(500, steps // 10),
        decay="cosine",
        momentum=0.9,
        weight_decay=0.0,
        grad_clip=1.0,
    )
    c.eval_every = c.checkpoint_every = max(steps // 10, 100)
    return c
