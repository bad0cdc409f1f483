"""The one native module: vit_jax/data/_crop_decode.c against the system's libjpeg-turbo
(Debian: apt-get install libjpeg62-turbo-dev). Optional: where its headers are missing the
build says so and goes on, the package installs without it, and only a config with
dataset.decode='crop' refuses to start (vit_jax/data/crop_decode.py). Everything else is in
pyproject.toml."""

from setuptools import Extension, setup

CROP_DECODE = Extension(
    "vit_jax.data._crop_decode",
    sources=["vit_jax/data/_crop_decode.c"],
    libraries=["jpeg"],
    optional=True,
)
setup(ext_modules=[CROP_DECODE])
