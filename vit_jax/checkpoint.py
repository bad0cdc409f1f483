"""The published ViT checkpoints (.npz): read any layout, adapt to a model, write back.

Layouts read by `load_npz` (keys joined with '/'):
  original   embedding/, cls, Transformer/posembed_input/pos_embedding [1, N+1, D],
             Transformer/encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_1,
             LayerNorm_2, MlpBlock_3}, Transformer/encoder_norm, [pre_logits/], head/;
             hybrids add conv_root, gn_root, block{s}/unit{u}/{conv,gn}*. Older hybrid
             files store GroupNorm scale/bias as [1, 1, 1, C].
  opt/target/...  the same nested under an optimizer's target.
  big_vision params/ prefix; top-level pos_embedding [1, N, D] without a class row;
             per-type numbering (LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1,
             MlpBlock_0); optionally all blocks stacked under Transformer/encoderblock/.
All are turned into the original layout, which is also the parameter tree of this
package's models (with scan=False) and what `save_npz` writes. A big_vision file's
class token had no position embedding, so its class row is zero here: same function.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax import architecture, files
from vit_jax.architecture import POSEMB, CheckpointError, guess_variant
from vit_jax.models import get_model, param_shapes
from vit_jax.models.patch_resize import resample_kernel
from vit_jax.models.posemb import resize_posemb, resize_table
from vit_jax.models.vit import VisionTransformer

__all__ = [
    "CheckpointError",
    "adapt",
    "canonical",
    "load_model",
    "load_npz",
    "load_pretrained",
    "save_npz",
    "stack_blocks",
    "unstack_blocks",
]
_NEW_TO_OLD = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


# ---------------------------------------------------------------- trees


def unstack_blocks(flat: dict[str, Any]) -> dict[str, Any]:
    """Scanned blocks (Transformer/encoderblock/..., leading depth axis) -> encoderblock_{i}."""
    out = {}
    for k, v in flat.items():
        if k.startswith("Transformer/encoderblock/"):
            rest = k[len("Transformer/encoderblock/") :]
            for i in range(v.shape[0]):
                out[f"Transformer/encoderblock_{i}/{rest}"] = v[i]
        else:
            out[k] = v
    return out


def stack_blocks(flat: dict[str, Any]) -> dict[str, Any]:
    """encoderblock_{i} -> Transformer/encoderblock/... stacked (for models with scan=True)."""
    out, per = {}, {}
    for k, v in flat.items():
        m = re.match(r"Transformer/encoderblock_(\d+)/(.*)", k)
        if m:
            per.setdefault(m[2], {})[int(m[1])] = v
        else:
            out[k] = v
    for rest, layers in per.items():
        out[f"Transformer/encoderblock/{rest}"] = np.stack([layers[i] for i in sorted(layers)])
    return out


# ---------------------------------------------------------------- reading and writing


def _read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All arrays of an .npz, never unpickling; errors name the file and the way out."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {path}: no such file. Published checkpoints are "
            "the .npz files released with the paper; download one first"
        )
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise CheckpointError(
                f"checkpoint {path} is a single .npy array, not an .npz archive of named parameters"
            )
        with npz:
            return {k: npz[k] for k in npz.files}
    except CheckpointError:
        raise
    except ValueError as e:
        if "pickle" in str(e) or "Object arrays" in str(e):
            raise CheckpointError(
                f"checkpoint {path} holds pickled Python objects; they are never loaded (that "
                "would run code from the file). Re-save it with plain arrays (numpy.savez)"
            ) from e
        raise CheckpointError(f"checkpoint {path} is not a readable .npz archive: {e}") from e
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as e:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(e).__name__}: "
            f"{e}); download or copy it again"
        ) from e


def canonical(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Any published layout (flat keys) -> the original layout."""
    for prefix in ("opt/target/", "params/"):
        if flat and all(k.startswith(prefix) for k in flat):
            flat = {k[len(prefix) :]: v for k, v in flat.items()}
    flat = unstack_blocks(flat)
    if any("/MultiHeadDotProductAttention_0/" in k for k in flat):  # big_vision numbering

        def rename(k: str) -> str:
            parts = k.split("/")
            if len(parts) > 2 and parts[1].startswith("encoderblock_"):
                parts[2] = _NEW_TO_OLD.get(parts[2], parts[2])
            return "/".join(parts)

        flat = {rename(k): v for k, v in flat.items()}
    if "pos_embedding" in flat:  # big_vision: no class row
        pe = flat.pop("pos_embedding")
        if "cls" in flat:
            pe = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
        flat[POSEMB] = pe
    for k, v in flat.items():
        if re.search(r"(^|/)gn[^/]*/(scale|bias)$", k) and v.ndim == 4:
            flat[k] = v.reshape(-1)  # older hybrid files: [1, 1, 1, C]
    return flat


def load_npz(path: str | os.PathLike) -> dict:
    """A published .npz (any layout above) -> a parameter tree for this package's models.

    Raises:
      FileNotFoundError: no such file.
      CheckpointError: truncated or corrupt, pickled objects, not an .npz archive.
    """
    return traverse_util.unflatten_dict(canonical(_read(path)), sep="/")


def save_npz(path: str | os.PathLike, params: dict) -> None:
    """Write `params` in the original published layout (per-block names, float32).

    The file is written whole to a temporary name and then renamed, so a crash
    never leaves a half-written checkpoint at `path`; a failed write (a full disk)
    removes the temporary file.
    """
    if set(params) == {"params"}:
        params = params["params"]
    flat = unstack_blocks(traverse_util.flatten_dict(params, sep="/"))
    arrays = {}
    for k, v in flat.items():
        a = np.asarray(v)
        arrays[k] = a.astype(np.float32) if a.dtype.kind == "V" or a.dtype.itemsize < 4 else a
    with files.atomic_write(path) as f:
        np.savez(f, **arrays)


# ---------------------------------------------------------------- adapting to a model


def load_pretrained(
    path: str | os.PathLike,
    model: VisionTransformer,
    image_size: int | tuple[int, int],
    reset_head: bool = True,
    patch_size: int | None = None,
) -> dict:
    """Parameters of the checkpoint at `path` for `model` at `image_size`.

    `path` is any format `formats.read_checkpoint` reads: a published .npz, a timm
    .safetensors file, a Hugging Face directory, or a remote path of a published file.
    With `patch_size` (the model's own, e.g. 8 for a file trained with 16) the
    patch-embedding kernel is resampled by the pseudo-inverse resize (FlexiViT; see
    models/patch_resize.py) and the position embeddings are resized to the new grid.

    Position embeddings are resized on their grid as the original code does (bilinear,
    class row kept; also to non-square sizes such as (384, 512)); `pre_logits` is dropped
    when the model has no representation layer; with `reset_head` the head is replaced
    by a zero-initialised one for the model's classes, without it the stored head is
    kept. The result is in the model's layout (blocks stacked if `model.scan`).

    Raises:
      FileNotFoundError, CheckpointError: unreadable file, or one that does not fit
        `model` (each missing, extra or mis-shaped key is named, with a guess of the
        variant the file holds).
    """
    params = read_checkpoint(path, model.num_heads)
    return adapt(params, model, image_size, reset_head, source=str(path), patch_size=patch_size)


def read_checkpoint(path: str | os.PathLike, num_heads: int | None = None) -> dict:
    """Any checkpoint format (see `vit_jax.formats`) -> the original-layout tree."""
    from vit_jax import formats  # formats builds on this module

    return formats.read_checkpoint(path, num_heads)


def adapt(
    params: dict,
    model: VisionTransformer,
    image_size: int | tuple[int, int],
    reset_head: bool = True,
    source: str = "checkpoint",
    patch_size: int | None = None,
) -> dict:
    """`load_pretrained` for a parameter tree already in memory (original layout)."""
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    flat = canonical(traverse_util.flatten_dict(params, sep="/"))
    stored = dict(flat)  # as the file holds it, for the error of one that does not fit
    if patch_size is not None:
        _fit_patch(flat, model, patch_size, source)
    plain = model.clone(scan=False, remat=False)
    want = traverse_util.flatten_dict(param_shapes(plain, size), sep="/")  # key -> ShapeDtypeStruct
    _fit_posemb(flat, want, model, size)
    _fit_head(flat, want, model, reset_head, source)
    _check_fits(flat, want, source, stored)
    flat = {k: np.asarray(v, dtype=want[k].dtype) for k, v in flat.items()}
    return traverse_util.unflatten_dict(stack_blocks(flat) if model.scan else flat, sep="/")


def _fit_posemb(flat: dict, want: dict, model: VisionTransformer, size: tuple[int, int]) -> None:
    """Resize stored learned position embeddings to the model's grid at `size`."""
    gh, gw = model.grid(size)
    k = POSEMB
    if (
        k in flat
        and k in want
        and flat[k].shape != want[k].shape
        and flat[k].shape[-1] == want[k].shape[-1]
    ):
        flat[k] = resize_posemb(flat[k], (gh, gw), int(model.has_class_token))
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


def _check_fits(flat: dict, want: dict, source: str, stored: dict | None = None) -> None:
    """Raises CheckpointError naming every key that does not fit; `stored` is the tree
    as the file holds it (before the patch kernel was resampled), whose variant is
    guessed."""
    stored = flat if stored is None else stored
    missing = set(want) - set(flat)
    extra = set(flat) - set(want)
    shaped = {k for k in set(want) & set(flat) if tuple(flat[k].shape) != want[k].shape}
    if not (missing or extra or shaped):
        return
    shape = lambda d, k: tuple(d[k].shape)
    problems = (
        (shaped, lambda k: f"has shape {shape(flat, k)}, model expects {shape(want, k)}"),
        (missing, lambda k: f"is missing (model expects {shape(want, k)})"),
        (extra, lambda k: f"{shape(flat, k)} is not in the model"),
    )
    lines = [
        f"key {k} {say(k)}{note}" for keys, say in problems for k, note in _grouped(keys).items()
    ]
    shown = lines[:12] + ([f"... and {len(lines) - 12} more"] if len(lines) > 12 else [])
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


def _grouped(keys: set[str]) -> dict[str, str]:
    """Keys in reading order (top level first), one representative per block pattern,
    mapped to a note of the other blocks with the same problem."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        groups.setdefault(re.sub(r"encoderblock_\d+", "encoderblock_*", k), []).append(k)
    out = {}
    for pattern in sorted(groups, key=lambda p: ("encoderblock_" in p, p)):
        ks = sorted(
            groups[pattern],
            key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)],
        )
        out[ks[0]] = f" (and in {len(ks) - 1} more blocks)" if len(ks) > 1 else ""
    return out


def load_model(
    path: str | os.PathLike,
    name: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    head: bool = True,
    patch_size: int | None = None,
    **overrides: Any,
) -> tuple[VisionTransformer, dict, tuple[int, int]]:
    """A checkpoint ready for inference or features: (model, params, (H, W)).

    Args:
      path: a checkpoint in any format `formats.read_checkpoint` reads.
      name: a variant ('ViT-B_16', 'B/16'); its sizes must fit the file. None: the
        architecture is read from the file (`architecture.architecture`), so the
        checkpoints this package trains load without naming their sizes.
      image_size: N or (H, W); None: the resolution the file's position embeddings
        were made for (position embeddings are resized to any other).
      head: keep the stored head (and its width); False drops it (features only).
      patch_size: another patch size than the file's: the kernel is resampled
        (FlexiViT) and the native resolution is kept in tokens per side.
      **overrides: any `VisionTransformer` field, e.g. posemb='sincos_2d' for a file
        without learned position embeddings, or dtype='bfloat16'.

    Raises:
      FileNotFoundError, CheckpointError: unreadable file, one that does not fit
        `name`, or an architecture the file cannot tell (the message says which option).
    """
    heads = overrides.get("num_heads") or (get_model(name, None).num_heads if name else None)
    params = read_checkpoint(path, heads)
    arch = architecture.architecture(params)
    if arch["posemb"] is None and "posemb" not in overrides:
        raise CheckpointError(
            f"{path} has no learned position embeddings: it was trained with posemb "
            "'none' or 'sincos_2d', which the file cannot tell apart; name it "
            "(--override=posemb=sincos_2d, or posemb='sincos_2d' in the library)"
        )
    if arch["posemb"] is None:
        del arch["posemb"]
    if name is not None:  # the name's sizes; what the file implies for everything else
        arch = {k: arch[k] for k in ("classifier", "representation_size", "posemb") if k in arch}
    classes = architecture.num_classes(params) if head else None
    stored = get_model(name, classes, **{**arch, **overrides})
    model = stored if patch_size is None else stored.clone(patch_size=patch_size)
    if image_size is None:
        grid = architecture.native_image_size(params, stored.token_stride)
        size = (
            grid[0] // stored.token_stride * model.token_stride,
            grid[1] // stored.token_stride * model.token_stride,
        )
    else:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    params = adapt(params, model, size, False, str(path), patch_size)
    return model, params, size
