"""Parameter files people pass around: read any layout, fit to a model, write any format.

  errors.py          CheckpointError: a file that cannot be read or does not fit, and
                     `mismatches`: the tensors that do not fit, named
  architecture.py    what a checkpoint's parameters say about its model; native resolution
  meta.py            what they cannot say (GELU form, LayerNorm epsilon, class names,
                     preprocessing), one record written and read once per format
  npz.py             the published .npz: every layout read, the original one written
  safetensors_io.py  the safetensors file format
  timm.py, hf.py     timm's state dict; Hugging Face ViTForImageClassification directories
  towers.py          the towers (DINOv2/v3, CLIP, SigLIP, EVA-02) by timm architecture name
  timm_eva.py        timm's Eva state dict (DINOv3, EVA-02)
  hf_towers.py       transformers folders of the towers (DINOv2/v3, CLIP, SigLIP 1/2)
  timm_recipe.py     the Python that builds timm's own model for a converted file
  _tensors.py        what the PyTorch-layout formats (timm, Hugging Face) share
  remote.py          published files at gs:// and https:// paths, fetched into a cache
  read.py            any of those -> the original-layout tree (`read_checkpoint`)
  adapt.py           a tree fitted to a model: position embeddings, patch kernel, head
  load.py            read, then adapt: `load_pretrained`, `load` / `load_model`
  onnx_export.py     the ONNX export: the graph written from the parameters
  convert.py         one converter (library side of `python -m vit_jax.convert`)
  published.py       the published checkpoints (name, data, resolution, path, accuracy)

Data walks one way, down: convert -> load -> read / adapt -> npz, timm, hf -> errors.
The names below are the ones a user needs, one import away (`from vit_jax import weights`).
"""

from vit_jax.weights.adapt import adapt
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.load import Loaded, load, load_model, load_pretrained
from vit_jax.weights.npz import canonical, load_npz, save_npz, stack_blocks, unstack_blocks
from vit_jax.weights.read import FORMATS_READ, detect_format, read_checkpoint
