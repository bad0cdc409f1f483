"""A tower's position table at another size is resized as its source resizes it, checked
against the source itself at that size, the grid grown and shrunk, within 1e-5 of the
largest value (float32): timm's hub folder (read by `load_model`, and by `load_pretrained`,
fine-tuning's way in) against timm built at that size, which resizes the table as it loads
it (bicubic with antialias); transformers' folders against the model's own interpolation
(DINOv2: bicubic; DINOv2 with registers: with antialias; CLIP, SigLIP: bicubic, with
interpolate_pos_encoding=True)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from vit_jax.models import apply_with_intermediates
from vit_jax.weights import load_model, load_pretrained
from vit_jax.weights.read import read_meta

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
from test_towers_hf import SMALL as HF_SMALL  # noqa: E402
from test_towers_hf import close, saved  # noqa: E402
from test_towers_hf import images as hf_images  # noqa: E402
from test_towers_timm_vit import assert_close, perturbed, save_folder, torch_logits  # noqa: E402
from test_towers_timm_vit import images as timm_images  # noqa: E402

SMALL = dict(depth=1, embed_dim=64, num_heads=4, num_classes=7)
TIMM = {  # case: (architecture, its image size, the second size)
    "dinov2_grow": ("vit_small_patch14_dinov2", 56, 98),  # 4x4 -> 7x7
    "reg4_dinov2_grow": ("vit_small_patch14_reg4_dinov2", 56, 84),  # no class row
    "deit3_grow": ("deit3_small_patch16_224", 64, 96),  # 4x4 -> 6x6
    "deit3_shrink": ("deit3_small_patch16_224", 64, 48),  # 4x4 -> 3x3
}


@pytest.mark.parametrize("case", TIMM)
def test_timm_folder_resizes_as_timm(case, tmp_path):
    arch, size, other = TIMM[case]
    folder = save_folder(perturbed(arch, depth=1, img_size=size), tmp_path / case)
    weights = dict(file=str(folder / "model.safetensors"), num_classes=SMALL["num_classes"])
    theirs = timm.create_model(
        arch, pretrained=True, pretrained_cfg_overlay=weights, img_size=other, **SMALL
    ).eval()
    assert read_meta(folder).posemb_resize == "bicubic_aa"
    model, params, got_size = load_model(folder, image_size=other)
    assert got_size == (other, other)
    x = timm_images(other)
    assert_close(model.apply({"params": params}, x), torch_logits(theirs, x), case)
    again = load_pretrained(folder, model, other, reset_head=False)  # init_from's way in
    jax.tree.map(np.testing.assert_array_equal, again, params)


HF = {  # case: (model class, config class, extra config, its resize, the second size)
    "dinov2_grow": ("Dinov2Model", "Dinov2Config", {}, "bicubic", 48),
    "dinov2_shrink": ("Dinov2Model", "Dinov2Config", {}, "bicubic", 24),
    "dinov2_registers_grow": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        dict(num_register_tokens=2),
        "bicubic_aa",
        48,
    ),
    "dinov2_registers_shrink": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        dict(num_register_tokens=2),
        "bicubic_aa",
        24,
    ),
    "clip_grow": ("CLIPVisionModel", "CLIPVisionConfig", {}, "bicubic", 48),
    "siglip_shrink": ("SiglipVisionModel", "SiglipVisionConfig", {}, "bicubic", 24),
}


@pytest.mark.parametrize("case", HF)
def test_transformers_folder_resizes_as_transformers(case, tmp_path):
    model_class, config_class, extra, resize, other = HF[case]
    config = getattr(transformers, config_class)(**HF_SMALL, image_size=32, patch_size=8, **extra)
    theirs = getattr(transformers, model_class)(config)
    path = saved(theirs, tmp_path)  # a 4x4 table
    x, pixels = hf_images(other, other)
    interpolate = {} if "Dinov2" in model_class else dict(interpolate_pos_encoding=True)
    with torch.no_grad():
        want = theirs(pixels, **interpolate).pooler_output
    assert read_meta(path).posemb_resize == resize
    model, params, _ = load_model(path, image_size=other, head=False)
    close(np.asarray(apply_with_intermediates(model, params, x)[1]["pre_logits"]), want)
