"""Fitting an original-layout parameter tree to a model: position embeddings resized to
its grid, the patch kernel resampled to its patch size, its head kept or reset, and every
key that still does not fit named (grouped by block, with a guess of the file's variant).
"""

from __future__ import annotations

import math

import numpy as np
from flax import traverse_util

from vit_jax.models import param_shapes
from vit_jax.models.patch_resize import resample_kernel
from vit_jax.models.posemb import resize_posemb, resize_table, resize_torch
from vit_jax.models.vit import VisionTransformer
from vit_jax.weights.architecture import POSEMB, guess_variant
from vit_jax.weights.errors import CheckpointError, mismatches
from vit_jax.weights.npz import canonical, stack_blocks


def adapt(
    params: dict,
    model: VisionTransformer,
    image_size: int | tuple[int, int],
    reset_head: bool = True,
    source: str = "checkpoint",
    patch_size: int | None = None,
    said: list[str] | None = None,
    resize: str | None = None,
) -> dict:
    """`load_pretrained` for a parameter tree already in memory (original layout); `said`
    gets what was changed, in words (a run's first lines); `resize`: how the file's tool
    resizes its position table (`Meta.posemb_resize`; None: the paper's bilinear)."""
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    flat = canonical(traverse_util.flatten_dict(params, sep="/"))
    stored = dict(flat)  # as the file holds it, for the error of one that does not fit
    if patch_size is not None:
        _fit_patch(flat, model, patch_size, source)
    plain = model.clone(scan=False, remat=False)
    want = traverse_util.flatten_dict(param_shapes(plain, size), sep="/")  # key -> ShapeDtypeStruct
    _fit_head(flat, want, model, reset_head, source)
    if set(flat) != set(want):  # another architecture: named before any resize is tried
        _check_fits(flat, want, source, stored)
    _fit_posemb(flat, want, model, size, resize)
    _check_fits(flat, want, source, stored)
    if said is not None:
        said += _changes(stored, flat, model, reset_head)
    flat = {k: np.asarray(v, dtype=want[k].dtype) for k, v in flat.items()}
    return traverse_util.unflatten_dict(stack_blocks(flat) if model.scan else flat, sep="/")


def _changes(stored: dict, flat: dict, model: VisionTransformer, reset_head: bool) -> list[str]:
    """'position embeddings (1, 50, 32) -> (1, 197, 32)', ..., and what became of the head."""
    out = [
        f"{name} {tuple(stored[k].shape)} -> {tuple(flat[k].shape)}"
        for k, name in ((POSEMB, "position embeddings"), ("embedding/kernel", "patch kernel"))
        if k in stored and k in flat and stored[k].shape != flat[k].shape
    ]
    if model.num_classes and reset_head:
        return out + [f"a new zero-initialised head for {model.num_classes} classes"]
    return out + ["the file's head kept" if model.num_classes else "no head"]


def _fit_posemb(
    flat: dict, want: dict, model: VisionTransformer, size: tuple[int, int], resize: str | None
) -> None:
    """Resize stored learned position embeddings to the model's grid at `size`: the
    paper's bilinear, or PyTorch's bicubic (`resize` 'bicubic', 'bicubic_aa'), prefix
    rows kept."""
    gh, gw, k = *model.grid(size), model.posemb_prefix
    if POSEMB in flat and POSEMB in want:
        stored, wanted = flat[POSEMB].shape, want[POSEMB].shape
        if stored != wanted and stored[-1] == wanted[-1]:  # another grid, the same width
            posemb = resize_posemb(flat[POSEMB], (gh, gw), k)  # the paper's; a square grid
            if resize in ("bicubic", "bicubic_aa"):  # PyTorch's F.interpolate on that grid
                table = np.asarray(flat[POSEMB])[0]
                side = math.isqrt(len(table) - k)
                grid = table[k:].reshape(side, side, -1)
                rows = resize_torch(grid, (gh, gw), resize == "bicubic_aa").reshape(gh * gw, -1)
                posemb = np.concatenate([table[:k], rows])[None]
            flat[POSEMB] = posemb
    for k, n in ((POSEMB + "_row", gh), (POSEMB + "_col", gw)):
        if k in flat and k in want and flat[k].shape[1] != n:
            flat[k] = resize_table(flat[k], n)


def _fit_patch(flat: dict, model: VisionTransformer, patch_size: int, source: str) -> None:
    """Resample the stored patch-embedding kernel to `patch_size` (FlexiViT)."""
    if patch_size != model.patch_size:
        raise ValueError(
            f"patch_size={patch_size} but the model's is {model.patch_size}: build the model "
            f"with patch_size={patch_size} (get_model(..., patch_size={patch_size}))"
        )
    kernel = flat.get("embedding/kernel")
    if kernel is None:
        raise CheckpointError(f"{source} has no embedding/kernel to resample")
    flat["embedding/kernel"] = resample_kernel(np.asarray(kernel), patch_size)


def _fit_head(
    flat: dict, want: dict, model: VisionTransformer, reset_head: bool, source: str
) -> None:
    has_pre_logits = any(k.startswith("pre_logits/") for k in flat)
    if has_pre_logits and not model.representation_size:
        if not reset_head:
            raise CheckpointError(
                f"{source} has a pre_logits layer (width {flat['pre_logits/bias'].shape[0]}) "
                "under its head; build the model with that representation_size to use the "
                "stored head, or reset_head=True for a new one"
            )
        for k in ("pre_logits/kernel", "pre_logits/bias"):
            flat.pop(k, None)
    if not model.num_classes:
        flat.pop("head/kernel", None)
        flat.pop("head/bias", None)
    elif reset_head:
        flat["head/kernel"] = np.zeros(want["head/kernel"].shape, np.float32)
        flat["head/bias"] = np.full(want["head/bias"].shape, model.head_bias_init, np.float32)
    elif "head/bias" in flat and flat["head/bias"].shape != want["head/bias"].shape:
        raise CheckpointError(
            f"{source} has a head for {flat['head/bias'].shape[0]} classes, the model has "
            f"{model.num_classes}: build it with num_classes={flat['head/bias'].shape[0]}, or "
            "pass reset_head=True for a new zero-initialised head"
        )


def _check_fits(flat: dict, want: dict, source: str, stored: dict) -> None:
    """Raises CheckpointError naming every key that does not fit; `stored` is the tree
    as the file holds it (before the patch kernel was resampled), whose variant is
    guessed."""
    shown = mismatches(flat, want, "model expects", "not in the model", key="key ")
    if not shown:
        return
    kernel, resampled = stored.get("embedding/kernel"), flat.get("embedding/kernel")
    if kernel is not None and resampled is not None and kernel.shape != resampled.shape:
        shown.append(
            f"(the file's patch embedding is for patch {kernel.shape[0]}; it was resampled "
            f"to the model's patch {resampled.shape[0]} before the shapes were compared)"
        )
    raise CheckpointError(
        f"{source} does not fit the model:\n  "
        + "\n  ".join(shown)
        + f"\nThe file looks like {guess_variant(stored)}: is that the model "
        "you meant? (get_model(name, num_classes, **overrides))"
    )
