"""Which patches made the decision: class-specific relevance maps.

Chefer, Gur and Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal
and Encoder-Decoder Transformers" (ICCV 2021), for a self-attention encoder: for a
target class c, each layer's attention probabilities A [H, N, N] are weighted by the
gradient of the class's logit with respect to them and averaged over the heads, keeping
the positive part,

    Ā = mean_h (∇A ⊙ A)⁺,

and the layers are rolled out from the identity, first layer first: R <- R + Ā R. Row q
of R says how much each input token is relevant to output token q for class c; the map
is the class token's row over the patches (a mean-pooled model: the mean of the patch
rows; a `map` model: its head's attention weighted the same way, mean_h (∇A ⊙ A)⁺ [1, n],
times the patches' rows of R); registers are never drawn.
Unlike attention rollout (attention.py) it differs from class to class.

The probabilities are the explicit softmax's, from the same parameters, whatever
attention a run trained with: the gradients come from the model's 'perturbations'
(layers.py adds zeros there), one backward pass for each class, vmapped over the
classes asked for. NaFlex batches (models/naflex.py) give each image's maps on its own grid
(attention.on_grids), a list.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.inspection.attention import flow, on_grids
from vit_jax.models import naflex, per_block
from vit_jax.models.predict import in_batches
from vit_jax.models.vit import VisionTransformer


def rollout_relevance(attention: jax.Array, gradients: jax.Array) -> jax.Array:
    """R = I, then R <- R + mean_h (∇A ⊙ A)⁺ R for each layer, first layer first.

    Args:
      attention: probabilities.  # [L, B, H, N, N]
      gradients: of one scalar per image (its class's logit) with respect to them.
        # [L, B, H, N, N]

    Returns:
      relevance of input tokens (columns) to output tokens (rows).  # [B, N, N]
    """
    weighted = jnp.maximum(gradients * attention, 0).mean(axis=2)  # [L, B, N, N]
    r = jnp.broadcast_to(jnp.eye(weighted.shape[-1], dtype=weighted.dtype), weighted.shape[1:])
    for layer in range(weighted.shape[0]):
        r = r + weighted[layer] @ r
    return r


BLOCK, HEAD = "MultiHeadDotProductAttention_1", ("MAPHead_0", "MultiHeadDotProductAttention_0")


def head_of(tree: Any, leaf: str) -> jax.Array:
    """A `map` model's head entry `leaf` ('attention' of its intermediates, 'probabilities'
    of perturbations' gradients).  # [B, H, 1, N]"""
    found = tree[HEAD[0]][HEAD[1]][leaf]
    return found[0] if isinstance(found, tuple) else found


def attention_of(model: VisionTransformer, params: Any, x: Any) -> tuple[jax.Array, Any]:
    """The blocks' attention [L, B, H, N, N] and a `map` model's head's [B, H, 1, N] (else
    None) of images or a NaFlex batch `x`, float32."""
    _, state = model.apply({"params": params}, x, mutable=["intermediates"])
    att, head = per_block(state["intermediates"], model, BLOCK, "attention"), None
    if model.classifier == "map":
        head = head_of(state["intermediates"], "attention").astype(jnp.float32)
    return att.astype(jnp.float32), head


@functools.lru_cache(maxsize=8)
def _relevance_fn(model: VisionTransformer):
    """Jitted (params, images [B, H, W, C] or a NaFlex batch, classes [B, K]) -> each
    patch's relevance [B, K, n] (retraced per shape)."""
    prefix, token = model.num_prefix, model.classifier == "token"
    made = lambda p, x: model.apply({"params": p}, x, mutable=["perturbations"])[1]

    @jax.jit
    def flows(params: Any, x: Any, classes: jax.Array) -> jax.Array:
        shapes = jax.eval_shape(made, params, x)["perturbations"]  # (a NaFlex table: as stored)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        rows = jnp.arange(classes.shape[0])
        valid = x["valid"] if naflex.is_naflex(x) else None

        def logit(perturbations, c):  # the sum over images of each one's class-c logit
            variables = {"params": params, "perturbations": perturbations}
            logits, state = model.apply(variables, x, mutable=["intermediates"])
            return logits[rows, c].sum(), state["intermediates"]

        def one_class(c):  # c: [B]
            grads, inter = jax.grad(logit, has_aux=True)(zeros, c)
            att = per_block(inter, model, BLOCK, "attention")
            grad = per_block(grads, model, BLOCK, "probabilities")
            head = None
            if model.classifier == "map":  # the probe's (∇A ⊙ A)⁺  [B, H, 1, N]
                head = jnp.maximum(head_of(inter, "attention") * head_of(grads, "probabilities"), 0)
            return flow(rollout_relevance(att, grad), prefix, valid, head, token)  # [B, n]

        return jax.vmap(one_class, in_axes=1, out_axes=1)(classes)  # [B, K, n]

    return flows


def relevance(
    model: VisionTransformer, params: Any, images: Any, classes: Any, batch_size: int = 8
) -> np.ndarray | list[np.ndarray]:
    """Class-specific relevance maps (Chefer et al. 2021) of a classifier.

    Args:
      model: a ViT or hybrid with a head, class token, mean- or MAP-pooled, any resolution.
      params: its parameters, adapted to the images' size.
      images: inputs in [-1, 1] [N, H, W, C], or a NaFlex batch of N rows.
      classes: the head's class indices to explain, the same for every image [K] or
        one list per image [N, K].
      batch_size: images per pass (each pass: K forward and backward passes, vmapped).

    Returns:
      maps over the patch grid, unnormalised, [N, K, gh, gw]; for a NaFlex batch a list
      of each image's [K, gh, gw].
    """
    if not model.num_classes:
        raise ValueError(
            "relevance needs the model's head: load the checkpoint with it "
            "(head=True), the maps explain its classes"
        )
    x = images if naflex.is_naflex(images) else np.asarray(images, np.float32)
    n = len(jax.tree.leaves(x)[0])
    classes = np.asarray(classes, np.int32)
    if classes.ndim == 1:
        classes = np.broadcast_to(classes, (n, len(classes)))
    bad = classes[(classes < 0) | (classes >= model.num_classes)]
    if bad.size:
        raise ValueError(
            f"class {int(bad[0])} is not one of the head's {model.num_classes} "
            f"classes (0-{model.num_classes - 1})"
        )
    flows = in_batches(functools.partial(_relevance_fn(model), params), batch_size, x, classes)
    return on_grids(flows, x if naflex.is_naflex(x) else model.grid(x.shape[1:3]))
