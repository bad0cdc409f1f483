"""The two native modules, both optional (where one cannot be built the build says so and
goes on, and the package installs without it); everything else is in pyproject.toml.
- vit_jax/data/_crop_decode.c against the system's libjpeg-turbo (Debian: apt-get install
  libjpeg62-turbo-dev): without it only a config with dataset.decode='crop' refuses to
  start (vit_jax/data/crop_decode.py).
- vit_jax/parallel/_abort.c, a SIGABRT handler that judges a multi-process run's aborts
  without Python (parallel/distributed.py): without it an abort keeps JAX's own status."""

from setuptools import Extension, setup

CROP_DECODE = Extension(
    "vit_jax.data._crop_decode",
    sources=["vit_jax/data/_crop_decode.c"],
    libraries=["jpeg"],
    optional=True,
)
ABORT = Extension("vit_jax.parallel._abort", sources=["vit_jax/parallel/_abort.c"], optional=True)
setup(ext_modules=[CROP_DECODE, ABORT])
