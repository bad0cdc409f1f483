"""timm's Eva towers (DINOv3, EVA-02) as timm's hub folders hold them load with timm's
logits, at the native size and (DINOv3) any other and as NaFlex patches, and write back
into timm's own model: weights/timm_eva.py and the Eva rows of weights/towers.py."""

import json

import numpy as np
import pytest
from format_helpers import run_in_timm
from helpers import MISSING, assert_trees_equal, images, logits

from vit_jax.models import get_model, naflex
from vit_jax.weights import architecture, safetensors_io, timm_eva, towers
from vit_jax.weights.adapt import adapt
from vit_jax.weights.errors import CheckpointError

# timm builds the model, perturbs every tensor (biases and LayerNorms leave their init,
# LayerScale's gammas are ~N(1, 0.5), not its 1e-5) and writes its hub folder; `model`
# then gives the logits run_in_timm saves.
SAVED = """
import torch, timm
from timm.models._hub import save_for_hf
torch.manual_seed({seed})
model = timm.create_model({arch!r}, pretrained=False, num_classes=7, **{kwargs!r}).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "gamma" in name:
            p.copy_(1 + 0.5 * torch.randn_like(p))
        else:
            p.add_((0.1 if p.ndim == 1 else 0.03) * torch.randn_like(p))
save_for_hf(model, {out!r}, model_args={kwargs!r}, safe_serialization=True)
"""
# A fresh timm model with the tensors `to_timm` wrote, loaded strictly.
RELOADED = """
import timm, safetensors.torch
model = timm.create_model({arch!r}, pretrained=False, num_classes=7, **{kwargs!r}).eval()
model.load_state_dict(safetensors.torch.load_file({path!r}), strict=True)
"""
DINOV3 = dict(depth=2)  # dynamic_img_size: any size; RoPE on each image's own grid
NARROW = dict(depth=1, embed_dim=96, num_heads=4)  # heads of 24
CASES = {  # case: (architecture, model_args, native size)
    "dinov3": ("vit_small_patch16_dinov3", DINOV3, (64, 64)),
    "dinov3_qkvb": ("vit_small_patch16_dinov3_qkvb", DINOV3, (64, 64)),
    "dinov3_swiglu": ("vit_huge_plus_patch16_dinov3", NARROW, (64, 64)),
    "eva02_tiny": ("eva02_tiny_patch14_224", dict(depth=2, img_size=56), (56, 56)),
    "eva02_base": ("eva02_base_patch14_224", dict(NARROW, img_size=56), (56, 56)),
    "eva02_clip": ("eva02_base_patch16_clip_224", dict(NARROW, img_size=64), (64, 64)),
}
OTHER, OTHER_CASES = (64, 96), ("dinov3", "dinov3_qkvb")  # DINOv3 at 4x6 patches too


def load_tower(folder, image_size=None):
    """(model, params, size) of a timm hub folder: what `weights.load_model(folder)` will do."""
    cfg = json.loads((folder / "config.json").read_text())
    args = cfg.get("model_args", {})
    family, fields = towers.timm_tower(cfg["architecture"], args)
    assert family == "eva"
    tensors, _ = safetensors_io.read(folder / "model.safetensors")
    params = timm_eva.from_timm(tensors, args.get("num_heads"))
    arch = {**architecture.architecture(params), **fields}
    model = get_model(None, architecture.num_classes(params), **arch)
    if image_size is None and "pos_embed" not in tensors:  # DINOv3: no table to tell it
        image_size = tuple(cfg["pretrained_cfg"]["input_size"][1:])
    size = image_size or architecture.native_image_size(params, model.token_stride)
    model = model.clone(posemb_grid=model.grid(size))
    timm_eva.check(tensors, model, size, str(folder))
    return model, adapt(params, model, size, False, "test"), size


def relative_error(ours, theirs):
    return np.abs(ours - theirs).max() / np.abs(theirs).max()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{case: (folder, timm's logits at the native size, at OTHER (DINOv3) or None)}."""
    try:
        import timm  # noqa: F401
    except Exception as e:  # noqa: BLE001 (a torchvision built for another torch raises too)
        pytest.skip(f"{MISSING} timm does not import ({type(e).__name__}: {e}); run ./setup.sh")
    tmp = tmp_path_factory.mktemp("timm_eva")
    jobs = []
    for i, (case, (arch, kwargs, size)) in enumerate(CASES.items()):
        np.save(tmp / f"{case}.npy", images(size))
        recipe = SAVED.format(seed=i, arch=arch, kwargs=kwargs, out=str(tmp / case))
        jobs.append(dict(recipe=recipe, images=str(tmp / f"{case}.npy")))
        if case in OTHER_CASES:  # the folder again (the same seed), other images
            np.save(tmp / f"{case}_other.npy", images(OTHER))
            jobs.append(dict(recipe=recipe, images=str(tmp / f"{case}_other.npy")))
    out = iter(run_in_timm(jobs, tmp))
    return {c: (tmp / c, next(out), next(out) if c in OTHER_CASES else None) for c in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_timm_eva_folder_loads_with_timm_logits(folders, case):
    """Native size; DINOv3 also at 64x96 as images and as padded NaFlex patches; the file's
    tensors come back bit for bit through `to_timm`."""
    folder, theirs, theirs_other = folders[case]
    model, params, size = load_tower(folder, None if case.startswith("eva") else CASES[case][2])
    assert size == CASES[case][2] and model.num_classes == 7
    assert relative_error(logits(model, params, images(size)), theirs) <= 1e-5
    if case in ("dinov3", "eva02_tiny"):  # the rotary embeddings matter
        assert relative_error(logits(model.clone(rope=None), params, images(size)), theirs) > 1e-3
    tensors, _ = safetensors_io.read(folder / "model.safetensors")
    back = timm_eva.to_timm(timm_eva.from_timm(tensors, model.num_heads), model)
    assert back.keys() == tensors.keys()
    for k, v in tensors.items():
        np.testing.assert_array_equal(back[k], v, err_msg=k)
    if theirs_other is None:
        return
    model, params, _ = load_tower(folder, OTHER)
    x = images(OTHER)
    assert relative_error(logits(model, params, x), theirs_other) <= 1e-5
    patches = naflex.patchify(x, 16, seq_len=4 * 6 + 5)  # padded: 5 more than the grid's
    assert relative_error(logits(model, params, patches), theirs_other) <= 1e-5


def test_pooling_follows_the_source(folders):
    """DINOv3's timm default: the patches' mean after `norm` (class token kept, unpooled);
    EVA-02's: the patches' mean, then fc_norm; EVA-02 CLIP's: the class token."""
    got = {c: load_tower(folders[c][0])[0] for c in ("dinov3", "eva02_tiny", "eva02_clip")}
    assert load_tower(folders["dinov3"][0])[2] == (256, 256)  # pretrained_cfg's input_size
    pools = {c: (m.classifier, m.has_class_token, m.fc_norm, m.registers) for c, m in got.items()}
    assert pools == {
        "dinov3": ("gap", True, False, 4),
        "eva02_tiny": ("gap", True, True, 0),
        "eva02_clip": ("token", True, False, 0),
    }
    d = got["dinov3"]
    assert (d.rope, d.rope_base, d.posemb, d.qkv_bias) == ("dinov3", 100, "none", "")
    assert d.layer_norm_eps == 1e-5 and got["eva02_tiny"].rope_grid == (16, 16)
    assert (got["eva02_clip"].attention_norm, got["eva02_clip"].mlp_norm) == (True, True)


def test_our_params_load_strictly_into_a_fresh_timm_model(folders, tmp_path):
    """Ours -> `to_timm` -> timm's own model (load_state_dict strict) gives the file's
    logits, and back to ours bit for bit; the scanned model computes the same."""
    jobs, cases = [], ("dinov3_qkvb", "eva02_base", "eva02_clip")
    for case in cases:
        arch, kwargs, size = CASES[case]
        model, params, _ = load_tower(folders[case][0], size)
        tensors = timm_eva.to_timm(params, model)
        assert_trees_equal(timm_eva.from_timm(tensors, model.num_heads), params)
        safetensors_io.write(tmp_path / f"{case}.safetensors", tensors)
        np.save(tmp_path / f"{case}.npy", images(size))
        path = str(tmp_path / f"{case}.safetensors")
        recipe = RELOADED.format(arch=arch, kwargs=kwargs, path=path)
        jobs.append(dict(recipe=recipe, images=str(tmp_path / f"{case}.npy")))
        if case == "eva02_base":  # scan=True: the blocks' parameters stacked
            scanned = model.clone(scan=True)
            stacked = adapt(params, scanned, size, False, "test")
            assert "encoderblock" in stacked["Transformer"]
            ours = logits(scanned, stacked, images(size))
            assert relative_error(ours, folders[case][1]) <= 1e-5
    for case, theirs in zip(cases, run_in_timm(jobs, tmp_path), strict=True):
        np.testing.assert_allclose(theirs, folders[case][1], rtol=0, atol=1e-6)


def test_check_names_what_does_not_fit(folders):
    """A tensor missing and one timm's Eva lacks are each named, the folder's own pass; a key
    bias (timm's is a zero buffer) is refused."""
    folder, _, _ = folders["eva02_base"]
    model, _, size = load_tower(folder)
    tensors, _ = safetensors_io.read(folder / "model.safetensors")
    timm_eva.check(tensors, model, size, "f")
    bad = {k: v for k, v in tensors.items() if k != "blocks.0.mlp.norm.weight"}
    bad["blocks.0.attn.k_proj.bias"] = tensors["blocks.0.attn.q_proj.bias"]
    with pytest.raises(CheckpointError) as e:
        timm_eva.check(bad, model, size, "f")
    assert "blocks.0.mlp.norm.weight" in str(e.value) and "k_proj.bias" in str(e.value)
    params = timm_eva.from_timm(tensors, 4)
    block = params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_1"]
    block["key"]["bias"] = block["query"]["bias"]  # timm's Eva has no key bias
    with pytest.raises(CheckpointError, match="key/bias .* has no place in timm's Eva"):
        timm_eva.to_timm(params, model)
    with pytest.raises(CheckpointError, match="not in timm's Eva layout"):
        timm_eva.from_timm({**tensors, "blocks.0.attn.gate.weight": tensors["head.weight"]}, 4)
