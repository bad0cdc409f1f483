"""Reading any checkpoint a user holds: a published .npz, a timm .safetensors file or hub
folder, a Hugging Face directory, local, remote or a hub name (`remote.resolve`).

`read_checkpoint(path)` recognises the input format from the file and returns the
original-layout parameter tree that `adapt.adapt` fits to a model, so every command that
takes --checkpoint (and `init_from`) reads every format; `read_source` also returns what
the file says beyond its parameters (numerics, class names, preprocessing: meta.py).

A folder is told by its config.json: timm's hub folder (`save_for_hf`, `push_to_hf_hub`)
names its `architecture`, transformers' its `model_type`. timm's tensors do not tell
every argument its architecture was built with (the GELU form, a class token's position
row): `towers.TIMM` routes the names this package builds, and `Meta.architecture`
and `Meta.model_args` carry the name and its arguments.
"""

from __future__ import annotations

import dataclasses
import os

from flax import traverse_util

from vit_jax.base import store
from vit_jax.models import get_model
from vit_jax.weights import (
    architecture,
    hf,
    hf_towers,
    npz,
    remote,
    safetensors_io,
    timm,
    timm_eva,
    towers,
)
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import Meta

__all__ = ["FORMATS_READ", "Source", "detect_format", "read_checkpoint", "read_meta", "read_source"]

FORMATS_READ = (
    "a published .npz, a timm .safetensors file or hub folder, a Hugging Face model "
    "directory, or hf-hub:ORG/NAME"
)
# A tower's tensors that a bare file holds, and the timm architectures they may come from.
TOWERS = {
    "reg_token": "*_reg4_dinov2, *_dinov3",
    "ls1.gamma": "*_dinov2, deit3_*",
    "gamma_1": "*_dinov3, eva02_*",
    "q_bias": "*_dinov3_qkvb, eva02_*",
    "norm_pre": "*_clip_*",
    "attn_pool.latent": "*_siglip_*",
}


def detect_format(path: str | os.PathLike) -> str:
    """'npz', 'timm', 'timm_folder' (timm's hub folder) or 'hf' for a local or store path
    or a hub name, from its contents (a folder's config.json names timm's `architecture`
    or transformers' `model_type`).

    Raises:
      FileNotFoundError: no such file or directory.
      CheckpointError: none of them (the message says what was expected).
    """
    p = remote.resolve(path) if os.fspath(path).startswith(remote.HUB) else store.path(path)
    if p.is_dir():
        cfg = hf.read_config(p) if (p / hf.CONFIG).is_file() else None
        if isinstance(cfg, dict) and "architecture" in cfg:
            return "timm_folder"
        if isinstance(cfg, dict) and ("model_type" in cfg or "architectures" in cfg):
            return "hf"
        holds = ", ".join(sorted(q.name for q in p.iterdir())[:8]) or "nothing"
        what = "whose config.json names no timm architecture or transformers model_type"
        raise CheckpointError(
            f"{p} is a directory {what if cfg is not None else 'without config.json'} (it holds "
            f"{holds}): expected {FORMATS_READ} (config.json + model.safetensors)"
        )
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {p}: no such file or directory")
    with p.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"PK") or p.suffix == ".npz":
        return "npz"
    if safetensors_io.is_safetensors(p) or p.suffix == ".safetensors":
        return "timm"
    raise CheckpointError(
        f"{p} is not a checkpoint this package reads: expected {FORMATS_READ} "
        "(config.json + model.safetensors)"
    )


@dataclasses.dataclass(frozen=True)
class Source:
    """What a checkpoint file holds: the parameters in the original layout, what it
    says beyond them (as the file says or its format implies), and what was not read, in
    words (a two-tower file's text tower: npz.py)."""

    params: dict
    meta: Meta
    unread: tuple[str, ...] = ()


def read_checkpoint(path: str | os.PathLike, num_heads: int | None = None) -> dict:
    """Any checkpoint (npz, timm safetensors, HF directory; local or remote) -> the
    original-layout parameter tree (`read_source(...).params`)."""
    return read_source(path, num_heads).params


def read_source(
    path: str | os.PathLike, num_heads: int | None = None, architecture_name: str | None = None
) -> Source:
    """Any checkpoint (npz, timm safetensors or hub folder, transformers folder; local,
    remote or by hub name) -> its `Source`: parameters and Meta.

    Args:
      path: a local path, a gs:// or s3:// path (read in place), a published file's
        gs:// / https:// path (fetched once into the cache, see `remote.resolve`), or a
        hub name, hf-hub:ORG/NAME[@REVISION] (its snapshot in the hub's cache).
      num_heads: attention heads for a timm file of a width that is no published size.
      architecture_name: timm's architecture of a bare .safetensors file (weights/
        towers.py), where its tensors cannot tell it (a tower's).

    Raises:
      FileNotFoundError, CheckpointError: unreadable, unrecognised or incomplete input,
        each named with the way out.
    """
    path = remote.resolve(path)
    fmt = detect_format(path)
    if fmt == "npz":
        return Source(*npz.read_npz(path))
    if fmt == "hf":
        params, fields, cfg = hf_towers.read_dir(path)
        return Source(params, _hf_meta(cfg, fields, str(path / hf.CONFIG)))
    if fmt == "timm_folder":
        meta = read_meta(path)
        if not (path / hf.WEIGHTS).is_file():
            raise CheckpointError(
                f"{path} has no {hf.WEIGHTS}: only safetensors weights are read (timm's "
                "save_for_hf(model, DIR, safe_serialization=True) writes them)"
            )
        heads = num_heads or meta.model_args.get("num_heads")
        return Source(_read_timm(path / hf.WEIGHTS, heads, meta)[0], meta)
    meta = Meta.from_timm(safetensors_io.read_metadata(path), str(path))
    if architecture_name is not None:
        meta = meta.told(towers.timm_tower(architecture_name)[1])
    return Source(*_read_timm(path, num_heads, meta))


def _hf_meta(cfg: dict, fields: dict, source: str) -> Meta:
    """A transformers folder's Meta: labels and preprocessing as its config says, the
    numerics and the fields its tensors cannot tell as the tower's reader read them."""
    told = ("hidden_act", "layer_norm_eps") if "gelu" in fields else ()  # ViT's: config's
    plain = {k: v for k, v in cfg.items() if k not in told}
    resize = hf_towers.RESIZES.get(cfg.get("model_type"))  # as transformers resizes it
    return dataclasses.replace(Meta.from_hf(plain, source).told(fields), posemb_resize=resize)


def _read_timm(path: store.Path, num_heads: int | None, meta: Meta) -> tuple[dict, Meta]:
    """A timm .safetensors file -> (original-layout tree, `meta`), in either of timm's
    layouts (its VisionTransformer's, its Eva's), checked tensor by tensor."""
    tensors, metadata = safetensors_io.read(path)
    if any(k.startswith(("vit.", "embeddings.")) for k in tensors):
        raise CheckpointError(
            f"{path} holds Hugging Face ViT weights; pass the directory with its config.json"
        )
    found = sorted({t for t in TOWERS for k in tensors if k.endswith(t) or f".{t}." in k})
    ours = "gelu" in metadata or "num_heads" in metadata  # written here: its numerics said
    if found and not ours and not meta.fields and meta.architecture is None:
        names = dict.fromkeys(", ".join(TOWERS[t] for t in found).split(", "))
        raise CheckpointError(
            f"{path} holds a tower's tensors ({', '.join(found)}) whose architecture a bare "
            "file cannot tell: pass timm's hub folder (config.json beside it) or name the "
            f"architecture (name=NAME, e.g. vit_small_patch14_reg4_dinov2): one of "
            f"{', '.join(names)}"
        )
    heads = num_heads or (int(metadata["num_heads"]) if "num_heads" in metadata else None)
    layout = timm_eva if timm_eva.is_eva(tensors) else timm
    params = layout.from_timm(tensors, heads)
    fields = {**architecture.architecture(params), **meta.fields}
    model = get_model(None, architecture.num_classes(params), **fields)
    if architecture.POSEMB in traverse_util.flatten_dict(params, sep="/"):
        size = architecture.native_image_size(params, model.token_stride)
    else:  # no table (DINOv3): any grid has the same tensors
        size = (16 * model.token_stride,) * 2
    layout.check(tensors, model, size, str(path))
    return params, meta


def read_meta(path: str | os.PathLike) -> Meta:
    """`read_source`'s Meta alone, reading only the file's metadata (an .npz's entries,
    the safetensors header, config.json), not its tensors.

    Raises:
      FileNotFoundError, CheckpointError: as `read_source`.
    """
    path = remote.resolve(path)
    fmt = detect_format(path)
    if fmt == "npz":
        return npz.read_meta(path)
    if fmt == "hf":
        return read_source(path).meta  # a tower's fields come with its tensors
    if fmt == "timm_folder":
        cfg = hf.read_config(path)
        arch = str(cfg["architecture"]).split(".")[0]  # a tag (name.tag): where it was trained
        fields = towers.timm_tower(arch, cfg.get("model_args"))[1]
        return Meta.from_timm_folder(cfg, fields, str(path / hf.CONFIG))
    return Meta.from_timm(safetensors_io.read_metadata(path), str(path))
