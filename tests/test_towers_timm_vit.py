"""timm's VisionTransformer towers (DINOv2 with and without registers, DINOv2 g's packed
SwiGLU, DeiT III, CLIP, SigLIP and SigLIP 2, registers with avg pooling and fc_norm),
built by timm itself with random weights, every tensor perturbed, written as timm's hub
folder: read here with timm's logits to 1e-5 of their largest (float32), on images and
NaFlex patches, and written back to timm's state dict bit for bit."""

import json
import re

import jax
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.models import get_model, naflex
from vit_jax.weights import architecture, safetensors_io, timm_recipe, towers
from vit_jax.weights import timm as timm_map
from vit_jax.weights.adapt import adapt
from vit_jax.weights.errors import CheckpointError

timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")
from timm.layers import GluMlp, Mlp  # noqa: E402

SMALL = dict(depth=2, embed_dim=64, num_heads=4, num_classes=7)
# (timm architecture, its arguments at test size): each family of the towers table
CASES = {
    "dinov2": ("vit_small_patch14_dinov2", dict(img_size=56)),
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", dict(img_size=56)),
    "dinov2_g_swiglu": ("vit_giant_patch14_dinov2", dict(img_size=56, mlp_ratio=4.0)),
    "deit3": ("deit3_small_patch16_224", dict(img_size=64)),
    "clip": ("vit_base_patch16_clip_224", dict(img_size=64, num_classes=32)),
    "clip_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(img_size=64)),
    "siglip": ("vit_base_patch16_siglip_224", dict(img_size=64)),
    "siglip_so400m": ("vit_so400m_patch14_siglip_224", dict(img_size=56)),
    "siglip2_tanh": ("vit_so400m_patch16_siglip_256", dict(img_size=64)),
    "siglip_gap": ("vit_base_patch16_siglip_gap_224", dict(img_size=64)),
    "reg4_gap_fc_norm": ("vit_base_patch16_reg4_gap_256", dict(img_size=64)),
}


def load_tower(folder):
    """(model, params, (H, W)) of a timm hub folder, as `weights.load_model(folder)` is to
    read it: the tensors through timm.py's map, the fields the table names."""
    cfg = json.loads((folder / "config.json").read_text())
    args = cfg.get("model_args") or {}
    tensors = safetensors_io.read(folder / "model.safetensors")[0]
    family, fields = towers.timm_tower(cfg["architecture"], args)
    assert family == "vit"
    params = timm_map.from_timm(tensors, args.get("num_heads"))
    arch = {**architecture.architecture(params), **fields}
    model = get_model(None, architecture.num_classes(params), **arch)
    size = architecture.native_image_size(params, model.token_stride)
    model = model.clone(posemb_grid=model.grid(size))
    timm_map.check(tensors, model, size, str(folder))
    return model, adapt(params, model, size, False, "test"), size


def perturbed(name, **kwargs):
    """timm's model with every tensor moved off its initial value (LayerScale to gains
    about 1, the class and register tokens to size 1), in eval mode."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **{**SMALL, **kwargs}).eval()
    with torch.no_grad():
        for key, p in model.state_dict().items():
            if key.endswith("gamma"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
            elif key in ("cls_token", "reg_token"):
                p.copy_(torch.randn_like(p))
            else:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_folder(model, folder):
    """timm's hub folder (config.json, model.safetensors), as `push_to_hf_hub` writes it."""
    from timm.models._hub import save_for_hf

    save_for_hf(model, folder, safe_serialization=True)
    return folder


def torch_logits(model, x):  # x [B, H, W, C]
    with torch.no_grad():
        return model(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()


def assert_close(ours, ref, what):
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, what
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err <= 1e-5, f"{what}: max|ours - timm| / max|timm| = {err:.2e}"


def apply(model, params, x):
    """Our logits, compiled once (the persistent cache keeps it between runs)."""
    return jax.jit(model.apply)({"params": params}, x)


def images(size, n=2, seed=0):
    return np.random.default_rng(seed).normal(size=(n, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize("case", CASES)
def test_timm_tower_loads_exactly_and_writes_back_bit_for_bit(case, tmp_path):
    name, kwargs = CASES[case]
    theirs = perturbed(name, **kwargs)
    folder = save_folder(theirs, tmp_path / case)
    model, params, size = load_tower(folder)
    x = images(size[0])
    ref = torch_logits(theirs, x)
    assert_close(apply(model, params, x), ref, case)

    # back to timm: the state dict it saved, bit for bit, loaded strictly by timm
    sd = {k: v.numpy() for k, v in theirs.state_dict().items()}
    back = {k: np.asarray(v) for k, v in timm_map.to_timm(params).items()}
    assert sorted(back) == sorted(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    again = timm.create_model(name, pretrained=False, **{**SMALL, **kwargs}).eval()
    again.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)
    np.testing.assert_array_equal(torch_logits(again, x), ref)
    flat = traverse_util.flatten_dict(params, sep="/")
    read = traverse_util.flatten_dict(timm_map.from_timm(back, model.num_heads), sep="/")
    assert sorted(read) == sorted(flat)
    for k, v in flat.items():
        assert np.array_equal(read[k], np.asarray(v)), k

    # the lines the converter prints build timm's VisionTransformer that computes it
    path = tmp_path / "back.safetensors"
    safetensors_io.write(path, back, {"format": "pt"})
    scope = {}
    exec(timm_recipe.recipe(model, size, str(path)), scope)
    assert_close(torch_logits(scope["model"], x), ref, f"{case}: the printed recipe")


@pytest.mark.parametrize("case", ["dinov2_reg4", "siglip", "reg4_gap_fc_norm"])
def test_timm_tower_naflex_patches_give_timms_logits(case, tmp_path):
    """NaFlex patches (padded rows) of images at the table's grid, against timm with
    dynamic_img_size=True at that size."""
    name, kwargs = CASES[case]
    theirs = perturbed(name, dynamic_img_size=True, **kwargs)
    model, params, size = load_tower(save_folder(theirs, tmp_path / case))
    x = images(size[0], n=3, seed=1)
    grid = model.grid(size)
    batch = naflex.patchify(x, model.patch_size, grid[0] * grid[1] + 5)
    assert_close(apply(model, params, batch), torch_logits(theirs, x), case)


def test_dinov2_registers_layerscale_and_swiglu_are_read_from_the_tensors(tmp_path):
    """The fields the tensors tell, and the ones the table names."""
    got = {}
    for case in ("dinov2_reg4", "dinov2_g_swiglu", "clip_quickgelu", "reg4_gap_fc_norm"):
        name, kwargs = CASES[case]
        got[case] = load_tower(save_folder(perturbed(name, **kwargs), tmp_path / case))[0]
    reg4, swiglu, clip, gap = got.values()
    assert (reg4.registers, reg4.embed_prefix, reg4.layer_scale is not None) == (4, False, True)
    assert (reg4.classifier, reg4.has_class_token, reg4.swiglu) == ("token", True, False)
    assert (swiglu.swiglu, swiglu.mlp_dim) == (True, 128)
    assert (clip.gelu, clip.layer_norm_eps, clip.pre_norm) == ("quick", 1e-5, True)
    assert (gap.classifier, gap.fc_norm, gap.has_class_token, gap.registers) == (
        "gap",
        True,
        False,
        4,
    )


def test_the_table_names_what_timms_factories_build():
    """Every timm VisionTransformer the table routes to this key map, as its factory builds
    it (on the meta device: no weights): the row's GELU, epsilon and class token's row."""
    acts = {"GELU": "exact", "GELUTanh": "tanh", "QuickGELU": "quick"}
    checked = 0
    for name in timm.list_models(module=["vision_transformer", "deit"]):
        family = next((f for p, f, _ in towers.TIMM if re.search(p, name)), None)
        if family != "vit":
            continue
        with torch.device("meta"):
            m = timm.create_model(name, depth=1)
        block = m.blocks[0]
        if not isinstance(getattr(block, "mlp", None), (Mlp, GluMlp)):
            continue  # blocks of another kind (the map refuses their tensors)
        fields = towers.timm_tower(name)[1]
        act = type(block.mlp.act).__name__
        act = "tanh" if act == "GELU" and block.mlp.act.approximate == "tanh" else acts.get(act)
        assert fields["gelu"] == act or block.mlp.__class__ is GluMlp, name
        assert fields["layer_norm_eps"] == block.norm1.eps, name
        assert fields.get("embed_prefix", not m.no_embed_class) == (not m.no_embed_class), name
        checked += 1
    assert checked > 120


def test_timm_model_args_override_the_row():
    assert towers.timm_tower("vit_base_patch16_siglip_224") == ("vit", towers.TIMM_DEFAULT)
    args = dict(global_pool="avg", act_layer="gelu_tanh")
    fields = towers.timm_tower("vit_small_patch14_reg4_dinov2", args)[1]
    assert fields == dict(gelu="tanh", layer_norm_eps=1e-6, embed_prefix=False, classifier="gap")
    fields = towers.timm_tower("deit_base_patch16_224", dict(no_embed_class=True))[1]
    assert fields["embed_prefix"] is False
    fields = towers.model_fields(dict(pos_embed="none", class_token=False))
    assert fields == dict(posemb="none", class_token=False)
    for arg, bad in (("global_pool", "avgmax"), ("act_layer", "relu")):
        with pytest.raises(CheckpointError, match=f"timm's {arg}='{bad}' is not computed"):
            towers.model_fields({arg: bad})


def test_dinov2_with_avg_pooling_keeps_its_class_token(tmp_path):
    theirs = perturbed("vit_small_patch14_dinov2", img_size=56, global_pool="avg")
    model, params, size = load_tower(save_folder(theirs, tmp_path / "avg"))
    assert (model.classifier, model.has_class_token, model.fc_norm) == ("gap", True, True)
    x = images(size[0])
    assert_close(apply(model, params, x), torch_logits(theirs, x), "dinov2 avg")


def test_what_timms_vision_transformer_cannot_hold_is_refused():
    qv = get_model("testing", 3, patch_size=8, qkv_bias="qv")
    with pytest.raises(CheckpointError, match="biases all or none"):
        timm_map.timm_shapes(qv, (32, 32))
    rope = qv.clone(qkv_bias="qkv", rope="dinov3", mlp_norm=True)
    with pytest.raises(CheckpointError, match="rope='dinov3', mlp_norm=True is timm's Eva"):
        timm_recipe.recipe(rope, (32, 32), "m.safetensors")
