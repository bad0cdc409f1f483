"""The towers' fields travel with the weights (Meta.fields in npz and timm files), into
fine-tuning (build_model with an empty name), the planner, the ONNX export's refusal, the
NaFlex line, the figures (registers reported apart) and the size table."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import flat, logits, random_params, tiny_config, unflat

from vit_jax.configs.common import model_fields
from vit_jax.inspection import attention, report
from vit_jax.models import apply_with_intermediates, count_params, get_model, param_shapes
from vit_jax.training import abstract, state
from vit_jax.training import report as train_report
from vit_jax.training.check import problems
from vit_jax.weights import convert, load_model, onnx_export, safetensors_io
from vit_jax.weights.meta import NPZ_KEYS, Meta
from vit_jax.weights.npz import read_meta

SIZE = dict(patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=48)
# Every field the tensors cannot tell (rope, posemb 'none', 'gap' beside a class token,
# LayerScale's value) with those they do (registers, fc_norm, SwiGLU, no key bias).
TOWER = dict(
    registers=2,
    layer_scale=1e-4,
    rope="dinov3",
    posemb="none",
    classifier="gap",
    class_token=True,
    fc_norm=True,
    swiglu=True,
    qkv_bias="qv",
    gelu="exact",
)
TOLD = dict(layer_scale=1e-4, rope="dinov3", posemb="none", classifier="gap", class_token=True)
X = np.random.default_rng(1).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)


def tower(num_classes=5, seed=0, **fields):
    """A tiny model of `fields` with random parameters, its LayerScale gains ~N(1, 0.5)."""
    model = get_model(None, num_classes, **SIZE, **fields)
    params = flat(random_params(model, 16, seed))
    rng = np.random.default_rng(seed + 1)
    for k in [k for k in params if "layer_scale" in k]:
        params[k] = rng.normal(1, 0.5, params[k].shape).astype(np.float32)
    return model, unflat(params)


def fields_of(model) -> dict:
    return {k: getattr(model, k) for k in (*TOWER, "posemb_grid", "rope_base", "rope_grid")}


def test_npz_carries_the_fields_and_the_logits_come_back_bit_for_bit(tmp_path):
    model, params = tower(**TOWER)
    assert Meta.of_model(model).fields == TOLD
    out = str(tmp_path / "tower.npz")
    convert.write(params, model, (16, 16), "npz", out)
    assert read_meta(out).fields == TOLD and read_meta(out).posemb_grid == (4, 4)
    got, got_params, size = load_model(out)  # the grid of a model without a table: recorded
    assert size == (16, 16) and fields_of(got) == fields_of(model.clone(posemb_grid=(4, 4)))
    np.testing.assert_array_equal(logits(got, got_params, X), logits(model, params, X))


def test_timm_metadata_carries_the_fields(tmp_path):
    """timm's VisionTransformer towers (rotary embeddings are its Eva's: not written): 'gap'
    beside a class token and LayerScale's value are in the metadata alone."""
    vit = dict(classifier="gap", class_token=True, swiglu=True, fc_norm=True)
    model, params = tower(**vit, gelu="exact")
    out = str(tmp_path / "tower.safetensors")
    convert.write(params, model, (16, 16), "timm", out)
    got, got_params, _ = load_model(out)
    assert {k: getattr(got, k) for k in vit} == vit
    np.testing.assert_array_equal(logits(got, got_params, X), logits(model, params, X))
    # Registers and LayerScale: written with their fields (read.py reads a bare file's
    # registers once it trusts this metadata).
    model, params = tower(registers=2, layer_scale=1e-4, classifier="gap", class_token=True)
    convert.write(params, model, (16, 16), "timm", out.replace("tower", "registers"))
    metadata = safetensors_io.read_metadata(out.replace("tower", "registers"))
    told = dict(layer_scale=1e-4, classifier="gap", class_token=True)
    assert Meta.from_timm(metadata, out).fields == told


def test_the_papers_files_carry_no_fields_entry():
    for model in (get_model("testing", 10), get_model("testing", 10, classifier="gap")):
        meta = Meta.of_model(model)
        assert meta.fields == {} and NPZ_KEYS["fields"] not in meta.to_npz()
        assert NPZ_KEYS["fields"] not in meta.to_timm()
    with pytest.raises(Exception, match="fields \\['colour'\\]: no VisionTransformer field"):
        Meta(fields={"colour": 1})


def test_empty_name_fine_tunes_the_architecture_of_init_from(tmp_path):
    model, params = tower(**TOWER)
    path = str(tmp_path / "tower.npz")
    convert.write(params, model, (16, 16), "npz", path)
    cfg = model_fields("")  # the defaults: every size unset
    built = state.build_model(cfg, 3, path, image_size=16)
    sizes = {k: getattr(built, k) for k in SIZE}
    assert sizes == SIZE and fields_of(built) == fields_of(model.clone(posemb_grid=(4, 4)))
    start = state.Start(seed=0, image_size=16, init_from=path)
    said = []
    got = flat(state.init_params(start, built, said))
    assert not got["head/kernel"].any() and got["head/kernel"].shape == (32, 3)
    for k, v in flat(params).items():
        if not k.startswith("head/"):
            np.testing.assert_array_equal(got[k], v, err_msg=k)
    # A config that changes the pooling from its default keeps it; a name: the file's
    # record (rope, ...) over the name's sizes.
    cfg.classifier = "token"  # the default: the file's 'gap'
    assert state.build_model(cfg, 3, path).classifier == "gap"
    named = model_fields("testing")
    named.posemb = "none"
    other = state.build_model(named, 3, path)
    assert (other.width, other.rope, other.layer_scale) == (32, "dinov3", 1e-4)
    with pytest.raises(ValueError, match="name is empty.*init_from is not set"):
        state.build_model(cfg, 3)
    run = tiny_config(init_from=path, image_size=16, model=model_fields(""))
    assert problems(run) == []  # the config check leaves the model to the file
    assert [p.field for p in problems(tiny_config(model=model_fields("")))] == ["model.name"]


def test_the_planner_builds_init_froms_architecture(tmp_path):
    from vit_jax.parallel import sharding

    model, params = tower(**TOWER)
    path = str(tmp_path / "tower.npz")
    convert.write(params, model, (16, 16), "npz", path)
    config = tiny_config(init_from=path, image_size=16, model=model_fields(""))
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
    _, abstract_state, batch = abstract.loop_step(config, mesh, 3)
    shapes = flat(abstract_state.params)
    assert shapes["reg"].shape == (1, 2, 32) and shapes["head/kernel"].shape == (32, 3)
    assert "Transformer/posembed_input/pos_embedding" not in shapes
    assert batch["image"].shape == (config.batch_size, 16, 16, 3)


def test_onnx_and_hf_refuse_the_fields_they_do_not_write(tmp_path):
    model, params = tower(**TOWER)
    with pytest.raises(ValueError, match="transformers' ViT is the paper's, not registers=2"):
        convert.write(params, model, (16, 16), "hf", str(tmp_path / "hf"))
    with pytest.raises(ValueError) as e:
        onnx_export.build(params, model, (16, 16))
    said = str(e.value)
    for name in ("registers=2", "layer_scale=0.0001", "fc_norm=True", "swiglu=True"):
        assert name in said, said
    assert "qkv_bias='qv'" in said and "rope='dinov3'" in said and "class_token=True" in said
    assert onnx_export.unwritten(get_model("testing", 10, classifier="gap")) == []


def test_naflex_line_counts_the_prefix():
    from vit_jax.data.naflex import Lengths

    lengths = Lengths((16,), 64, 1, 0)
    line = train_report.naflex_line(lengths, [24], 3)
    assert "4 images of 16 patches + 3 prefix tokens (padded to 24 tokens)" in line
    assert "padded" not in train_report.naflex_line(lengths, [19], 3)
    assert "16 patches + class token;" in train_report.naflex_line(lengths, [17], 1)


def test_figures_run_over_the_patches_and_report_the_registers_apart():
    model, params = tower(registers=2, num_classes=4)  # class token, 'token' pooling
    result = report.compute(model, params, X)
    _, inter = apply_with_intermediates(model, params, X)
    att = np.asarray(inter["attention"], np.float64)  # [L, B, H, 19, 19]
    rollout = np.asarray(attention.attention_rollout(att))
    want = rollout[:, 0, 3:].reshape(2, 4, 4)  # the class token's row over the patches
    np.testing.assert_allclose(result.arrays["rollout"], want, rtol=1e-5)
    patches = att[..., 3:, 3:]  # the registers' rows and columns dropped
    want = attention.mean_attention_distance(patches, (4, 4), 4, 0).mean(1)
    np.testing.assert_allclose(result.arrays["attention_distance"], want, rtol=1e-5)
    shares = np.stack([att[-1].mean(1)[:, 0, 1:3].sum(-1), rollout[:, 0, 1:3].sum(-1)], -1)
    np.testing.assert_allclose(result.arrays["register_share"], shares, rtol=1e-5)
    assert 0 < shares.min() and shares.max() < 1
    share = result.info["register_share"]
    assert [share["last_layer"], share["rollout"]] == np.round(shares.mean(0), 4).tolist()
    # 'gap' beside a class token: the mean of the patch rows, neither the class's nor a
    # register's.
    gap = np.asarray(attention.flow(rollout, 3, token=False))
    np.testing.assert_allclose(gap, rollout[:, 3:, 3:].mean(1), rtol=1e-6)
    assert "register_share" not in report.compute(*tower(num_classes=4), X).arrays


# Parameter counts of timm 1.0.31's towers without their heads (num_classes=0),
# `create_model(name).parameters()` summed: the table's sizes with the towers' fields.
DINOV3 = dict(registers=4, layer_scale=1e-5, qkv_bias="", posemb="none", rope="dinov3")
TIMM_COUNTS = {
    "vit_so400m_patch14_siglip_224": ("So400m/14", 224, dict(classifier="map"), 427_680_704),
    "vit_giant_patch14_dinov2": ("g/14", 518, dict(layer_scale=1e-5), 1_136_479_232),
    "vit_huge_plus_patch16_dinov3": ("H+/16", 256, DINOV3, 840_509_440),
}


@pytest.mark.parametrize("timm_name", sorted(TIMM_COUNTS))
def test_new_sizes_count_as_timms_towers(timm_name):
    name, size, fields, count = TIMM_COUNTS[timm_name]
    assert count_params(param_shapes(get_model(name, None, **fields), size)) == count
    g_opt = get_model("g-opt/14", None)
    assert (g_opt.width, g_opt.depth, g_opt.num_heads, g_opt.mlp_dim) == (1536, 40, 16, 6144)
