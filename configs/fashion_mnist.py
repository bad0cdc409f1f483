"""Fashion-MNIST from the Debian package: the paper's recipe in miniature, and a full run.

The preset `fashion_mnist` of the installed package (vit_jax/configs/fashion_mnist.py), as a
file to pass by path or to copy as the start of your own config. These two are the same:

    python -m vit_jax.main --config=configs/fashion_mnist.py:ARG --workdir=DIR
    python -m vit_jax.main --config=fashion_mnist:ARG --workdir=DIR
"""

from vit_jax.configs.fashion_mnist import get_config

__all__ = ["get_config"]
