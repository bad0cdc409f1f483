"""Fine-tune a published checkpoint, with the paper's fine-tuning settings.

The preset `finetune` of the installed package (vit_jax/configs/finetune.py), as a
file to pass by path or to copy as the start of your own config. These two are the same:

    python -m vit_jax.main --config=configs/finetune.py:ARG --workdir=DIR
    python -m vit_jax.main --config=finetune:ARG --workdir=DIR
"""

from vit_jax.configs.finetune import get_config

__all__ = ["get_config"]
