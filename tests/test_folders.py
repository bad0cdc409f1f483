"""timm's hub folders (config.json naming `architecture` + model.safetensors, as timm's
`save_for_hf` writes them) load with timm's logits; other folders and towers a bare file
cannot name are refused in one line."""

import json

import numpy as np
import pytest
from format_helpers import run_in_timm
from helpers import MISSING, images, logits

from vit_jax import weights
from vit_jax.weights import CheckpointError, read, towers

# timm builds the model, perturbs every tensor (biases and LayerNorms leave their init) and
# writes its hub folder; run_in_timm then computes its logits.
SAVED = """
import torch, timm
from timm.models._hub import save_for_hf
torch.manual_seed({seed})
model = timm.create_model({arch!r}, pretrained=False, num_classes=4, **{kwargs!r}).eval()
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.02 * torch.randn_like(p))
save_for_hf(model, {out!r}, model_config={{"label_names": list("abcd")}}, safe_serialization=True)
"""
CASES = {
    "vit_tiny": ("vit_tiny_patch16_224", {}),
    "deit3_plain": ("deit3_small_patch16_224", dict(depth=2, init_values=0, no_embed_class=False)),
    "deit3_layerscale": ("deit3_small_patch16_224", dict(depth=2)),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{case: (folder, timm's logits on `images(224)`)}, made by timm in one subprocess."""
    try:
        import timm  # noqa: F401
    except Exception as e:  # noqa: BLE001 (a torchvision built for another torch raises too)
        pytest.skip(f"{MISSING} timm does not import ({type(e).__name__}: {e}); run ./setup.sh")
    tmp = tmp_path_factory.mktemp("timm_folders")
    np.save(tmp / "x.npy", images(224))
    jobs = [
        dict(
            recipe=SAVED.format(seed=i, arch=a, kwargs=k, out=str(tmp / c)),
            images=str(tmp / "x.npy"),
        )
        for i, (c, (a, k)) in enumerate(CASES.items())
    ]
    return {c: (tmp / c, out) for c, out in zip(CASES, run_in_timm(jobs, tmp), strict=True)}


def relative_error(ours, theirs):
    return np.abs(ours - theirs).max() / np.abs(theirs).max()


@pytest.mark.parametrize("case", ["vit_tiny", "deit3_plain"])
def test_timm_folder_loads_with_timm_logits(folders, case):
    """The folder loads with timm's logits (max|Δ|/max|ref| <= 1e-5), its numerics (exact
    GELU, eps 1e-6: the tanh form's logits differ) and class names from config.json, its
    architecture and arguments carried in Meta; the safetensors file alone loads the same."""
    folder, theirs = folders[case]
    arch, kwargs = CASES[case]
    assert read.detect_format(folder) == "timm_folder"
    loaded = weights.load(folder)
    m, x = loaded.model, images(224)
    assert (m.gelu, m.layer_norm_eps, m.num_classes) == ("exact", 1e-6, 4)
    assert loaded.labels == list("abcd") and loaded.image_size == (224, 224)
    assert m.depth == kwargs.get("depth", 12)
    ours = logits(m, loaded.params, x)
    assert relative_error(ours, theirs) <= 1e-5
    assert relative_error(logits(m.clone(gelu="tanh"), loaded.params, x), theirs) > 1e-4
    meta = read.read_meta(folder)
    assert meta.architecture == arch and meta.model_args["num_classes"] == 4
    assert {k: meta.model_args[k] for k in kwargs} == kwargs
    m2, p2, _ = weights.load_model(folder / "model.safetensors")
    np.testing.assert_array_equal(logits(m2, p2, x), ours)


def test_a_tower_folder_loads_and_its_bare_file_needs_the_architecture_named(folders):
    """deit3's LayerScale and position table without a class row (its factory's
    init_values and no_embed_class, which config.json leaves out): the folder loads with
    timm's logits; the bare file is refused in one line listing the candidates, and loads
    the same with the architecture named."""
    folder, theirs = folders["deit3_layerscale"]
    loaded = weights.load(folder)
    assert loaded.model.layer_scale is not None and not loaded.model.embed_prefix
    ours = logits(loaded.model, loaded.params, images(224))
    assert relative_error(ours, theirs) <= 1e-5
    with pytest.raises(CheckpointError) as e:
        weights.load_model(folder / "model.safetensors")
    line = str(e.value)
    assert "\n" not in line and "(ls1.gamma)" in line and "(name=NAME, e.g." in line
    assert line.endswith("one of *_dinov2, deit3_*")
    m, p, _ = weights.load_model(folder / "model.safetensors", "deit3_small_patch16_224")
    np.testing.assert_array_equal(logits(m, p, images(224)), ours)


def test_a_bare_siglip_file_of_timm_is_refused_for_its_gelu(tmp_path):
    """A SigLIP's MAP head leaves no trace of its GELU form (SigLIP 2's tanh, the first
    SigLIP's exact): a bare file of timm's needs its architecture named."""
    from vit_jax.weights import safetensors_io  # noqa: PLC0415

    path = tmp_path / "siglip.safetensors"
    safetensors_io.write(path, {"attn_pool.latent": np.zeros((1, 1, 8), np.float32)}, {})
    with pytest.raises(CheckpointError, match=r"\(attn_pool.latent\).*one of \*_siglip_\*"):
        weights.load_model(path)


def test_timm_architectures_and_arguments_are_routed():
    """Each architecture to its family's key map with the fields its tensors cannot tell,
    model_args over its row; an architecture or argument the model lacks, one line each."""
    assert towers.timm_tower("vit_base_patch16_224") == (
        "vit",
        dict(gelu="exact", layer_norm_eps=1e-6),
    )
    family, fields = towers.timm_tower("deit3_base_patch16_384", dict(no_embed_class=False))
    assert family == "vit" and fields["embed_prefix"] is True
    assert towers.timm_tower("vit_small_patch16_dinov3")[0] == "eva"
    assert (
        towers.timm_tower("vit_small_patch16_dinov3", dict(global_pool="token"))[1]["classifier"]
        == "token"
    )
    for unread in ("convnext_tiny", "vit_base_patch16_rope_224", "vit_pe_core_base_patch16_224"):
        with pytest.raises(CheckpointError, match=f"timm architecture '{unread}' is not one"):
            towers.timm_tower(unread)
    with pytest.raises(CheckpointError, match="timm's global_pool='avgmax' is not computed"):
        towers.timm_tower("vit_tiny_patch16_224", dict(global_pool="avgmax"))


def test_other_folders_are_told_apart_and_refused_in_one_line(tmp_path):
    """config.json with `architecture`: timm's; with `model_type`: transformers'; neither, or
    none: one line naming what the folder holds."""
    for name, cfg in {
        "t": {"architecture": "x"},
        "h": {"model_type": "vit"},
        "o": {"a": 1},
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    assert read.detect_format(tmp_path / "t") == "timm_folder"
    assert read.detect_format(tmp_path / "h") == "hf"
    (tmp_path / "o" / "open_clip_model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as e:
        read.detect_format(tmp_path / "o")
    line = str(e.value)
    assert "\n" not in line and "names no timm architecture or transformers model_type" in line
    assert "(it holds config.json, open_clip_model.safetensors)" in line
    (tmp_path / "o" / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"without config.json \(it holds open_clip_model"):
        read.detect_format(tmp_path / "o")
