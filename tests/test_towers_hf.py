"""transformers' vision towers read by weights/hf_towers.py compute what transformers does:
tiny random models, every tensor perturbed (LayerScale gains near 1, so that registers,
LayerScale and RoPE count), saved with save_pretrained, read back; our pre-logits features
against `pooler_output` (and CLIP's `image_embeds` through the head) within 1e-5 of their
largest value, in float32."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from vit_jax.models import get_model
from vit_jax.models.naflex import patchify
from vit_jax.weights import architecture
from vit_jax.weights.adapt import adapt
from vit_jax.weights.errors import CheckpointError
from vit_jax.weights.hf_towers import read_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def load_tower(path, head: bool = True, image_size=None):
    """(model, params, (H, W)) of a transformers folder, as `load_model(path)` will give."""
    params, fields, _ = read_dir(path)
    grid = fields.pop("posemb_grid")
    classes = architecture.num_classes(params) if head else None
    model = get_model(None, classes, **{**architecture.architecture(params), **fields})
    size = image_size or (grid[0] * model.patch_size, grid[1] * model.patch_size)
    model = model.clone(posemb_grid=model.grid(size))
    return model, adapt(params, model, size, False, "test"), size


def saved(model, tmp_path, **save) -> str:
    """`model` with every tensor perturbed, in eval mode, saved to a folder."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "lambda1" in name:  # LayerScale: normal(1, 0.5)
                p.copy_(1 + 0.5 * noise)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)
    model.eval().save_pretrained(tmp_path, **save)
    return str(tmp_path)


def ours(path, x: np.ndarray | dict, head: bool = False, image_size=None) -> np.ndarray:
    model, params, _ = load_tower(path, head, image_size)
    return np.asarray(jax.jit(model.apply)({"params": params}, x))


def close(got, want) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else want
    assert got.shape == want.shape
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-5


def images(h: int, w: int, b: int = 2) -> tuple[np.ndarray, object]:
    x = np.random.default_rng(1).normal(size=(b, h, w, 3)).astype(np.float32)  # NHWC
    return x, torch.from_numpy(x.transpose(0, 3, 1, 2).copy())  # NCHW


CASES = {  # name: (model class, config)
    "dinov2": ("Dinov2Model", "Dinov2Config", dict(mlp_ratio=2, patch_size=8)),
    "dinov2_swiglu": ("Dinov2Model", "Dinov2Config", dict(use_swiglu_ffn=True, patch_size=8)),
    "dinov2_registers": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        dict(num_register_tokens=3, patch_size=8, hidden_act="gelu_pytorch_tanh"),
    ),
    "dinov3_gated": (
        "DINOv3ViTModel",
        "DINOv3ViTConfig",
        dict(use_gated_mlp=True, hidden_act="silu", num_register_tokens=2, patch_size=8),
    ),
    "dinov3_biases": (
        "DINOv3ViTModel",
        "DINOv3ViTConfig",
        dict(key_bias=True, query_bias=False, proj_bias=False, mlp_bias=False, patch_size=16),
    ),
    "siglip": ("SiglipVisionModel", "SiglipVisionConfig", dict(patch_size=8)),
}  # CLIP: below, with its projection


@pytest.mark.parametrize("name", CASES)
def test_pooler_output(name, tmp_path):
    model_class, config_class, extra = CASES[name]
    config = getattr(transformers, config_class)(**SMALL, image_size=32, **extra)
    model = getattr(transformers, model_class)(config)
    path = saved(model, tmp_path)
    x, pixels = images(32, 32)
    with torch.no_grad():
        want = model(pixels).pooler_output
    close(ours(path, x), want)


def test_dinov3_rope_on_another_shape(tmp_path):
    """RoPE on each image's own grid: a 32x48 image on a tower made for 32x32."""
    config = transformers.DINOv3ViTConfig(**SMALL, image_size=32, patch_size=8, rope_theta=50.0)
    model = transformers.DINOv3ViTModel(config)
    path = saved(model, tmp_path)
    x, pixels = images(32, 48)
    with torch.no_grad():
        want = model(pixels).pooler_output
    close(ours(path, x, image_size=(32, 48)), want)


def test_clip_projection_is_the_head(tmp_path):
    """CLIPVisionModelWithProjection: pooler_output without the head, image_embeds with."""
    config = transformers.CLIPVisionConfig(**SMALL, image_size=32, patch_size=8, projection_dim=24)
    model = transformers.CLIPVisionModelWithProjection(config)
    path = saved(model, tmp_path)
    x, pixels = images(32, 32)
    with torch.no_grad():
        out = model(pixels)
        pooled = model.vision_model(pixels).pooler_output
    close(ours(path, x, head=True), out.image_embeds)
    close(ours(path, x), pooled)


@pytest.mark.parametrize("kind", ["CLIP", "Siglip"])
def test_two_tower_folder_reads_the_image_tower(kind, tmp_path):
    vision = dict(**SMALL, image_size=32, patch_size=8)
    config = getattr(transformers, f"{kind}Config")(vision_config=vision, text_config=TEXT)
    model = getattr(transformers, f"{kind}Model")(config)
    path = saved(model, tmp_path, max_shard_size="100KB")  # shards and their index
    assert (tmp_path / "model.safetensors.index.json").is_file()
    x, pixels = images(32, 32)
    with torch.no_grad():
        pooled = model.vision_model(pixels).pooler_output
        embeds = model.visual_projection(pooled) if kind == "CLIP" else pooled
    close(ours(path, x), pooled)
    close(ours(path, x, head=True), embeds)


def test_siglip2_naflex(tmp_path):
    """SigLIP 2 on NaFlex patches: two images of other shapes than its 4x4 table, padded."""
    config = transformers.Siglip2VisionConfig(**SMALL, patch_size=8, num_patches=16)
    model = transformers.Siglip2VisionModel(config)
    path = saved(model, tmp_path)
    rng = np.random.default_rng(2)
    batch = [
        patchify(rng.normal(size=s).astype(np.float32), 8, 24) for s in [(16, 48, 3), (40, 32, 3)]
    ]
    x = {k: np.concatenate([b[k] for b in batch]) for k in batch[0]}
    with torch.no_grad():
        want = model(
            pixel_values=torch.from_numpy(x["patches"]),
            pixel_attention_mask=torch.from_numpy(x["valid"].astype(np.int64)),
            spatial_shapes=torch.tensor([[2, 6], [5, 4]]),
        ).pooler_output
    close(ours(path, x), want)


def test_other_model_types_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "beit"}))
    with pytest.raises(CheckpointError, match=r"'beit'.*dinov2, dinov2_with_registers"):
        read_dir(tmp_path)
