"""A checkpoint of any format, ready for a model: read (`read.read_checkpoint`), then
fitted (`adapt.adapt`). The one way down from a path to parameters.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from vit_jax.models import get_model, variant_config
from vit_jax.models.vit import VisionTransformer
from vit_jax.weights import architecture
from vit_jax.weights.adapt import adapt
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.meta import checked
from vit_jax.weights.read import Source, read_source

# What a name fixes; the file tells the rest.
SIZES = ("width", "depth", "num_heads", "mlp_dim", "patch_size", "resnet_stages", "channels")


def load_pretrained(
    path: str | os.PathLike,
    model: VisionTransformer,
    image_size: int | tuple[int, int],
    reset_head: bool = True,
    patch_size: int | None = None,
    said: list[str] | None = None,
) -> dict:
    """Parameters of the checkpoint at `path` for `model` at `image_size` (`said` gets
    what was resized, replaced or not read, in words).

    `path` is any format `read.read_checkpoint` reads: a published .npz, a timm
    .safetensors file, a Hugging Face directory, or a remote path of a published file.
    With `patch_size` (the model's own, e.g. 8 for a file trained with 16) the
    patch-embedding kernel is resampled by the pseudo-inverse resize (FlexiViT; see
    models/patch_resize.py) and the position embeddings are resized to the new grid.

    Position embeddings are resized on their grid as the file's tool does (the original
    code's bilinear; timm's and transformers' bicubic: `Meta.posemb_resize`), prefix rows
    kept, also to non-square sizes such as (384, 512); `pre_logits` is dropped
    when the model has no representation layer; with `reset_head` the head is replaced
    by a zero-initialised one for the model's classes, without it the stored head is
    kept. The result is in the model's layout (blocks stacked if `model.scan`).
    The model's own numerics (GELU form, LayerNorm epsilon) are used, whatever the file
    says: `read.read_meta(path).numerics` gives the file's, to build the model with.

    Raises:
      FileNotFoundError, CheckpointError: unreadable file, or one that does not fit
        `model` (each missing, extra or mis-shaped key is named, with a guess of the
        variant the file holds).
    """
    source = read_source(path, model.num_heads)
    if said is not None:
        said += source.unread
    resize = source.meta.posemb_resize  # as the file's tool resizes its table
    return adapt(source.params, model, image_size, reset_head, str(path), patch_size, said, resize)


def _size(image_size: Any, source: Source, model: VisionTransformer) -> tuple[int, int]:
    """(H, W): `image_size`, else the grid the file records (where its table cannot tell
    it), else its table's own, in tokens per side of the model's patch."""
    grid = source.meta.posemb_grid
    if image_size is None and grid is not None:
        return grid[0] * model.token_stride, grid[1] * model.token_stride
    if image_size is None:
        return architecture.native_image_size(source.params, model.token_stride)
    return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)


def _is_variant(name: str) -> bool:
    """Whether `name` is one of this package's variants (not timm's architecture name)."""
    try:
        variant_config(name)
    except ValueError:
        return False
    return True


def fields_of(source: Source) -> dict[str, Any]:
    """Every VisionTransformer field a checkpoint tells: its tensors'
    (`architecture.architecture`; posemb None where it has no table), then what it
    records (the towers' fields the tensors cannot tell, the numerics: meta.py)."""
    grid = source.meta.posemb_grid
    return {
        **architecture.architecture(source.params, grid),
        **source.meta.fields,
        **source.meta.numerics,
    }


def read_fields(path: str | os.PathLike) -> dict[str, Any]:
    """`fields_of` the checkpoint at `path` (any format read)."""
    return fields_of(read_source(path))


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A checkpoint ready for a model: the model, its parameters, the resolution, the
    head's class names where the file names them (None otherwise, and without a head), and
    the preprocessing its weights expect (a `vit_jax.data.preprocessing` string)."""

    model: VisionTransformer
    params: dict
    image_size: tuple[int, int]
    labels: list[str] | None = None
    preprocessing: str = "tf_bilinear"


def load_model(
    path: str | os.PathLike,
    name: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    head: bool = True,
    patch_size: int | None = None,
    **overrides: Any,
) -> tuple[VisionTransformer, dict, tuple[int, int]]:
    """A checkpoint ready for inference or features: (model, params, (H, W)); `load`
    with the same arguments also gives the class names."""
    loaded = load(path, name, image_size, head, patch_size, **overrides)
    return loaded.model, loaded.params, loaded.image_size


def load(
    path: str | os.PathLike,
    name: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    head: bool = True,
    patch_size: int | None = None,
    **overrides: Any,
) -> Loaded:
    """A checkpoint ready for inference or features, read once.

    Args:
      path: a checkpoint in any format `read.read_checkpoint` reads.
      name: a variant ('ViT-B_16', 'B/16'); its sizes must fit the file. None: the
        architecture is read from the file (`architecture.architecture`), so the
        checkpoints this package trains load without naming their sizes. Or timm's
        architecture name (weights/towers.py) for a bare .safetensors file of a tower,
        whose tensors cannot tell it.
      image_size: N or (H, W); None: the resolution the file's position embeddings
        were made for (position embeddings are resized to any other).
      head: keep the stored head (and its width); False drops it (features only).
      patch_size: another patch size than the file's: the kernel is resampled
        (FlexiViT) and the native resolution is kept in tokens per side.
      **overrides: any `VisionTransformer` field, e.g. posemb='sincos_2d' for a file
        without learned position embeddings, or dtype='bfloat16'. `gelu` and
        `layer_norm_eps` default to what the file says its model computes, and so do
        the towers' fields its tensors cannot tell (`Meta.fields`; see meta.py);
        `**models.ORIGINAL_NUMERICS` computes the original ViT's numerics instead.

    Raises:
      FileNotFoundError, CheckpointError: unreadable file, one that does not fit
        `name`, or an architecture the file cannot tell (the message says which option).
    """
    tower = name if name is not None and not _is_variant(name) else None  # timm's name
    name = None if tower else name
    heads = overrides.get("num_heads") or (get_model(name, None).num_heads if name else None)
    source = read_source(path, heads, tower)
    params, arch = source.params, fields_of(source)
    if arch["posemb"] is None and "posemb" not in overrides:
        raise CheckpointError(
            f"{path} has no learned position embeddings: it was trained with posemb "
            "'none' or 'sincos_2d', which the file cannot tell apart; name it "
            "(posemb='sincos_2d')"
        )
    if arch["posemb"] is None:
        del arch["posemb"]
    if name is not None:  # the name's sizes; what the file implies for everything else
        arch = {k: v for k, v in arch.items() if k not in SIZES}
    classes = architecture.num_classes(params) if head else None
    stored = get_model(name, classes, **{**arch, **overrides})
    model = stored if patch_size is None else stored.clone(patch_size=patch_size)
    size = _size(image_size, source, model)
    model = model.clone(posemb_grid=model.grid(size))  # the tables' grid, as loaded
    params = adapt(
        params, model, size, False, str(path), patch_size, None, source.meta.posemb_resize
    )
    names = checked(source.meta.labels, classes, str(path)) if classes else None
    return Loaded(model, params, size, names, source.meta.preprocessing)
