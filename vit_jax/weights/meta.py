"""What a weights file says beyond its parameters, as one record (`Meta`), written and read
once per format.

  gelu, layer_norm_eps  the function the weights compute. Neither leaves parameters
                 behind, yet each moves logits by ~1e-4: 'tanh' (the original ViT's GELU)
                 or 'exact' (erf); the LayerNorm epsilon.
  labels         the head's class names, in class order (None: the file names none; the
                 commands then use ImageNet's for a 1000-class head, else 'class i').
  preprocessing  the resize, mean and std and evaluation crop the weights were trained
                 and evaluated with (`vit_jax.data.preprocessing`'s string; a timm or
                 transformers folder's by `from_timm_cfg` or `from_hf_processor` there);
                 fed others, a model sees other pixels than its numbers were measured on.
  posemb_grid    the position table's (rows, columns) of patches (the model's posemb_grid),
                 written where the table's rows cannot tell it (a grid that is not square,
                 or any without a table).
  posemb_resize  how the file's tool resizes the table to another grid (`posemb.RESIZES`:
                 timm's 'bicubic_aa', transformers' per model_type); None: the paper's
                 bilinear (its files and this package's, whose tables are at their own grid).
  fields         the towers' VisionTransformer fields the tensors cannot tell ('gap' or
                 'map' pooling beside a class token, posemb 'none' or 'sincos_2d', the
                 rotary embeddings, LayerScale's initial value); {}: the paper's.

Each format says them its own way, and what a file leaves unsaid is what its tool meant:

  npz   the published files carry nothing: tanh, 1e-6, tf_bilinear, no names. Others get
        0-d string entries that the original code and timm's npz loader leave unread:
        `vit_jax_numerics` (JSON, only where the numerics are not the original's),
        `vit_jax_labels` (a JSON list), `vit_jax_preprocessing` (only where it is not
        tf_bilinear), `vit_jax_posemb_grid` (a JSON [rows, columns]) and `vit_jax_fields`
        (JSON, only where there are any), so files of the original's stay byte for byte
        what they were.
  timm  safetensors metadata `gelu`, `layer_norm_eps`, `labels` (JSON), `preprocessing`,
        `posemb_grid` and `vit_jax_fields` (JSON). Without `gelu` a file was saved by timm
        itself: timm's exact GELU and 1e-6 (one with only this package's older `num_heads`
        entry was written here before the numerics were recorded: the original's); without
        `preprocessing`, PIL's antialiased resize (timm's transforms).
  timm's hub folder  config.json's `architecture` and its arguments (`model_args`): the
        numerics and fields its row in `towers.TIMM` fixes (model_args over it);
        `label_names`; the pixels of its `pretrained_cfg` (PIL's antialiased resize
        without one).
  hf    config.json's `hidden_act` ('gelu' is exact; 'gelu_pytorch_tanh', 'gelu_new',
        'gelu_fast' the tanh form), `layer_norm_eps` (transformers' defaults 'gelu',
        1e-12), `id2label` (its defaults LABEL_i name nothing) and
        `vit_jax_preprocessing` (without it, PIL's: transformers' processors).

Files converted by others from the original JAX weights, such as
google/vit-base-patch16-224 on the Hugging Face hub, say 'gelu' and 1e-12 although the
weights were trained with tanh and 1e-6: load them with `ORIGINAL_NUMERICS` as overrides
(the commands' --numerics=original). Options a user names win over what a file says.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from vit_jax.data.preprocessing import PUBLISHED, Preprocessing, from_timm_cfg
from vit_jax.models import GELUS, ORIGINAL_NUMERICS, VisionTransformer
from vit_jax.models.posemb import RESIZES
from vit_jax.weights.errors import CheckpointError

NPZ_KEYS = {
    "numerics": "vit_jax_numerics",
    "labels": "vit_jax_labels",
    "preprocessing": "vit_jax_preprocessing",
    "posemb_grid": "vit_jax_posemb_grid",
    "fields": "vit_jax_fields",
}
TIMM_DEFAULT = {"gelu": "exact", "layer_norm_eps": 1e-6}  # timm's VisionTransformer defaults
HF_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
OTHER_TOOLS = "pil_antialias"  # what timm's and transformers' processors compute
_HF_DEFAULT_NAME = re.compile(r"LABEL_(\d+)")


@dataclasses.dataclass(frozen=True)
class Meta:
    """What a weights file says beyond its parameters (the defaults: a published file's)."""

    gelu: str = "tanh"
    layer_norm_eps: float = 1e-6
    labels: tuple[str, ...] | None = None
    preprocessing: str | None = None  # None: not known (nothing is written)
    # The position table's (gh, gw), where its rows alone cannot tell it (not square).
    posemb_grid: tuple[int, int] | None = None
    posemb_resize: str | None = None  # the tool's resize of the table (posemb.RESIZES)
    # timm's architecture name and the VisionTransformer arguments it is built with (a timm
    # hub folder's, routed by `towers.TIMM`); None, {}: a file that names none.
    architecture: str | None = None
    model_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    # VisionTransformer fields the tensors cannot tell (`of_model`'s; a timm or transformers
    # folder's reader: its table's), merged over `architecture.architecture`'s.
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        unknown = sorted(set(self.fields) - set(VisionTransformer.__dataclass_fields__))
        if unknown:
            raise CheckpointError(f"fields {unknown}: no VisionTransformer field")
        fix = lambda v: tuple(v) if isinstance(v, list) else v  # JSON's lists: hashable
        object.__setattr__(self, "fields", {k: fix(v) for k, v in self.fields.items()})
        if self.gelu not in GELUS:
            raise CheckpointError(f"GELU {self.gelu!r}: this package computes {' or '.join(GELUS)}")
        try:
            object.__setattr__(self, "layer_norm_eps", float(self.layer_norm_eps))
        except (TypeError, ValueError):
            raise CheckpointError(f"layer_norm_eps {self.layer_norm_eps!r} is no number") from None
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(str(n) for n in self.labels))
        if self.posemb_grid is not None:
            grid = tuple(self.posemb_grid)
            if len(grid) != 2 or not all(isinstance(n, int) and n > 0 for n in grid):
                raise CheckpointError(f"posemb_grid {grid}: expected [rows, columns] of patches")
            object.__setattr__(self, "posemb_grid", grid)
        if self.posemb_resize not in (None, *RESIZES):
            raise CheckpointError(f"posemb_resize {self.posemb_resize!r}: one of {RESIZES}")
        if self.preprocessing is not None:  # as written by `str`: one spelling a spec
            try:
                canonical = str(Preprocessing.parse(str(self.preprocessing)))
            except ValueError as e:
                raise CheckpointError(str(e)) from None
            object.__setattr__(self, "preprocessing", canonical)

    @classmethod
    def of_model(cls, model: Any, labels=None, preprocessing: str | None = None) -> Meta:
        """A VisionTransformer's numerics, with the head's class names, the resize, a
        position table's grid that is not square (any grid where there is no table: the
        resolution) and the towers' fields its tensors cannot tell."""
        grid, table = model.posemb_grid, model.posemb in ("learned", "learned_2d")
        grid = grid if grid and (grid[0] != grid[1] or not table) else None  # none: no size
        kept = ("layer_scale", "rope", "rope_base", "rope_grid")
        fields = {k: getattr(model, k) for k in kept if getattr(model, k) is not None}
        if model.posemb in ("none", "sincos_2d"):  # no table: the tensors cannot tell which
            fields["posemb"] = model.posemb
        if model.has_class_token and model.classifier != "token":  # a class token unpooled
            fields |= dict(classifier=model.classifier, class_token=True)
        return cls(model.gelu, model.layer_norm_eps, labels, preprocessing, grid, fields=fields)

    @property
    def numerics(self) -> dict[str, Any]:
        """{'gelu': ..., 'layer_norm_eps': ...}: the model fields it sets."""
        return {"gelu": self.gelu, "layer_norm_eps": self.layer_norm_eps}

    @property
    def original_numerics(self) -> bool:
        return self.numerics == ORIGINAL_NUMERICS

    # ------------------------------------------------------------------ npz

    def to_npz(self) -> dict[str, np.ndarray]:
        out = {}
        if not self.original_numerics:
            out["numerics"] = json.dumps(self.numerics, sort_keys=True)
        if self.labels is not None:
            out["labels"] = json.dumps(list(self.labels))
        if self.preprocessing not in (None, PUBLISHED):
            out["preprocessing"] = self.preprocessing
        if self.posemb_grid is not None:
            out["posemb_grid"] = json.dumps(list(self.posemb_grid))
        if self.fields:
            out["fields"] = json.dumps(self.fields, sort_keys=True)
        return {NPZ_KEYS[k]: np.array(v) for k, v in out.items()}

    @classmethod
    def from_npz(cls, arrays: dict[str, Any], source: str) -> Meta:
        """Pops the entries from an .npz's arrays."""
        found = {k: str(arrays.pop(key)) for k, key in NPZ_KEYS.items() if key in arrays}
        numerics = _json(found, "numerics", dict, f"{source} ({NPZ_KEYS['numerics']})")
        labels = _json(found, "labels", list, f"{source} ({NPZ_KEYS['labels']})")
        numerics = numerics or ORIGINAL_NUMERICS  # none recorded: the original's
        method = found.get("preprocessing", PUBLISHED)
        grid = _json(found, "posemb_grid", list, f"{source} ({NPZ_KEYS['posemb_grid']})")
        fields = _json(found, "fields", dict, f"{source} ({NPZ_KEYS['fields']})")
        return _made(
            f"{source} (vit_jax_*)",
            **numerics,
            labels=labels,
            preprocessing=method,
            posemb_grid=grid,
            fields=fields or {},
        )

    # ------------------------------------------------------------------ timm safetensors

    def to_timm(self) -> dict[str, str]:
        out = {"gelu": self.gelu, "layer_norm_eps": repr(self.layer_norm_eps)}
        if self.labels is not None:
            out["labels"] = json.dumps(list(self.labels))
        if self.preprocessing is not None:
            out["preprocessing"] = self.preprocessing
        if self.posemb_grid is not None:
            out["posemb_grid"] = json.dumps(list(self.posemb_grid))
        if self.fields:
            out[NPZ_KEYS["fields"]] = json.dumps(self.fields, sort_keys=True)
        return out

    @classmethod
    def from_timm(cls, metadata: dict[str, str], source: str) -> Meta:
        if "gelu" in metadata:
            numerics = {k: metadata.get(k) for k in ("gelu", "layer_norm_eps")}
        else:  # timm's own file, or one written here before the numerics were recorded
            numerics = ORIGINAL_NUMERICS if "num_heads" in metadata else TIMM_DEFAULT
        labels = _json(metadata, "labels", list, f"{source} (metadata labels)")
        method = metadata.get("preprocessing", OTHER_TOOLS)
        grid = _json(metadata, "posemb_grid", list, f"{source} (metadata posemb_grid)")
        fields = _json(metadata, NPZ_KEYS["fields"], dict, f"{source} (metadata vit_jax_fields)")
        ours = "gelu" in metadata or "num_heads" in metadata  # written here: the paper's resize
        return _made(
            f"{source} (metadata)",
            **numerics,
            labels=labels,
            preprocessing=method,
            posemb_grid=grid,
            posemb_resize=None if ours else "bicubic_aa",  # timm's resample_abs_pos_embed
            fields=fields or {},
        )

    @classmethod
    def from_timm_folder(cls, cfg: dict[str, Any], fields: dict[str, Any], source: str) -> Meta:
        """timm's hub folder: its config.json `cfg`, and the fields its architecture and
        model_args fix (`towers.timm_tower`); the pixels its pretrained_cfg describes."""
        names = cfg.get("label_names") or cfg.get("pretrained_cfg", {}).get("label_names")
        if isinstance(names, dict):  # {index: name}
            names = [names.get(str(i), names.get(i)) for i in range(len(names))]
        pretrained = cfg.get("pretrained_cfg") or {}
        pixels = from_timm_cfg(pretrained) if "mean" in pretrained else OTHER_TOOLS
        made = _made(source, **TIMM_DEFAULT, labels=names, preprocessing=pixels)
        made = dataclasses.replace(made, posemb_resize="bicubic_aa")  # as timm resizes
        args = dict(cfg.get("model_args") or {})
        made = dataclasses.replace(made, architecture=str(cfg["architecture"]), model_args=args)
        if "input_size" in pretrained and fields.get("posemb") == "none":  # no table: a size
            named = re.search(r"patch(\d+)", made.architecture)
            patch = made.model_args.get("patch_size") or (named[1] if named else 16)
            side = int(pretrained["input_size"][-1]) // int(patch)
            made = dataclasses.replace(made, posemb_grid=(side, side))
        return made.told(fields)

    def told(self, fields: dict[str, Any]) -> Meta:
        """This record with what a tower's reader says: its numerics, a grid, its fields."""
        f = dict(fields)
        numerics = {k: f.pop(k) for k in ("gelu", "layer_norm_eps") if k in f}
        grid = f.pop("posemb_grid", self.posemb_grid)
        return dataclasses.replace(self, **numerics, posemb_grid=grid, fields={**self.fields, **f})

    # ------------------------------------------------------------------ Hugging Face

    def to_hf(self) -> dict[str, Any]:
        """config.json's entries (id2label is hf.config's, which knows the head's width)."""
        act = "gelu_pytorch_tanh" if self.gelu == "tanh" else "gelu"
        out = {"hidden_act": act, "layer_norm_eps": self.layer_norm_eps}
        if self.preprocessing is not None:
            out["vit_jax_preprocessing"] = self.preprocessing
        return out

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], source: str) -> Meta:
        act = cfg.get("hidden_act", "gelu")
        if act != "gelu" and act not in HF_TANH:
            raise CheckpointError(
                f"{source} computes hidden_act {act!r}; this package's ViT computes 'gelu' "
                f"(exact) or the tanh form ({', '.join(HF_TANH)})"
            )
        id2label, labels = cfg.get("id2label"), None
        if isinstance(id2label, dict) and id2label:
            labels = [str(id2label.get(str(i), id2label.get(i, ""))) for i in range(len(id2label))]
            if all(_HF_DEFAULT_NAME.fullmatch(n) and int(n[6:]) == i for i, n in enumerate(labels)):
                labels = None
        gelu = "exact" if act == "gelu" else "tanh"
        eps = cfg.get("layer_norm_eps", 1e-12)
        method = cfg.get("vit_jax_preprocessing", OTHER_TOOLS)
        return _made(source, gelu, eps, labels=labels, preprocessing=method)


def checked(labels: Sequence[str] | None, num_classes: int, source: str) -> list[str] | None:
    """`labels` as a list when they fit a head of `num_classes`: one distinct name each.

    Raises:
        ValueError: another number of names, or a name given twice (named with `source`).
    """
    if labels is None:
        return None
    names = [str(n) for n in labels]
    if len(names) != num_classes:
        raise ValueError(
            f"{source}: {len(names)} class names for a head of {num_classes} classes: give "
            "one a class"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"{source}: class names must differ; repeated: {', '.join(map(repr, twice[:5]))}"
        )
    return names


def _json(found: dict[str, str], key: str, kind: type, source: str) -> Any:
    """The JSON value of `found[key]` (None where absent), of type `kind`."""
    if key not in found:
        return None
    try:
        value = json.loads(found[key])
    except ValueError:
        value = None
    names = key == "labels"
    if not isinstance(value, kind) or (names and not all(isinstance(n, str) for n in value)):
        what = "a JSON list of class names" if names else "JSON"
        raise CheckpointError(f"{source} is not {what}: {found[key][:80]!r}")
    return value


def _made(source: str, gelu=None, layer_norm_eps=None, **entries) -> Meta:
    """A Meta from a file's entries; what does not fit is named with the file."""
    try:
        return Meta(gelu, 1e-6 if layer_norm_eps is None else layer_norm_eps, **entries)
    except CheckpointError as e:
        raise CheckpointError(f"{source} names {e}") from None
