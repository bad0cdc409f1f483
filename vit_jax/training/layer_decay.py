"""Layer-wise learning-rate decay (BEiT; timm's `param_groups_layer_decay`): the
optimizer's updates scaled per layer, the blocks nearer the input by less
(config.optimizer.layer_decay)."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

# Layer 0: what comes before the blocks (at the top or in Transformer/)
STEM = re.compile(r"embedding|cls|reg|pre_norm|posembed_input|conv_root|gn_root|block\d+")


def layer_scales(params: Any, decay: float) -> Any:
    """Each parameter's scale, decay^(depth + 1 - id) as timm computes it: id 0 for what
    comes before the blocks (STEM), i + 1 for block i (encoder_norm: the last block's, as
    timm's `norm`), depth + 1 (scale 1) for the rest (fc_norm, MAPHead_0, pre_logits,
    head). Stacked blocks (scan) take one scale per block on their leading axis. The depth
    is read from the tree, which may be LoRA's (adapters and head)."""
    keys = lambda path: [str(getattr(k, "key", k)) for k in path] + [""]
    blocks = {}  # encoderblock_{i}: ..., or encoderblock: the depth of the stacked blocks
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        top, sub = keys(path)[:2]
        if top == "Transformer" and sub.startswith("encoderblock"):
            blocks[sub] = leaf.shape[0]
    depth = blocks.pop("encoderblock", len(blocks))

    def scale(path, leaf):
        top, sub = keys(path)[:2]
        if top == "Transformer" and sub == "encoderblock":  # [L, ...]: block i's at i
            return (decay ** np.arange(depth, 0, -1)).reshape(-1, *[1] * (leaf.ndim - 1))
        if top == "Transformer" and sub.startswith("encoderblock_"):
            return decay ** (depth - int(sub.removeprefix("encoderblock_")))
        name = sub if top == "Transformer" else top
        if name == "encoder_norm":
            return decay
        return decay ** (depth + 1) if STEM.fullmatch(name) else 1.0

    return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_layer(decay: float) -> optax.GradientTransformation:
    """Each update times its `layer_scales`: placed after the learning rate, as timm's
    lr_scale multiplies the learning rate and so the decoupled weight decay with it."""
    scaled = lambda u, s: u * jnp.asarray(s, u.dtype)
    return optax.stateless(lambda u, _: jax.tree.map(scaled, u, layer_scales(u, decay)))
