"""Which patches made the decision: class-specific relevance maps.

Chefer, Gur and Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal
and Encoder-Decoder Transformers" (ICCV 2021), for a self-attention encoder: for a
target class c, each layer's attention probabilities A [H, N, N] are weighted by the
gradient of the class's logit with respect to them and averaged over the heads, keeping
the positive part,

    Ā = mean_h (∇A ⊙ A)⁺,

and the layers are rolled out from the identity, first layer first: R <- R + Ā R. Row q
of R says how much each input token is relevant to output token q for class c; the map
is the class token's row over the patches (a mean-pooled model: the mean of the rows).
Unlike attention rollout (attention.py) it differs from class to class.

The probabilities are the explicit softmax's, from the same parameters, whatever
attention a run trained with: the gradients come from the model's 'perturbations'
(layers.py adds zeros there), one backward pass for each class, vmapped over the
classes asked for.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.inspection.attention import rollout_maps
from vit_jax.models import per_block
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


@functools.lru_cache(maxsize=8)
def _relevance_fn(model: VisionTransformer, image_shape: tuple[int, ...]):
    """Jitted (params, images [B, H, W, C], classes [B, K]) -> maps [B, K, gh, gw]."""
    prefix, grid = int(model.has_class_token), model.grid(image_shape[1:3])
    init = lambda x: model.init(jax.random.key(0), x)["perturbations"]
    shapes = jax.eval_shape(init, jax.ShapeDtypeStruct(image_shape, jnp.float32))

    @jax.jit
    def maps(params: Any, images: jax.Array, classes: jax.Array) -> jax.Array:
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        rows = jnp.arange(images.shape[0])

        def logit(perturbations, c):  # the sum over images of each one's class-c logit
            variables = {"params": params, "perturbations": perturbations}
            logits, state = model.apply(variables, images, mutable=["intermediates"])
            return logits[rows, c].sum(), state["intermediates"]

        def one_class(c):  # c: [B]
            grads, inter = jax.grad(logit, has_aux=True)(zeros, c)
            att = per_block(inter, model, "MultiHeadDotProductAttention_1", "attention")
            grad = per_block(grads, model, "MultiHeadDotProductAttention_1", "probabilities")
            return rollout_maps(rollout_relevance(att, grad), grid, prefix)  # [B, gh, gw]

        return jax.vmap(one_class, in_axes=1, out_axes=1)(classes)  # [B, K, gh, gw]

    return maps


def relevance(
    model: VisionTransformer, params: Any, images: np.ndarray, classes: Any, batch_size: int = 8
) -> np.ndarray:
    """Class-specific relevance maps (Chefer et al. 2021) of a classifier.

    Args:
      model: a ViT or hybrid with a head, class token or mean-pooled, any resolution.
      params: its parameters, adapted to the images' size.
      images: inputs in [-1, 1].  # [N, H, W, C]
      classes: the head's class indices to explain, the same for every image [K] or
        one list per image [N, K].
      batch_size: images per pass (each pass: K forward and backward passes, vmapped).

    Returns:
      maps over the patch grid, unnormalised.  # [N, K, gh, gw]
    """
    if not model.num_classes:
        raise ValueError(
            "relevance needs the model's head: load the checkpoint with it "
            "(head=True), the maps explain its classes"
        )
    images = np.asarray(images, np.float32)
    classes = np.asarray(classes, np.int32)
    if classes.ndim == 1:
        classes = np.broadcast_to(classes, (len(images), len(classes)))
    bad = classes[(classes < 0) | (classes >= model.num_classes)]
    if bad.size:
        raise ValueError(
            f"class {int(bad[0])} is not one of the head's {model.num_classes} "
            f"classes (0-{model.num_classes - 1})"
        )
    n, b = len(images), min(batch_size, len(images))
    pad = -n % b  # the last batch padded to the compiled size, then dropped
    images = np.concatenate([images, np.zeros((pad, *images.shape[1:]), np.float32)])
    classes = np.concatenate([classes, np.zeros((pad, classes.shape[1]), np.int32)])
    fn = _relevance_fn(model, (b, *images.shape[1:]))
    out = [np.asarray(fn(params, images[i : i + b], classes[i : i + b])) for i in range(0, n, b)]
    return np.concatenate(out)[:n]
