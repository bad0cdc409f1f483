#!/usr/bin/env bash
# Installs vit_jax with everything the main job, the tests and the notebooks need, and
# the embedded default dataset: Fashion-MNIST from Debian's dataset-fashion-mnist.
# With libjpeg-turbo's headers first, which the native crop decoder is built against.
# ".[all]" is the core (~450 MB: jax, flax, optax, orbax, grain, ...: all the main job
# needs) + data (TFDS datasets without TensorFlow, ~50 MB) + tf (TensorFlow, ~1.3 GB,
# for the tests alone: test_tfds, test_fewshot and test_inspect prepare TFDS datasets
# with it, test_pixels holds tf_bilinear to its decode and resize; the
# library never imports it) + plot, notebooks, test, convert and the export runtimes
# (onnxruntime, transformers; ~250 MB).
set -euo pipefail
cd "$(dirname "$0")"
PIP="python3 -m pip install -q --disable-pip-version-check"
# Outside CI a test dependency that fails to install is named and its tests skip; under
# CI=true (as .ci/run and most CI services set it) setup.sh stops instead: those tests
# must not pass by skipping (tests/conftest.py fails such skips under CI too).
missing() {
  echo "setup.sh: $1" >&2
  if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then exit 1; fi
}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
APT_UPDATED=""
apt_install() {  # Debian packages, where there is apt-get (the package lists updated once)
  command -v apt-get >/dev/null 2>&1 || return 1
  [ -n "$APT_UPDATED" ] || $SUDO apt-get update -qq >/dev/null
  APT_UPDATED=1
  $SUDO apt-get install -y -qq "$@" >/dev/null
}
# libjpeg-turbo's headers, before pip builds the package: setup.py compiles the native crop
# decoder against them (vit_jax/data/_crop_decode.c, the AugReg presets' training crops).
# Without them pip installs the package without it, and only dataset.decode='crop' refuses.
if [ ! -f /usr/include/jpeglib.h ]; then
  apt_install libjpeg62-turbo-dev 2>/dev/null || apt_install libjpeg-turbo8-dev 2>/dev/null ||
    missing "libjpeg-turbo's headers not installed (apt-get install libjpeg62-turbo-dev, or libjpeg-turbo8-dev on Ubuntu); the crop decoder and its tests will skip"
fi
# PyTorch and torchvision for the format tests and for the lines `convert --format=timm`
# prints (timm imports torchvision at start-up), installed before ".[all]" so that pip
# keeps them. The CPU builds come from PyTorch's own index (~1 GB); where it cannot be
# reached, pip takes the pair from the package registry (its Linux builds carry CUDA
# libraries: several GB, but they run on the CPU too).
pair() { python3 -c "import torch, torchvision" 2>/dev/null; }
if ! pair; then
  $PIP torch torchvision --index-url https://download.pytorch.org/whl/cpu 2>/dev/null || true
  # The registry's torchvision loads only beside the registry's torch (a CPU torch
  # already here makes pip pick a torchvision built for the other): take both from it.
  pair || $PIP --upgrade torch torchvision || true
  pair || missing "no torch/torchvision pair imports; the torch, transformers and timm tests will skip"
fi
$PIP -e ".[all]"
python3 -c "import vit_jax.data._crop_decode" 2>/dev/null ||
  missing "vit_jax's native crop decoder was not built (libjpeg-turbo's headers?); its tests will skip"
python3 -c "import vit_jax.parallel._abort" 2>/dev/null ||
  missing "vit_jax's native SIGABRT handler was not built (a C compiler?); its tests will skip"
# timm for the format tests and the printed timm lines; with torch and torchvision in
# place its other dependencies are light (pyyaml, huggingface_hub, safetensors).
$PIP timm || missing "timm not installed; the timm format tests will skip"
# The registry's CUDA torch brings Triton (a GPU kernel compiler, unused on the CPU). Triton
# and TensorFlow each carry LLVM: a process that loads both aborts ("LLVM ERROR:
# inconsistency in registered CommandLine options"), and the export tests load both.
# torch runs without it (removed last: the installs above may bring it back); a machine
# with an NVIDIA driver keeps it.
if ! command -v nvidia-smi >/dev/null 2>&1 && python3 -c "import triton" 2>/dev/null; then
  python3 -m pip uninstall -y -q triton
fi
# libtpu for the planner's tests (python -m vit_jax.plan compiles for TPU topologies on this
# CPU), the version this JAX pins for jax[tpu], in a directory of its own
# (~700 MB): installed in the environment, every `import jax` that starts the default
# backends on a host without TPUs prints libtpu's warnings. The tests put it on PYTHONPATH;
# `python -m vit_jax.plan` finds it there by itself.
# One directory per Python: each resolves its own JAX, which pins its own libtpu.
PYV=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
LIBTPU_DIR="${VIT_JAX_LIBTPU_DIR:-$HOME/.cache/vit_jax/libtpu-py$PYV}"
LIBTPU=$(python3 -c "import importlib.metadata as m, re; print(next(re.sub(r';.*', '', r).replace(' ', '') for r in m.requires('jax') if r.startswith('libtpu')))" 2>/dev/null || echo libtpu)
have_libtpu() {  # the pinned libtpu is in LIBTPU_DIR already
  python3 -c "import importlib.metadata as m, sys; from packaging.requirements import Requirement as R
r = R(sys.argv[2]); sys.exit(not any(r.specifier.contains(d.version) for d in m.distributions(path=[sys.argv[1]]) if d.metadata['Name'] == r.name))" "$LIBTPU_DIR" "$LIBTPU" 2>/dev/null
}
have_libtpu || $PIP --target "$LIBTPU_DIR" --upgrade "$LIBTPU" 2>/dev/null || true
have_libtpu || missing "$LIBTPU not installed in $LIBTPU_DIR; the planner's tests will skip"

FMNIST=/usr/share/datasets/fashion-mnist
if [ -f "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  :
elif command -v apt-get >/dev/null 2>&1; then
  apt_install dataset-fashion-mnist
else
  cat >&2 <<MSG
setup.sh: no apt-get here, so the embedded Fashion-MNIST was not installed. Download the
four idx files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) from the Fashion-MNIST project
(zalandoresearch/fashion-mnist) into a directory DIR and pass
--config.dataset.data_dir=DIR (or copy them to $FMNIST).
MSG
fi
