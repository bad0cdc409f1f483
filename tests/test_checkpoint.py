"""Published .npz checkpoints: every layout, exact logits against NumPy, resizing, errors."""

from pathlib import Path

import numpy as np
import pytest
from helpers import (
    FIDELITY_ATOL,
    assert_npz_equal,
    assert_recorded,
    assert_trees_equal,
    images,
    logits,
    quiet_params,
    random_params,
    unflat,
)
from helpers import flat as flatten
from numpy_reference import resize_posemb as ref_resize_posemb
from numpy_reference import vit_logits

from vit_jax import weights
from vit_jax.models import get_model, param_shapes
from vit_jax.weights import CheckpointError, architecture
from vit_jax.weights.meta import Meta

POSEMB = "Transformer/posembed_input/pos_embedding"


# ------------------------------------------------------------------ exact numerics


PLAIN = dict(name="testing", overrides=dict(patch_size=8, num_heads=4), native=32)
HYBRID = dict(
    name="R50+B/16",
    overrides=dict(width=64, depth=1, num_heads=2, mlp_dim=32, resnet_stages=(1, 1)),
    native=32,
)
GAP = dict(
    name="testing",
    overrides=dict(patch_size=8, classifier="gap", representation_size=24),
    native=32,
)


# Logits of the fixtures above, each saved as a published .npz and loaded as a user loads
# it, recorded by the code before issue 27 reshaped the modules (at e47987d), one set per
# JAX version (another compiler rounds its own way). VIT_JAX_RECORD_LOGITS=1 adds this
# JAX's set from the code in the working tree, for a JAX that has none.
RECORDED = Path(__file__).parent / "recorded_logits.npz"


def published_logits(tmp: Path) -> dict[str, np.ndarray]:
    """{case_size: logits [4, 5]} of PLAIN, HYBRID and GAP at their size and at 48 px."""
    out = {}
    for name, case in {"plain": PLAIN, "hybrid": HYBRID, "gap": GAP}.items():
        model = get_model(case["name"], 5, **case["overrides"])
        path = tmp / f"{name}.npz"
        weights.save_npz(path, quiet_params(model, case["native"]))
        for size in (case["native"], 48):
            loaded, params, _ = weights.load_model(path, image_size=(size, size))
            out[f"{name}_{size}"] = np.asarray(logits(loaded, params, images(size)))
    return out


def test_published_files_load_to_the_recorded_logits(tmp_path):
    """The same files load to the same logits as the code recorded: bit for bit on a
    machine of the recorded JAX and CPU (`cpu_signature`: XLA:CPU rounds the last bits
    by the CPU it compiles for: AMD EPYC and Intel Xeon with AVX-512 disagree at ~1e-6),
    within FIDELITY_ATOL of every recorded set elsewhere. VIT_JAX_RECORD_LOGITS=1 adds
    this machine's set where it has none."""
    got = published_logits(tmp_path)
    assert_recorded(got, RECORDED, least_sets=2)
    assert np.abs(got["plain_32"]).max() > 0.5  # not near-zeros


@pytest.mark.parametrize("case", [PLAIN, HYBRID, GAP], ids=["plain", "hybrid", "gap_prelogits"])
def test_logits_match_numpy_reference(case, tmp_path):
    model = get_model(case["name"], 5, **case["overrides"])
    native = case["native"]
    path = tmp_path / "ckpt.npz"
    weights.save_npz(path, quiet_params(model, native))
    flat = dict(np.load(path))
    ref_kw = dict(
        num_heads=model.num_heads,
        patch_size=model.patch_size,
        classifier=model.classifier,
        resnet_stages=model.resnet_stages,
    )
    for size in (native, 48, (32, 48)):  # native, higher, non-square
        x = images(size)
        params = weights.load_pretrained(path, model, size, reset_head=False)
        ref = dict(flat)
        if size != native:
            grid = model.grid((size, size) if isinstance(size, int) else size)
            ref[POSEMB] = ref_resize_posemb(flat[POSEMB], grid, model.has_class_token)
        want = vit_logits(ref, x, **ref_kw)
        got = logits(model, params, x)
        assert np.abs(want).max() > 0.5  # the comparison is not between near-zeros
        np.testing.assert_allclose(got, want, atol=FIDELITY_ATOL, rtol=0)


def test_scanned_model_loads_the_same_file(tmp_path):
    model = get_model("testing", 5)
    path = tmp_path / "ckpt.npz"
    weights.save_npz(path, quiet_params(model, 32))
    scanned = get_model("testing", 5, scan=True)
    p = weights.load_pretrained(path, scanned, 32, reset_head=False)
    assert p["Transformer"]["encoderblock"]["LayerNorm_0"]["scale"].shape == (2, 32)
    x = images(32)
    np.testing.assert_allclose(
        logits(scanned, p, x),
        vit_logits(dict(np.load(path)), x, num_heads=2, patch_size=16),
        atol=FIDELITY_ATOL,
        rtol=0,
    )
    # Saving the scanned tree writes the published per-block names again.
    weights.save_npz(tmp_path / "again.npz", p)
    assert_npz_equal(tmp_path / "again.npz", path)


@pytest.mark.parametrize(
    "stages,native,bigger",
    [((), 64, 96), ((1, 1, 1), 64, 96), ((1, 1, 1, 1), 64, 128)],
    ids=["root_only", "three_stages", "four_stages"],
)
def test_hybrid_stems_match_numpy_reference(stages, native, bigger, tmp_path):
    """The root-only stem (R+ViT-Ti_16's) and stems of 3 and 4 stages (R50+ViT-B_16's,
    R50+ViT-L_32's), small widths, at the native size and after a posemb resize."""
    patch = 4 if not stages else 1
    model = get_model("R50+B/16", 5, width=32, depth=1, num_heads=2, mlp_dim=16,
                      resnet_stages=stages, patch_size=patch)  # fmt: skip
    path = tmp_path / "hybrid.npz"
    weights.save_npz(path, quiet_params(model, native))
    flat = dict(np.load(path))
    for size in (native, bigger):
        x = images(size)
        params = weights.load_pretrained(path, model, size, reset_head=False)
        ref = dict(flat)
        if size != native:
            grid = model.grid((size, size))
            ref[POSEMB] = ref_resize_posemb(flat[POSEMB], grid, True)
        want = vit_logits(ref, x, num_heads=2, patch_size=patch, resnet_stages=stages)
        assert np.abs(want).max() > 0.5
        np.testing.assert_allclose(logits(model, params, x), want, atol=FIDELITY_ATOL, rtol=0)


WRONG_NUMERICS = {
    "eps_1e-5": dict(layer_norm_eps=1e-5),
    "eps_1e-12": dict(layer_norm_eps=1e-12),  # transformers' default
    "exact_gelu": dict(gelu="exact"),
}


@pytest.mark.parametrize("case", [PLAIN, HYBRID, GAP], ids=["plain", "hybrid", "gap_prelogits"])
def test_wrong_numerics_fail_the_fidelity_tolerance(case):
    """The fidelity tests can fail: a LayerNorm epsilon of 1e-5 or 1e-12 instead of the
    original's 1e-6, or the exact GELU instead of tanh, moves the logits of their
    parameters past FIDELITY_ATOL (each at least 10x), the right numerics stay within."""
    model = get_model(case["name"], 5, **case["overrides"])
    params = quiet_params(model, case["native"])
    x = images(case["native"])
    ref_kw = dict(num_heads=model.num_heads, patch_size=model.patch_size,
                  classifier=model.classifier, resnet_stages=model.resnet_stages)  # fmt: skip
    want = vit_logits(flatten(params), x, **ref_kw)
    assert np.abs(logits(model, params, x) - want).max() <= FIDELITY_ATOL
    for name, wrong in WRONG_NUMERICS.items():
        error = np.abs(logits(model.clone(**wrong), params, x) - want).max()
        assert error > 10 * FIDELITY_ATOL, (name, error)
        with pytest.raises(AssertionError):
            np.testing.assert_allclose(logits(model.clone(**wrong), params, x), want,
                                       atol=FIDELITY_ATOL, rtol=0)  # fmt: skip


@pytest.mark.parametrize(
    "numerics",
    [dict(gelu="exact", layer_norm_eps=1e-12), dict(gelu="exact", layer_norm_eps=1e-6),
     dict(gelu="tanh", layer_norm_eps=1e-5)],
    ids=["exact_1e-12", "exact_1e-6", "tanh_1e-5"],
)  # fmt: skip
def test_other_numerics_are_stored_and_computed(numerics, tmp_path):
    """A model of other numerics (an import of a PyTorch ViT) saved as .npz records them:
    loaded without naming them, it computes the NumPy reference's function with them; the
    original's numerics add nothing to the file."""
    model = get_model("testing", 5, patch_size=8, **numerics)
    params = quiet_params(model, 32)
    weights.save_npz(tmp_path / "m.npz", params, Meta(**numerics))
    with np.load(tmp_path / "m.npz") as f:
        assert "vit_jax_numerics" in f.files  # one entry beside the parameters
    loaded, p, _ = weights.load_model(tmp_path / "m.npz")
    assert (loaded.gelu, loaded.layer_norm_eps) == (numerics["gelu"], numerics["layer_norm_eps"])
    assert_trees_equal(p, params)
    x = images(32)
    want = vit_logits(flatten(params), x, num_heads=2, patch_size=8, **numerics)
    np.testing.assert_allclose(logits(loaded, p, x), want, atol=FIDELITY_ATOL, rtol=0)
    weights.save_npz(tmp_path / "o.npz", params, Meta("tanh", 1e-6))
    weights.save_npz(tmp_path / "none.npz", params)
    assert_npz_equal(tmp_path / "o.npz", tmp_path / "none.npz")  # nothing added


# ------------------------------------------------------------------ layouts


def _renumber(key):
    for old, new in (
        ("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0"),
        ("LayerNorm_2", "LayerNorm_1"),
        ("MlpBlock_3", "MlpBlock_0"),
    ):
        key = key.replace(f"/{old}/", f"/{new}/")
    return key


def big_vision(flat, scanned=False):
    out = {_renumber(k): v for k, v in flat.items() if k != POSEMB}
    out["pos_embedding"] = flat[POSEMB][:, 1:]
    if scanned:
        out = weights.stack_blocks(out)
    return {"params/" + k: v for k, v in out.items()}


LAYOUTS = {
    "original": lambda f: f,
    "opt_target": lambda f: {"opt/target/" + k: v for k, v in f.items()},
    "big_vision": big_vision,
    "big_vision_scanned": lambda f: big_vision(f, scanned=True),
    "old_hybrid_groupnorm": lambda f: {
        k: v.reshape(1, 1, 1, -1) if ("/" + k).split("/")[-2].startswith("gn") else v
        for k, v in f.items()
    },
}


def test_big_vision_files_written_by_hand_match_numpy_reference(tmp_path):
    """big_vision's own key names, written out here (not by the code under test): per-type
    numbering, a top-level pos_embedding without a class row, all blocks stacked under
    Transformer/encoderblock/ (scan), and a gap model with no class token."""
    for classifier in ("token", "gap"):
        model = get_model("testing", 5, classifier=classifier, patch_size=8)
        published = flatten(quiet_params(model, 32, seed=4))
        bv = {"params/embedding/kernel": published["embedding/kernel"],
              "params/embedding/bias": published["embedding/bias"],
              "params/head/kernel": published["head/kernel"],
              "params/head/bias": published["head/bias"]}  # fmt: skip
        for name in ("scale", "bias"):
            key = f"Transformer/encoder_norm/{name}"
            bv[f"params/{key}"] = published[key]
        pe = published[POSEMB]
        if classifier == "token":
            bv["params/cls"] = published["cls"]
            pe = pe[:, 1:]  # big_vision's class token has no position embedding
            published[POSEMB] = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
        bv["params/pos_embedding"] = pe
        new_names = {"LayerNorm_0": "LayerNorm_0", "MultiHeadDotProductAttention_1":
                     "MultiHeadDotProductAttention_0", "LayerNorm_2": "LayerNorm_1",
                     "MlpBlock_3": "MlpBlock_0"}  # fmt: skip
        for key in published:
            if key.startswith("Transformer/encoderblock_0/"):
                old = key.split("/", 2)[2]  # e.g. MlpBlock_3/Dense_0/kernel
                module, rest = old.split("/", 1)
                stacked = np.stack([published[f"Transformer/encoderblock_{i}/{old}"]
                                    for i in range(model.depth)])  # fmt: skip
                bv[f"params/Transformer/encoderblock/{new_names[module]}/{rest}"] = stacked
        np.savez(tmp_path / "bv.npz", **bv)
        params = weights.load_pretrained(tmp_path / "bv.npz", model, 32, reset_head=False)
        x = images(32)
        want = vit_logits(published, x, num_heads=2, patch_size=8, classifier=classifier)
        assert np.abs(want).max() > 0.5
        np.testing.assert_allclose(logits(model, params, x), want, atol=FIDELITY_ATOL, rtol=0)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_round_trips_bit_exactly(layout, tmp_path):
    model = get_model(
        "R50+B/16",
        3,
        width=64,
        depth=2,
        num_heads=2,
        mlp_dim=32,
        resnet_stages=(1,),
        representation_size=16,
    )
    flat = flatten(random_params(model, 32))
    flat[POSEMB][:, 0] = 0.0  # big_vision files have no class row: it reads back as zeros
    stored = LAYOUTS[layout](dict(flat))
    differs = stored.keys() != flat.keys() or any(
        stored[k].shape != v.shape for k, v in flat.items()
    )
    assert differs == (layout != "original")
    np.savez(tmp_path / "in.npz", **stored)
    loaded = flatten(weights.load_npz(tmp_path / "in.npz"))
    assert_trees_equal(loaded, flat)
    weights.save_npz(tmp_path / "out.npz", unflat(loaded))
    with np.load(tmp_path / "out.npz") as out:
        assert_trees_equal(out, flat)  # the original layout's names


# ------------------------------------------------------------------ load_pretrained


def test_posemb_resize_is_the_original_bilinear_zoom(tmp_path):
    model = get_model("testing", 5)
    params = random_params(model, 32)
    path = tmp_path / "c.npz"
    weights.save_npz(path, params)
    stored = np.load(path)[POSEMB]
    got = weights.load_pretrained(path, model, (64, 96))["Transformer"]["posembed_input"]
    got = got["pos_embedding"]
    assert got.shape == (1, 1 + 4 * 6, 32)
    np.testing.assert_array_equal(got[0, 0], stored[0, 0])  # class row kept
    np.testing.assert_allclose(got, ref_resize_posemb(stored, (4, 6)), atol=1e-6)
    # Corners of a bilinear zoom are the stored corners.
    np.testing.assert_allclose(got[0, 1], stored[0, 1], atol=1e-6)
    np.testing.assert_allclose(got[0, -1], stored[0, -1], atol=1e-6)


def test_head_reset_kept_and_checked(tmp_path):
    model = get_model("testing", 5, representation_size=32)
    path = tmp_path / "c.npz"
    weights.save_npz(path, random_params(model, 32))
    stored = np.load(path)
    kept = weights.load_pretrained(path, model, 32, reset_head=False)
    np.testing.assert_array_equal(kept["head"]["kernel"], stored["head/kernel"])
    np.testing.assert_array_equal(kept["pre_logits"]["kernel"], stored["pre_logits/kernel"])
    # Fine-tuning: no representation layer, a zero head of the new width.
    finetune = get_model("testing", 10)
    new = weights.load_pretrained(path, finetune, 48)
    assert "pre_logits" not in new
    assert new["head"]["kernel"].shape == (32, 10) and not new["head"]["kernel"].any()
    assert not new["head"]["bias"].any()
    np.testing.assert_array_equal(new["cls"], stored["cls"])
    with pytest.raises(CheckpointError, match="head for 5 classes, the model has 10"):
        weights.load_pretrained(
            path, get_model("testing", 10, representation_size=32), 32, reset_head=False
        )
    with pytest.raises(CheckpointError, match="pre_logits layer .width 32"):
        weights.load_pretrained(path, get_model("testing", 5), 32, reset_head=False)
    assert architecture.architecture(weights.load_npz(path)) == dict(
        width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=16, resnet_stages=None,
        channels=3, classifier="token", representation_size=32, posemb="learned",
        registers=0, layer_scale=None, pre_norm=False, fc_norm=False, swiglu=False,
        mlp_norm=False, attention_norm=False, qkv_bias="qkv", class_token=True,
        embed_prefix=True,
    )  # fmt: skip


# ------------------------------------------------------------------ bad input


@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.npz"
    weights.save_npz(path, random_params(get_model("testing", 5), 32))
    return path


def _bad(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_unreadable_files_give_clear_errors(tmp_path, good_file):
    data = good_file.read_bytes()
    with pytest.raises(FileNotFoundError, match="missing.npz: no such file"):
        weights.load_npz(tmp_path / "missing.npz")
    truncated = _bad(tmp_path, "truncated.npz", data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated.npz is truncated or corrupt"):
        weights.load_npz(truncated)
    flipped = bytearray(data)
    flipped[len(data) // 3 : len(data) // 3 + 64] = bytes(64)
    corrupt = _bad(tmp_path, "corrupt.npz", bytes(flipped))
    with pytest.raises(CheckpointError, match="corrupt.npz"):
        weights.load_npz(corrupt)
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="pickled Python objects; they are never loaded"):
        weights.load_npz(tmp_path / "objects.npz")
    import pickle

    pickled = _bad(tmp_path, "pickled.npz", pickle.dumps({"embedding": 1}))
    with pytest.raises(CheckpointError, match="pickled"):
        weights.load_npz(pickled)
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(CheckpointError, match="single .npy array"):
        weights.load_npz(tmp_path / "single.npy")
    assert good_file.read_bytes() == data  # reading touches nothing


def test_file_of_another_variant_names_keys_and_guesses(tmp_path):
    ti = get_model("ViT-Ti_16", 1000)
    flat = {k: np.zeros(s.shape, np.float32) for k, s in flatten(param_shapes(ti, 224)).items()}
    path = tmp_path / "ViT-Ti_16.npz"
    weights.save_npz(path, unflat(flat))
    with pytest.raises(CheckpointError) as e:
        weights.load_pretrained(path, get_model("ViT-S_16", 10), 224)
    msg = str(e.value)
    assert "key embedding/kernel has shape (16, 16, 3, 192), model expects (16, 16, 3, 384)" in msg
    assert "looks like ViT-Ti_16" in msg
    assert (
        "key Transformer/encoderblock_0/LayerNorm_0/bias has shape (192,), model expects "
        "(384,) (and in 11 more blocks)"
    ) in msg


def test_missing_and_extra_keys_are_named(tmp_path, good_file):
    deeper = get_model("testing", 5, depth=3)
    with pytest.raises(CheckpointError) as e:
        weights.load_pretrained(good_file, deeper, 32)
    assert (
        "key Transformer/encoderblock_2/LayerNorm_0/bias is missing (model expects (32,))"
        in str(e.value)
    )
    shallower = get_model("testing", 5, depth=1)
    with pytest.raises(
        CheckpointError,
        match=r"encoderblock_1/LayerNorm_0/bias \(32,\) is not "
        "in the model",
    ):
        weights.load_pretrained(good_file, shallower, 32)


def test_save_is_atomic(tmp_path, good_file, monkeypatch):
    before = good_file.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        weights.save_npz(good_file, {"a": np.zeros(3)})
    assert good_file.read_bytes() == before  # the old file is untouched


# ------------------------------------------------------------------ native size, 2D tables


def test_learned_2d_tables_resize_per_axis_and_give_the_native_size(tmp_path):
    model = get_model("testing", 5, posemb="learned_2d")
    params = random_params(model, (32, 48))  # grid 2 x 3
    path = tmp_path / "2d.npz"
    weights.save_npz(path, params)
    loaded, back, size = weights.load_model(path)
    assert size == (32, 48) and loaded.posemb == "learned_2d"
    row = params["Transformer"]["posembed_input"]["pos_embedding_row"]  # [1, 2, 16]
    col = params["Transformer"]["posembed_input"]["pos_embedding_col"]  # [1, 3, 16]
    np.testing.assert_array_equal(back["Transformer"]["posembed_input"]["pos_embedding_row"], row)
    big = weights.load_pretrained(path, model, (64, 48), reset_head=False)  # 4 x 3
    pe = big["Transformer"]["posembed_input"]
    assert pe["pos_embedding_row"].shape == (1, 4, 16)
    np.testing.assert_array_equal(pe["pos_embedding_col"], col)  # its axis kept its size
    # Linear on the line with the end points kept (scipy.ndimage.zoom order 1, as the
    # original code resizes): 2 rows -> 4 at t = 0, 1/3, 2/3, 1.
    t = np.arange(4)[:, None] / 3
    want = row[0, 0] * (1 - t) + row[0, 1] * t
    np.testing.assert_allclose(pe["pos_embedding_row"][0], want, atol=1e-6)


def test_a_non_square_1d_grid_needs_the_image_size(tmp_path):
    model = get_model("testing", 5)
    path = tmp_path / "wide.npz"
    weights.save_npz(path, random_params(model, (32, 48)))  # 6 patch tokens: not square
    square = r"6 patch tokens, not a square grid.*image_size=\(H, W\)"
    with pytest.raises(CheckpointError, match=square):
        weights.load_model(path)
    _, params, size = weights.load_model(path, image_size=(32, 48))
    assert size == (32, 48)
    assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 7, 32)
