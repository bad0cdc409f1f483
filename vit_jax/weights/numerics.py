"""Which function a file's weights compute: the GELU form and the LayerNorm epsilon.

Two model options leave no parameters behind, yet move logits by ~1e-4: `gelu` ('tanh',
the original ViT's approximation, or 'exact', erf) and `layer_norm_eps`. Each format says
them its own way, and every file this package writes says them again:

  npz   the published files carry nothing: the original's tanh and 1e-6. A file whose
        model computes anything else (an import of a PyTorch model, a run fine-tuned
        from one) gets one more entry, `vit_jax_numerics`: a 0-d string array holding
        JSON ({"gelu": "exact", "layer_norm_eps": 1e-06}), which the original code and
        timm's npz loader leave unread. Files of the original numerics stay byte-for-byte
        what they were.
  timm  safetensors metadata `gelu` and `layer_norm_eps`, written here. A file without
        them was saved by timm (or another tool) and computes timm's defaults: the exact
        GELU, eps 1e-6; one with this package's older `num_heads` entry but no `gelu` was
        written here before the option existed, and is the original's.
  hf    config.json's `hidden_act` ('gelu' is exact; 'gelu_pytorch_tanh', 'gelu_new' and
        'gelu_fast' the tanh form) and `layer_norm_eps` (transformers' defaults: 'gelu',
        1e-12).

Options the user names (overrides) win over what a file says. Files converted by others
from the original JAX weights, such as google/vit-base-patch16-224 on the Hugging Face hub,
say 'gelu' and 1e-12 although the weights were trained with tanh and 1e-6: load them with
`ORIGINAL_NUMERICS` as overrides (the commands' --numerics=original).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from vit_jax.models import GELUS, ORIGINAL_NUMERICS
from vit_jax.weights.errors import CheckpointError

NPZ_KEY = "vit_jax_numerics"
TIMM_DEFAULT = {"gelu": "exact", "layer_norm_eps": 1e-6}  # timm's VisionTransformer defaults
HF_DEFAULT = {"hidden_act": "gelu", "layer_norm_eps": 1e-12}  # transformers' ViTConfig's
HF_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
FIELDS = tuple(ORIGINAL_NUMERICS)


def of_model(model: Any) -> dict[str, Any]:
    """{'gelu': ..., 'layer_norm_eps': ...} of a VisionTransformer."""
    return {"gelu": model.gelu, "layer_norm_eps": float(model.layer_norm_eps)}


def is_original(numerics: dict[str, Any]) -> bool:
    """Whether `numerics` are the original ViT's (tanh GELU, eps 1e-6)."""
    return {**ORIGINAL_NUMERICS, **numerics} == ORIGINAL_NUMERICS


def _checked(numerics: dict[str, Any], source: str) -> dict[str, Any]:
    if numerics.get("gelu") not in GELUS:
        raise CheckpointError(
            f"{source} names GELU {numerics.get('gelu')!r}; this package computes "
            f"{' or '.join(GELUS)}"
        )
    try:
        eps = float(numerics["layer_norm_eps"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(
            f"{source} has no readable layer_norm_eps ({numerics.get('layer_norm_eps')!r})"
        ) from None
    return {"gelu": numerics["gelu"], "layer_norm_eps": eps}


# ---------------------------------------------------------------- npz


def to_npz(numerics: dict[str, Any] | None) -> dict[str, np.ndarray]:
    """The extra entry of an .npz whose model computes `numerics`; none for the original's."""
    if numerics is None or is_original(numerics):
        return {}
    return {NPZ_KEY: np.array(json.dumps(_checked(numerics, "the model"), sort_keys=True))}


def from_npz(arrays: dict[str, np.ndarray], source: str) -> dict[str, Any]:
    """Pops the entry from an .npz's arrays; the numerics it names (the original's without)."""
    entry = arrays.pop(NPZ_KEY, None)
    if entry is None:
        return dict(ORIGINAL_NUMERICS)
    try:
        numerics = json.loads(str(entry))
    except ValueError:
        raise CheckpointError(f"{source}: {NPZ_KEY} is not JSON: {str(entry)[:80]!r}") from None
    return _checked(numerics, f"{source} ({NPZ_KEY})")


# ---------------------------------------------------------------- timm safetensors


def to_timm_metadata(numerics: dict[str, Any]) -> dict[str, str]:
    n = _checked(numerics, "the model")
    return {"gelu": n["gelu"], "layer_norm_eps": repr(n["layer_norm_eps"])}


def from_timm_metadata(metadata: dict[str, str], source: str) -> dict[str, Any]:
    """A timm file's numerics: this package's metadata, else timm's defaults (see above)."""
    if "gelu" in metadata:
        return _checked(dict(metadata), f"{source} (metadata)")
    if "num_heads" in metadata:  # written here before the numerics were recorded
        return dict(ORIGINAL_NUMERICS)
    return dict(TIMM_DEFAULT)


# ---------------------------------------------------------------- Hugging Face config.json


def to_hf_config(numerics: dict[str, Any]) -> dict[str, Any]:
    n = _checked(numerics, "the model")
    act = "gelu_pytorch_tanh" if n["gelu"] == "tanh" else "gelu"
    return {"hidden_act": act, "layer_norm_eps": n["layer_norm_eps"]}


def from_hf_config(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """config.json's hidden_act and layer_norm_eps (transformers' defaults where absent)."""
    act = cfg.get("hidden_act", HF_DEFAULT["hidden_act"])
    if act == "gelu":
        gelu = "exact"
    elif act in HF_TANH:
        gelu = "tanh"
    else:
        raise CheckpointError(
            f"{source} computes hidden_act {act!r}; this package's ViT computes 'gelu' "
            f"(exact) or the tanh form ({', '.join(HF_TANH)})"
        )
    eps = cfg.get("layer_norm_eps", HF_DEFAULT["layer_norm_eps"])
    return _checked({"gelu": gelu, "layer_norm_eps": eps}, source)
