"""Every tower family exports to timm: built here with random weights (LayerScale gains
~N(1, 0.5)), written by `convert.write(..., 'timm', DIR/)` as timm's hub folder, which
`timm.create_model('local-dir:' + DIR, pretrained=True)` builds and loads strictly with
our logits to 1e-5 of their largest, and which `weights.load_model(DIR)` reads back with
our logits bit for bit; the printed recipe (timm's VisionTransformer, its Eva) likewise.
The .npz round trip of a tower is test_tower_fields.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import flat, images, logits, random_params, unflat

from vit_jax.data.preprocessing import from_timm_cfg, to_timm_cfg
from vit_jax.models import get_model
from vit_jax.weights import CheckpointError, convert, load_model
from vit_jax.weights.meta import Meta

timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")

SIZE = dict(width=64, depth=2, num_heads=4, mlp_dim=128)
LN5 = dict(layer_norm_eps=1e-5)
# case: (fields, image size); the tensors' families: timm's VisionTransformer, then Eva
CASES = {
    "dinov2_reg4": (dict(patch_size=8, registers=4, embed_prefix=False, layer_scale=1e-5), 32),
    "clip_quickgelu": (dict(patch_size=8, pre_norm=True, gelu="quick", **LN5), 32),
    "siglip": (dict(patch_size=8, classifier="map", gelu="tanh"), 32),
    "dinov3": (
        dict(patch_size=16, rope="dinov3", posemb="none", registers=4, layer_scale=1e-5)
        | dict(classifier="gap", class_token=True, qkv_bias="", embed_prefix=False, **LN5),
        48,
    ),
    "eva02": (
        dict(patch_size=8, rope="eva", rope_grid=(16, 16), classifier="gap", class_token=True)
        | dict(fc_norm=True, swiglu=True, mlp_norm=True, qkv_bias="qv", mlp_dim=96),
        32,
    ),
}


def tower(case, seed=0):
    """(model, params, (H, W)) of a case: every parameter random, LayerScale's ~N(1, 0.5)."""
    fields, side = CASES[case]
    model = get_model(None, 5, **{**SIZE, "gelu": "exact", **fields})
    params = flat(random_params(model, side, seed))
    rng = np.random.default_rng(seed + 1)
    for k in [k for k in params if "layer_scale" in k]:
        params[k] = rng.normal(1, 0.5, params[k].shape).astype(np.float32)
    return model, unflat(params), (side, side)


def timm_logits(model, x):
    with torch.no_grad():
        return model.eval()(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()


def assert_close(ours, theirs, what):
    assert ours.shape == theirs.shape, what
    err = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert err <= 1e-5, f"{what}: max|ours - timm| / max|timm| = {err:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_hub_folder_loads_in_timm_and_back_here(case, tmp_path):
    model, params, size = tower(case)
    x = images(size)
    ours = logits(model, params, x)
    folder = str(tmp_path / case) + "/"
    meta = Meta(labels=[f"c{i}" for i in range(5)], preprocessing="pil_bicubic:crop=0.9")
    done = convert.write(params, model, size, "timm", folder, meta)
    assert done.how_to_load.startswith("timm.create_model('local-dir:' + ")
    cfg = json.loads((tmp_path / case / "config.json").read_text())
    assert cfg["label_names"] == list(meta.labels) and cfg["model_args"]["num_heads"] == 4
    assert from_timm_cfg(cfg["pretrained_cfg"]) == meta.preprocessing
    theirs = timm.create_model("local-dir:" + folder, pretrained=True)  # strict
    assert_close(ours, timm_logits(theirs, x), case)
    got, got_params, got_size = load_model(folder)  # the round trip: exact
    assert got_size == size
    np.testing.assert_array_equal(logits(got, got_params, x), ours)


@pytest.mark.parametrize("case", ["dinov2_reg4", "eva02"])
def test_printed_recipe_builds_timms_model(case, tmp_path):
    """timm's VisionTransformer for the DINOv2 tower, its Eva for EVA-02, with every
    argument, loading the .safetensors file strictly."""
    model, params, size = tower(case, seed=3)
    x = images(size)
    done = convert.write(params, model, size, "timm", tmp_path / "m.safetensors")
    cls = "Eva" if case == "eva02" else "VisionTransformer"
    assert f"model = {cls}(" in done.how_to_load and "eps=1e-6)" in done.how_to_load
    scope = {}
    exec(done.how_to_load, scope)
    assert_close(logits(model, params, x), timm_logits(scope["model"], x), case)


def test_what_a_hub_folder_cannot_hold_is_refused(tmp_path):
    model, params, size = tower("eva02")
    with pytest.raises(CheckpointError, match=r"eva02_base_patch14_224 reads \{'rope_grid'"):
        convert.write(params, model.clone(rope_grid=(8, 8)), size, "timm", tmp_path / "a/")
    with pytest.raises(CheckpointError, match="no key bias"):
        convert.write(params, model.clone(qkv_bias="qkv"), size, "timm", tmp_path / "b/")
    model, params, size = tower("dinov2_reg4")
    with pytest.raises(CheckpointError, match=r"\(vit of eps 1e-12\)"):
        convert.write(params, model.clone(layer_norm_eps=1e-12), size, "timm", tmp_path / "c")
    assert not any(tmp_path.iterdir())  # refused before anything is written


def test_to_timm_cfg_inverts_from_timm_cfg():
    for text in (
        "pil_bicubic",
        "pil_antialias:mean=0.1,0.2,0.3:std=0.2,0.2,0.2:crop=0.875:mode=border",
    ):
        cfg = to_timm_cfg(text, (32, 48))
        assert from_timm_cfg(cfg) == text and cfg["input_size"] == (3, 32, 48)
    assert to_timm_cfg(None, (8, 8))["interpolation"] == "bilinear"  # tf_bilinear: PIL's
