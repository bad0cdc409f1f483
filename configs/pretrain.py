"""Pretrain a ViT from scratch with the paper's settings (Table 3, Appendix B.1).

The preset `pretrain` of the installed package (vit_jax/configs/pretrain.py), as a
file to pass by path or to copy as the start of your own config. These two are the same:

    python -m vit_jax.main --config=configs/pretrain.py:ARG --workdir=DIR
    python -m vit_jax.main --config=pretrain:ARG --workdir=DIR
"""

from vit_jax.configs.pretrain import get_config

__all__ = ["get_config"]
