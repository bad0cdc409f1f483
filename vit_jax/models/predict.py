"""Applying a model for inference, in one place.

`logits` is the one inference call (no dropout): the training loop's jitted eval step,
classification, probabilities and features all go through it. `map_batches` runs a
jitted function over an [N, ...] array or a NaFlex batch in batches of one shape (the tail
padded, so it compiles once) and drops the padding (`in_batches`: of any function of rows).
The jitted functions are cached per model (`logits_fn`, `probabilities_fn`, `features_fn`),
so a command, the evaluators and the figures compile each once per shape, not per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import apply_with_intermediates, naflex
from vit_jax.models.vit import VisionTransformer


def logits(model: VisionTransformer, params: Any, images: jax.Array) -> jax.Array:
    """The model's inference output: images [B, H, W, C] -> logits [B, K] (traceable)."""
    return model.apply({"params": params}, images, train=False)


@functools.lru_cache(maxsize=16)
def logits_fn(model: VisionTransformer) -> Callable:
    """Jitted (params, images [B, H, W, C]) -> logits [B, K]."""
    return jax.jit(functools.partial(logits, model))


@functools.lru_cache(maxsize=16)
def probabilities_fn(model: VisionTransformer) -> Callable:
    """Jitted (params, images [B, H, W, C]) -> softmax probabilities [B, K] (float32)."""
    return jax.jit(lambda p, x: jax.nn.softmax(logits(model, p, x).astype(jnp.float32), -1))


@functools.lru_cache(maxsize=16)
def features_fn(model: VisionTransformer) -> Callable:
    """Jitted (params, images [B, H, W, C]) -> pre-logits features [B, D]."""
    # the unused intermediates are pruned by XLA
    return jax.jit(lambda p, x: apply_with_intermediates(model, p, x)[1]["pre_logits"])


def in_batches(fn: Callable, batch_size: int, *args: Any) -> Any:
    """`fn(*batch)` over `args` (arrays [N, ...] or NaFlex batches, N rows each) in batches
    of min(batch_size, N) rows, all of one shape: the tail is padded with copies of the last
    row (so a NaFlex padding row is a real input, not a row of padding alone, which no path
    promises), so it compiles once. NumPy [N, ...] out, per leaf."""
    n = len(jax.tree.leaves(args)[0])
    b = min(batch_size, n)
    args = jax.tree.map(lambda a: np.concatenate([a, np.repeat(a[-1:], -n % b, 0)]), args)
    rows = lambda i: jax.tree.map(lambda a: a[i : i + b], args)  # [b, ...] from row i
    out = [jax.device_get(fn(*rows(i))) for i in range(0, n, b)]
    return jax.tree.map(lambda *o: np.concatenate(o)[:n], *out)


def map_batches(fn: Callable, params: Any, images: Any, batch_size: int = 32) -> Any:
    """`fn(params, batch)` over `images` in batches of min(batch_size, N) (`in_batches`).

    Args:
      fn: a jitted function of (params, [b, ...]) whose outputs (any tree of arrays)
        have the batch as their leading axis.
      params: passed through.
      images: [N, ...] inputs, or a NaFlex batch (a dict of [N, ...] arrays).
      batch_size: most examples per call.

    Returns:
      The outputs for all N examples, as NumPy arrays: [N, ...] per leaf.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    x = images if naflex.is_naflex(images) else np.asarray(images, np.float32)
    if len(jax.tree.leaves(x)[0]) == 0:
        raise ValueError("no images to process")
    return in_batches(functools.partial(fn, params), batch_size, x)


def predict(model: VisionTransformer, params: Any, images: Any, batch_size: int = 32) -> np.ndarray:
    """Class probabilities [N, K] (float32, rows sum to 1) for images [N, H, W, 3] in [-1, 1]
    or a NaFlex batch of N rows."""
    return map_batches(probabilities_fn(model), params, images, batch_size)


def top_k(probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most probable classes of each row, most probable first.

    Args:
      probs: ``[N, K]`` probabilities (or any scores).
      k: How many classes; more than K gives K. Ties go to the lower index.

    Returns:
      ``(indices, values)``, both ``[N, min(k, K)]``.
    """
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    probs = np.asarray(probs)
    indices = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return indices, np.take_along_axis(probs, indices, axis=-1)


def format_predictions(
    paths: Sequence[str], indices: np.ndarray, values: np.ndarray, names: Sequence[str]
) -> str:
    """One block per image: its path, then one line per class, e.g.

    ::

      cat.jpg
         1. tabby                       81.23%  (class 281)
         2. tiger cat                   10.02%  (class 282)

    A class without a name of its own (`class 7`, see `images.class_names`) is named
    once: `1. class 7   81.23%`, with no `(class 7)` after it.
    """
    width = max((len(names[i]) for i in np.ravel(indices)), default=0)
    blocks = []
    for path, row_idx, row_val in zip(paths, indices, values, strict=True):
        lines = [str(path)]
        for rank, (i, p) in enumerate(zip(row_idx, row_val, strict=True), start=1):
            index = "" if names[i] == f"class {i}" else f"  (class {i})"
            lines.append(f"  {rank:2d}. {names[i]:<{width}}  {100 * p:6.2f}%{index}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
