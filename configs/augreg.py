"""The AugReg recipes (Steiner et al. 2021): RandAugment, mixup, dropout and stochastic depth.

The preset `augreg` of the installed package (vit_jax/configs/augreg.py), as a
file to pass by path or to copy as the start of your own config. These two are the same:

    python -m vit_jax.main --config=configs/augreg.py:ARG --workdir=DIR
    python -m vit_jax.main --config=augreg:ARG --workdir=DIR
"""

from vit_jax.configs.augreg import get_config

__all__ = ["get_config"]
