"""Pretrain a ViT from scratch with the paper's settings (Table 3, Appendix B.1).

    python -m vit_jax.main --config=pretrain:b16,imagenet21k --workdir=workdirs/b16_i21k \
        --config.dataset.data_dir=/path/to/tfds

Adam (b1 0.9, b2 0.999), batch 4096, 10k linear warmup steps, decoupled weight
decay (scaled by the learning rate, kernels only) of 0.03 on ImageNet-21k and 0.3
on ImageNet (0.1 on JFT-300M), linear decay (cosine on ImageNet), dropout 0.1,
gradient clipping at norm 1 on ImageNet, a tanh pre_logits layer of width D.
Learning rate 1e-3 (ImageNet-21k, 90 epochs) and 3e-3 (ImageNet, 300 epochs).
The result is then fine-tuned with the finetune preset (--config.init_from=WORKDIR/final.npz).
"""

from __future__ import annotations

import dataclasses

from vit_jax.configs.common import MODELS, TfdsData, base, parse_model_dataset
from vit_jax.models import variant_config


@dataclasses.dataclass(frozen=True)
class Pretraining(TfdsData):
    """A pretraining dataset and the paper's settings for it."""

    train_examples: int = 0
    epochs: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    decay: str = "linear"
    dropout: float = 0.0
    grad_clip: float = 0.0


DATASETS = {
    "imagenet21k": Pretraining("imagenet21k", "train[:99%]", "train[99%:]",
                               train_examples=14_197_122, epochs=90, lr=1e-3, weight_decay=0.03,
                               dropout=0.1),
    "imagenet2012": Pretraining("imagenet2012", "train[:99%]", "validation",
                                train_examples=1_281_167, epochs=300, lr=3e-3, weight_decay=0.3,
                                decay="cosine", dropout=0.1, grad_clip=1.0),
}  # fmt: skip


def get_config(arg: str = "b16,imagenet21k"):
    name, ds = parse_model_dataset("pretrain", arg, DATASETS)
    c = base(name)
    ds.apply(c)
    c.image_size = 224
    c.batch_size = c.eval_batch_size = 4096
    c.total_steps = ds.epochs * ds.train_examples // c.batch_size
    c.model.representation_size = variant_config(name)["width"]
    c.model.dropout = ds.dropout
    c.optimizer.update(
        name="adam",
        lr=ds.lr,
        warmup_steps=10_000,
        decay=ds.decay,
        weight_decay=ds.weight_decay,
        grad_clip=ds.grad_clip,
    )
    c.eval_every = c.checkpoint_every = 5000
    return c


__all__ = ["DATASETS", "MODELS", "get_config"]
