"""Fine-tune a published checkpoint, with the paper's fine-tuning settings.

    python -m vit_jax.main --config=finetune:b16,cifar10 --workdir=workdirs/b16_cifar10 \
        --config.init_from=/path/to/ViT-B_16.npz --config.dataset.data_dir=/path/to/tfds

SGD with momentum 0.9, batch 512, no weight decay, gradient clipping at norm 1,
500 warmup steps then cosine decay (the defaults of common.base); 10k steps on CIFAR,
20k on ImageNet, 500 on Pets and Flowers; resolution 384 (512 for L/16, 518 for H/14).
The paper sweeps the learning rate over {0.001, 0.003, 0.01, 0.03}; 0.03 is the
default here. Expected (paper, ImageNet-21k pretraining): ViT-B/16 on CIFAR-10 about
98.1%, ViT-L/16 on ImageNet 85.3% (at 512).

MODEL is one of the keys of common.MODELS; DATASET one of DATASETS.
"""

from __future__ import annotations

from vit_jax.configs.common import MODELS, TfdsData, base, parse_model_dataset

DATASETS = {
    "cifar10": TfdsData("cifar10", "train[:98%]", "test", steps=10_000),
    "cifar100": TfdsData("cifar100", "train[:98%]", "test", steps=10_000),
    "imagenet2012": TfdsData("imagenet2012", "train[:99%]", "validation", steps=20_000),
    "oxford_iiit_pet": TfdsData("oxford_iiit_pet", "train[:90%]", "test", steps=500),
    "oxford_flowers102": TfdsData("oxford_flowers102", "train", "test", steps=500),
}
RESOLUTION = {"ViT-L_16": 512, "ViT-H_14": 518}


def get_config(arg: str = "b16,cifar10"):
    name, ds = parse_model_dataset("finetune", arg, DATASETS)
    c = base(name)
    ds.apply(c)
    c.init_from = f"{name}.npz"
    c.image_size = RESOLUTION.get(name, 384)
    c.total_steps = ds.steps
    c.optimizer.warmup_steps = min(500, ds.steps // 10)
    c.eval_every = c.checkpoint_every = max(ds.steps // 10, 100)
    return c


__all__ = ["DATASETS", "MODELS", "RESOLUTION", "get_config"]
