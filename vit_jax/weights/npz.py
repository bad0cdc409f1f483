"""The published ViT checkpoints (.npz): read any layout, write the original one.

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
  NaFlex     big_vision's NaFlex towers (SigLIP 2): as big_vision's, with embedding/kernel
             a Dense on flattened patches [P*P*3, D] (this package's [P, P, 3, D] reshaped),
             pos_embedding an n x n grid [n, n, D], and a MAPHead_0 (classifier 'map').
  two towers SigLIP's image-text files: the image tower under [params/]img/ is read; the
             text tower txt/ and the scalars t and b are never read, and `read_npz` says so.
All are turned into the original layout, which is also the parameter tree of this
package's models (with scan=False) and what `save_npz` writes. A big_vision file's
class token had no position embedding, so its class row is zero here: same function.
What a file says beyond its parameters (numerics, class names, preprocessing) is in
`vit_jax_*` entries (meta.py); `read_npz` returns it apart from the parameters.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax.base import files, store
from vit_jax.weights.architecture import POSEMB
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import NPZ_KEYS, Meta

__all__ = ["canonical", "load_npz", "read_npz", "save_npz", "stack_blocks", "unstack_blocks"]
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


def _read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of an .npz (a two-tower file's image tower), never unpickling, and the
    names left unread; errors name the file and the way out."""
    path = store.path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {path}: no such file. Published checkpoints are "
            "the .npz files released with the paper; download one first"
        )
    try:
        with path.open("rb") as f:  # a file object: local, or read by ranges from a store
            npz = np.load(f, allow_pickle=False)
            if isinstance(npz, np.lib.npyio.NpzFile):
                with npz:
                    names = _image_tower(npz.files)
                    return {k: npz[k] for k in names}, sorted(set(npz.files) - set(names))
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
    raise CheckpointError(
        f"checkpoint {path} is a single .npy array, not an .npz archive of named parameters"
    )


def _image_tower(names: list[str]) -> list[str]:
    """A two-tower file's image tower ([params/]img/ beside txt/, t and b): its names alone,
    so that the text tower is never read; any other file's names all."""
    return [k for k in names if re.match(r"(params/)?img/", k)] or names


def canonical(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Any published layout (flat keys) -> the original layout."""
    for prefix in ("opt/target/", "params/", "img/"):
        if flat and all(k.startswith(prefix) for k in flat):
            flat = {k[len(prefix) :]: v for k, v in flat.items()}
    flat = unstack_blocks(flat)
    if any("/MultiHeadDotProductAttention_0/" in k for k in flat):  # big_vision numbering
        block = re.compile(r"^([^/]*/encoderblock_[^/]*/)([^/]*)")
        rename = lambda m: m[1] + _NEW_TO_OLD.get(m[2], m[2])
        flat = {block.sub(rename, k): v for k, v in flat.items()}
    if "pos_embedding" in flat:  # big_vision: no class row; NaFlex's [n, n, D] is [1, n*n, D]
        pe = flat.pop("pos_embedding")
        pe = pe.reshape(1, -1, pe.shape[-1])
        if "cls" in flat:
            pe = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
        flat[POSEMB] = pe
    kernel = flat.get("embedding/kernel")
    if kernel is not None and kernel.ndim == 2:  # NaFlex: a Dense on flattened patches
        p = math.isqrt(kernel.shape[0] // 3)
        if p * p * 3 != kernel.shape[0]:
            raise CheckpointError(f"embedding/kernel {kernel.shape}: not P*P*3 rows of patches")
        flat["embedding/kernel"] = kernel.reshape(p, p, 3, kernel.shape[1])
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
    return read_npz(path)[0]


def read_npz(path: str | os.PathLike) -> tuple[dict, Meta, tuple[str, ...]]:
    """`load_npz`'s tree, what the file says beyond it (meta.py), and what was not read,
    in words: a two-tower file's text tower and scalars."""
    arrays, unread = _read(path)
    meta = Meta.from_npz(arrays, str(path))
    tree = traverse_util.unflatten_dict(canonical(arrays), sep="/")
    parts = sorted({k.removeprefix("params/").split("/")[0] for k in unread})
    return tree, meta, (f"the image tower img/ ({', '.join(parts)} not read)",) if unread else ()


def read_meta(path: str | os.PathLike) -> Meta:
    """`read_npz`'s Meta without reading the parameters."""
    try:
        with store.path(path).open("rb") as raw, np.load(raw, allow_pickle=False) as f:
            entries = {k: f[k] for k in NPZ_KEYS.values() if k in f.files}
    except (ValueError, zipfile.BadZipFile, EOFError, OSError, KeyError, AttributeError):
        return read_npz(path)[1]  # its error names what is wrong
    return Meta.from_npz(entries, str(path))


def save_npz(
    path: str | os.PathLike, params: dict, meta: Meta | None = None, via: store.Store = store.PLAIN
) -> None:
    """Write `params` in the original published layout (per-block names, float32), with
    `meta` (numerics, class names, preprocessing) in entries of its own (meta.py): a
    model of the original's numerics and preprocessing without names is written as the
    published files are.

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
    arrays.update((meta or Meta()).to_npz())
    with files.atomic_write(path, via=via) as f:
        np.savez(f, **arrays)
