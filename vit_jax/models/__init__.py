"""ViT models: ``get_model(name, num_classes, **overrides)`` and helpers. No I/O.

  variants.py      the one size table (published names and short names)
  vit.py           the VisionTransformer: patches, class token, position embeddings, head
  tokens.py        the one token structure after the patch embedding: coordinates, mask
  layers.py        encoder blocks: attention, MLP, GELU forms; remat and scan
  attention.py     how attention is computed: XLA's softmax, or a fused kernel (splash, cuDNN)
  lora.py          low-rank adapters on the blocks' Dense layers: merge, split, overlay
  resnet.py        the hybrids' ResNet stem (weight-standardised convs, GroupNorm)
  posemb.py        position embeddings, learned or sin-cos, resized on their grid
  rope.py          2D rotary embeddings of queries and keys (DINOv3's, EVA-02's)
  naflex.py        NaFlex input: patches, coordinates, validity; per-image position resize
  patch_resize.py  a patch kernel at another patch size (FlexiViT's pseudo-inverse)
  predict.py       a model applied for inference (batched, padded, jitted)
Module names are the published checkpoints' parameter names: a renamed module is a
changed file format (tests/test_models.py holds the name tree).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.core import unfreeze

from vit_jax.models.layers import GELUS
from vit_jax.models.variants import RESNETS, SIZES, VARIANTS, variant_config
from vit_jax.models.vit import ORIGINAL_NUMERICS, VisionTransformer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def get_model(name: str | None, num_classes: int | None, **overrides: Any) -> VisionTransformer:
    """A VisionTransformer by published name ('ViT-B_16', 'R50+ViT-B_16', 'testing') or
    short name ('B/16', 'R50+B/16'), with any field overridden (e.g. ``patch_size=8``,
    ``classifier='gap'``, ``dtype='bfloat16'``, ``scan=True``, ``gelu='exact'``,
    ``layer_norm_eps=1e-12``). With ``name=None`` the
    overrides give every size (width, depth, num_heads, mlp_dim, patch_size)."""
    fields = set(VisionTransformer.__dataclass_fields__) - {"parent", "name"}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"unknown model option(s) {unknown}: the options are {sorted(fields)}")
    cfg = variant_config(name) if name is not None else {"resnet_stages": None}
    cfg.update(overrides)
    missing = sorted({"width", "depth", "num_heads", "mlp_dim", "patch_size"} - set(cfg))
    if missing:
        raise TypeError(f"get_model(None, ...) needs every size; missing {missing}")
    for key in ("dtype", "param_dtype"):
        if isinstance(cfg.get(key), str):
            if cfg[key] not in DTYPES:
                raise ValueError(f"unknown {key} {cfg[key]!r}: use one of {sorted(DTYPES)}")
            cfg[key] = DTYPES[cfg[key]]
    for key in ("resnet_stages", "posemb_grid"):
        if cfg.get(key) is not None:
            cfg[key] = tuple(cfg[key])
    return VisionTransformer(num_classes=num_classes, **cfg)


def param_shapes(model: VisionTransformer, image_size: int | tuple[int, int] = 224) -> dict:
    """The parameter tree of `model` at `image_size` as ShapeDtypeStructs (nothing
    allocated), a fresh dict each call. The model is traced once per size: reading a
    checkpoint checks its tensors against the model's table, then adapts them to it."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    return unfreeze(_traced_shapes(model, h, w))


@functools.lru_cache(maxsize=32)
def _traced_shapes(model: VisionTransformer, h: int, w: int) -> Any:
    x = jax.ShapeDtypeStruct((1, h, w, model.channels), jnp.float32)
    return jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)["params"]


def count_params(params: Any) -> int:
    """Number of scalars in a parameter tree (arrays or ShapeDtypeStructs)."""
    return int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))


def apply_with_intermediates(
    model: VisionTransformer, params: Any, images: jax.Array
) -> tuple[jax.Array, dict[str, Any]]:
    """Logits plus named intermediates, from the same definition.

    Returns (logits, {'pre_logits': [B, D], 'blocks': [L, B, N, D],
    'attention': [L, B, H, N, N]}), N counting the class token if there is one.
    """
    logits, state = model.apply({"params": params}, images, train=False, mutable=["intermediates"])
    inter = state["intermediates"]
    return logits, {
        "pre_logits": inter["representation"][0],
        "blocks": per_block(inter, model, "output"),
        "attention": per_block(inter, model, "MultiHeadDotProductAttention_1", "attention"),
    }


def per_block(tree: Any, model: VisionTransformer, *path: str) -> jax.Array:
    """Every block's entry at `path` of a variable collection ('intermediates', whose
    sown values are tuples of one, or 'perturbations'), stacked: [L, ...]."""
    names = ["encoderblock"] if model.scan else [f"encoderblock_{i}" for i in range(model.depth)]
    found = []
    for name in names:
        block = tree["Transformer"][name]
        for key in path:
            block = block[key]
        found.append(block[0] if isinstance(block, tuple) else block)
    return found[0] if model.scan else jnp.stack(found)
