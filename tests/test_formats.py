"""safetensors, timm and Hugging Face formats: layouts, fidelity, round trips, bad input."""

import json
import re

import numpy as np
import pytest
from format_helpers import HYBRID, TI16, TINY, make, reference_logits, run_in_timm
from helpers import FIDELITY_ATOL, assert_npz_equal, assert_trees_equal, images, logits, python_m

from vit_jax import weights
from vit_jax.models import get_model
from vit_jax.weights import CheckpointError, convert, hf, safetensors_io, timm, timm_recipe
from vit_jax.weights.meta import Meta

# ------------------------------------------------------------------ safetensors


def test_safetensors_round_trip_and_reference_reader(tmp_path):
    import ml_dtypes

    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b.c": np.array([1.5, -2], np.float16),
        "d": np.ones((2, 1), ml_dtypes.bfloat16),
        "e": np.arange(3, dtype=np.int64),
    }
    path = tmp_path / "x.safetensors"
    safetensors_io.write(path, tensors, {"k": "v"})
    got, meta = safetensors_io.read(path)
    assert meta == {"k": "v"}
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
        np.testing.assert_array_equal(got[k].astype(np.float64), v.astype(np.float64))
    st = pytest.importorskip("safetensors.numpy")  # the reference implementation reads it
    safetensors_io.write(path, {k: v for k, v in tensors.items() if k != "d"})  # no NumPy bf16
    ref = st.load_file(str(path))
    for k in ("a", "b.c", "e"):
        np.testing.assert_array_equal(ref[k], tensors[k])


def test_truncated_safetensors_is_named(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors_io.write(path, {"a": np.zeros((100,), np.float32)})
    data = path.read_bytes()
    for cut in (len(data) - 8, 40, 5):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=f"{path.name}.*(truncated|shorter)"):
            safetensors_io.read(path)


def test_safetensors_bad_files_and_dtypes_are_named(tmp_path):
    import struct

    path = tmp_path / "b.safetensors"
    safetensors_io.write(path, {"a": np.arange(3, dtype=">f4")})  # stored little-endian
    np.testing.assert_array_equal(safetensors_io.read(path)[0]["a"], [0, 1, 2])
    assert safetensors_io.read(path)[0]["a"].dtype == np.dtype("<f4")
    data = path.read_bytes()
    path.write_bytes(data + b"xx")
    with pytest.raises(CheckpointError, match="b.safetensors.*truncated or extended"):
        safetensors_io.read(path)
    header = b'{"z":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(CheckpointError, match="'z' has dtype C64, which vit_jax does not read"):
        safetensors_io.read(path)
    path.write_bytes(struct.pack("<Q", 8) + b"[1,2]   ")
    with pytest.raises(CheckpointError, match="b.safetensors.*invalid JSON"):
        safetensors_io.read(path)
    with pytest.raises(ValueError, match="'c': dtype complex64 has no safetensors name"):
        safetensors_io.write(tmp_path / "c.safetensors", {"c": np.zeros(2, np.complex64)})
    assert not (tmp_path / "c.safetensors").exists()


# ------------------------------------------------------------------ timm's table


def timm_table(d, depth, mlp, patch, n_tokens, classes, cls=True, stem=None):
    """timm VisionTransformer's state dict shapes, written from timm's source."""
    t = {
        "pos_embed": (1, n_tokens, d),
        "patch_embed.proj.weight": (d, 3 if stem is None else stem[-1], patch, patch),
        "patch_embed.proj.bias": (d,),
        "norm.weight": (d,),
        "norm.bias": (d,),
        "head.weight": (classes, d),
        "head.bias": (classes,),
    }
    if cls:
        t["cls_token"] = (1, 1, d)
    for i in range(depth):
        b = f"blocks.{i}."
        t.update({b + "norm1.weight": (d,), b + "norm1.bias": (d,), b + "norm2.weight": (d,)})
        t.update({b + "norm2.bias": (d,), b + "attn.qkv.weight": (3 * d, d)})
        t.update({b + "attn.qkv.bias": (3 * d,), b + "attn.proj.weight": (d, d)})
        t.update({b + "attn.proj.bias": (d,), b + "mlp.fc1.weight": (mlp, d)})
        t.update({b + "mlp.fc1.bias": (mlp,), b + "mlp.fc2.weight": (d, mlp)})
        t[b + "mlp.fc2.bias"] = (d,)
    if stem is not None:  # ResNetV2 (preact=False, stem_type='same'): stages of bottlenecks
        units, _ = stem
        pre = "patch_embed.backbone."
        t[pre + "stem.conv.weight"] = (64, 3, 7, 7)
        t[pre + "stem.norm.weight"] = t[pre + "stem.norm.bias"] = (64,)
        cin = 64
        for s, n in enumerate(units):
            mid, out = 64 * 2**s, 256 * 2**s
            for u in range(n):
                b = f"{pre}stages.{s}.blocks.{u}."
                shapes = [(mid, cin, 1, 1), (mid, mid, 3, 3), (out, mid, 1, 1)]
                for r, w in enumerate(shapes, 1):
                    t[f"{b}conv{r}.weight"] = w
                    t[f"{b}norm{r}.weight"] = t[f"{b}norm{r}.bias"] = (w[0],)
                if u == 0:
                    t[b + "downsample.conv.weight"] = (out, cin, 1, 1)
                    t[b + "downsample.norm.weight"] = t[b + "downsample.norm.bias"] = (out,)
                cin = out
    return t


def _shapes(d):
    return {k: tuple(v.shape) for k, v in d.items()}


def test_timm_table_plain_and_hybrid():
    ti = get_model("ViT-Ti_16", 1000)
    assert _shapes(timm.timm_shapes(ti, (224, 224))) == timm_table(192, 12, 768, 16, 197, 1000)
    r50 = get_model("R50+ViT-B_16", 1000)
    want = timm_table(768, 12, 3072, 1, 577, 1000, stem=((3, 4, 9), 1024))
    assert _shapes(timm.timm_shapes(r50, (384, 384))) == want
    gap = get_model("ViT-S_32-gap-norep", 10)
    assert _shapes(timm.timm_shapes(gap, (224, 224))) == timm_table(
        384, 12, 1536, 32, 49, 10, cls=False
    )
    root = get_model("R+ViT-Ti_16", 10)  # root-only stem: backbone is the stem itself
    keys = timm.timm_shapes(root, (224, 224))
    assert "patch_embed.backbone.conv.weight" in keys and "patch_embed.backbone.norm.bias" in keys


# ------------------------------------------------------------------ timm itself

# Every kind of model the converter writes for timm: (case, classes, convert flags).
TIMM_CASES = {
    "tiny_resized": (TINY, 7, ["--image_size=48"]),
    "patch4_1000": (dict(name="testing", overrides=dict(patch_size=4), size=16), 1000, []),
    "gap_odd_mlp_nonsquare": (
        dict(
            name="testing",
            overrides=dict(patch_size=4, classifier="gap", width=48, num_heads=3, mlp_dim=100),
            size=16,
        ),
        5,
        ["--image_size=12,20"],
    ),
    "hybrid": (HYBRID, 7, []),
    "root_only_hybrid": (
        dict(name="testing", overrides=dict(resnet_stages=(), patch_size=2, width=64), size=32),
        3,
        [],
    ),
    "exact_gelu_eps_1e-12": (
        dict(
            name="testing",
            overrides=dict(patch_size=8, gelu="exact", layer_norm_eps=1e-12),
            size=32,
        ),  # fmt: skip
        4,
        ["--image_size=40"],
    ),
}


@pytest.fixture(scope="module")
def timm_installed():
    """timm and what it imports (torch, torchvision) import, as the printed lines need."""
    from helpers import MISSING

    try:
        import timm  # noqa: F401
    except Exception as e:  # noqa: BLE001 (a torchvision built for another torch raises too)
        pytest.skip(f"{MISSING} timm does not import ({type(e).__name__}: {e}); run ./setup.sh")


def _printed_recipe(capsys, *args):
    """`python -m vit_jax.convert ARGS` run in-process; the Python lines it prints."""
    from helpers import run_command

    from vit_jax import convert as command

    capsys.readouterr()
    assert run_command(command, *args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "load it with:\n" in out, out
    return out.split("load it with:\n", 1)[1]


def test_timm_printed_recipe_runs_in_timm_with_our_logits(timm_installed, capsys, tmp_path):
    """The lines the converter prints, executed as printed by real timm, build a model that
    loads the file strictly and computes the NumPy reference's logits (FIDELITY_ATOL), for
    class-token and mean-pooled models, patch 4, odd MLP ratios, non-square images, any
    number of classes, hybrids with stages and with the root alone, and a model of the
    exact GELU and eps 1e-12 (recorded in its .npz, printed as timm's arguments)."""
    from vit_jax.data.images import parse_image_size

    jobs, ours = [], []
    for name, (case, classes, flags) in TIMM_CASES.items():
        model, params, _ = make(case, num_classes=classes, quiet=True)
        src, out = tmp_path / f"{name}.npz", tmp_path / f"{name}.safetensors"
        weights.save_npz(src, params, Meta.of_model(model))
        recipe = _printed_recipe(
            capsys, f"--checkpoint={src}", "--format=timm", f"--out={out}", *flags
        )
        assert "create_model" not in recipe and "load_state_dict(" in recipe
        act = "'gelu_tanh'" if model.gelu == "tanh" else "'gelu'"
        eps = {1e-6: "1e-6", 1e-12: "1e-12"}[model.layer_norm_eps]
        assert f"act_layer={act}" in recipe and f"LayerNorm, eps={eps})" in recipe
        size = [parse_image_size(f[len("--image_size=") :]) for f in flags if "image_size" in f]
        x = images(size[0] if size else case["size"], n=3, seed=len(jobs))
        np.save(tmp_path / f"{name}_x.npy", x)
        jobs.append(dict(recipe=recipe, images=str(tmp_path / f"{name}_x.npy")))
        ours.append(reference_logits(model, params, x))
    for name, theirs, want in zip(TIMM_CASES, run_in_timm(jobs, tmp_path), ours, strict=True):
        assert theirs.shape == want.shape == (3, TIMM_CASES[name][1]), name
        assert np.abs(want).max() > 0.5, name  # not a zero head
        np.testing.assert_allclose(theirs, want, atol=FIDELITY_ATOL, rtol=0, err_msg=name)


@pytest.mark.parametrize(
    "act, overrides",
    [("", {}), ("act_layer='gelu_tanh', ", dict(gelu="tanh"))],
    ids=["timm_defaults", "gelu_tanh_named"],
)
def test_timm_made_file_imports_with_timm_logits(timm_installed, tmp_path, act, overrides):
    """A state dict saved by timm's own VisionTransformer loads here, sizes and heads read
    from the file, with timm's logits (FIDELITY_ATOL): with timm's defaults (the exact
    GELU, eps 1e-6) as they are, a model made with act_layer='gelu_tanh' with gelu='tanh'
    named. Converted to .npz and timm again, each loads later computing the same."""
    path = tmp_path / "from_timm.safetensors"
    made = f"""
import safetensors.torch, torch
from timm.models.vision_transformer import VisionTransformer
torch.manual_seed(0)
model = VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3,
                          mlp_ratio=2.0, num_classes=5, {act}).eval()
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.1 * torch.randn_like(p))
    model.patch_embed.proj.weight.mul_(0.1)  # a quiet residual stream: eps shows
safetensors.torch.save_file(model.state_dict(), {str(path)!r})
"""
    x = images(32, n=3)
    np.save(tmp_path / "x.npy", x)
    (theirs,) = run_in_timm([dict(recipe=made, images=str(tmp_path / "x.npy"))], tmp_path)
    m, p, s = weights.load_model(path, **overrides)
    assert s == (32, 32) and (m.width, m.depth, m.num_heads, m.mlp_dim) == (192, 2, 3, 384)
    assert m.patch_size == 8 and m.num_classes == 5
    assert (m.gelu, m.layer_norm_eps) == (overrides.get("gelu", "exact"), 1e-6)
    assert np.abs(theirs).max() > 0.5
    np.testing.assert_allclose(logits(m, p, x), theirs, atol=FIDELITY_ATOL, rtol=0)
    other = m.clone(gelu="tanh" if m.gelu == "exact" else "exact")
    assert np.abs(logits(other, p, x) - theirs).max() > 10 * FIDELITY_ATOL  # the form shows
    convert.convert(path, "npz", tmp_path / "c.npz", **overrides)
    convert.convert(tmp_path / "c.npz", "timm", tmp_path / "c.safetensors")
    for written in ("c.npz", "c.safetensors"):
        m2, p2, _ = weights.load_model(tmp_path / written)  # nothing named: the file says
        assert (m2.gelu, m2.layer_norm_eps) == (m.gelu, m.layer_norm_eps), written
        np.testing.assert_allclose(logits(m2, p2, x), theirs, atol=FIDELITY_ATOL, rtol=0)


def test_timm_recipe_refuses_what_timm_cannot_compute():
    model = get_model("testing", 3, patch_size=8, posemb="sincos_2d")
    with pytest.raises(CheckpointError, match="'sincos_2d' have no timm.*format='npz'"):
        timm_recipe.recipe(model, (32, 32), "m.safetensors")
    with pytest.raises(CheckpointError, match="pre_logits.*num_classes=K"):
        timm_recipe.recipe(model.clone(posemb="learned", representation_size=8), (32, 32), "m")
    ratio = timm_recipe._mlp_ratio(48, 100)
    assert ratio * 48 >= 100 and int(48 * ratio) == 100


@pytest.mark.parametrize(
    "case, fmt, middle",
    [(TINY, "timm", "b.safetensors"), (HYBRID, "timm", "b.safetensors"), (TINY, "hf", "hf")],
    ids=["timm-tiny", "timm-hybrid", "hf-tiny"],
)
def test_npz_to_format_and_back_is_bit_exact(case, fmt, middle, tmp_path):
    _, params, _ = make(case)
    weights.save_npz(tmp_path / "a.npz", params)
    convert.convert(tmp_path / "a.npz", fmt, tmp_path / middle)
    convert.convert(tmp_path / middle, "npz", tmp_path / "c.npz")
    assert_npz_equal(tmp_path / "c.npz", tmp_path / "a.npz")
    assert_trees_equal(weights.read_checkpoint(tmp_path / middle), params)


# ------------------------------------------------------------------ Hugging Face


@pytest.mark.parametrize(
    "case, numerics",
    [(TINY, {}), (TI16, {}), (TINY, dict(gelu="exact", layer_norm_eps=1e-12))],
    ids=["tiny", "Ti16", "tiny_exact_1e-12"],
)
def test_hf_export_loads_in_transformers_with_same_logits(case, numerics, tmp_path):
    """transformers computes the NumPy reference's logits (FIDELITY_ATOL) of the exported
    model at its native and another resolution: config.json says its GELU form and eps."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    case = {**case, "overrides": {**case["overrides"], **numerics}}
    model, params, size = make(case, quiet=True)
    src = tmp_path / "src.npz"
    weights.save_npz(src, params, Meta.of_model(model))
    act = {"tanh": "gelu_pytorch_tanh", "exact": "gelu"}[model.gelu]
    for res in (size, size + 2 * model.patch_size):
        out = tmp_path / f"hf{res}"
        convert.convert(src, "hf", out, image_size=res)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["hidden_act"] == act and cfg["layer_norm_eps"] == model.layer_norm_eps
        hf_model, info = transformers.ViTForImageClassification.from_pretrained(
            out, output_loading_info=True
        )
        assert not any(info.values()), info  # no missing, unexpected, mismatched keys
        x = images(res)
        with torch.no_grad():
            theirs = hf_model.eval()(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).logits
        want = reference_logits(model, params, x)
        assert np.abs(want).max() > 0.5
        np.testing.assert_allclose(theirs.numpy(), want, atol=FIDELITY_ATOL, rtol=0)
    assert_trees_equal(weights.read_checkpoint(tmp_path / f"hf{size}"), params)


def _png(path, h, w, seed=0, channels=3):
    """A real image file: random RGB (or RGBA: random transparency) pixels, not the
    model's size."""
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, channels), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return str(path)


@pytest.mark.parametrize("classes, labelled", [(7, True), (1000, False)], ids=["labels", "in1k"])
def test_hf_pipeline_classifies_files_as_infer_does(classes, labelled, capsys, tmp_path):
    """transformers.pipeline('image-classification', model=DIR) on an image file: the
    preprocessor config resizes and scales as vit_jax.infer, so top labels and
    probabilities are this package's; class names come from --labels or ImageNet's."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from vit_jax.data import images as vit_images
    from vit_jax.models import predict

    model, params, _ = make(dict(name="testing", overrides=dict(patch_size=8), size=48), classes)
    src, out = tmp_path / "a.npz", tmp_path / "hf"
    weights.save_npz(src, params)
    flags = [f"--checkpoint={src}", "--format=hf", f"--out={out}"]
    names = vit_images.imagenet_class_names()
    if labelled:
        names = [f"kind {chr(65 + i)}" for i in range(classes)]
        (tmp_path / "labels.txt").write_text("\n".join(names) + "\n")
        flags.append(f"--labels={tmp_path / 'labels.txt'}")
    printed = _printed_recipe(capsys, *flags)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["id2label"] == {str(i): n for i, n in enumerate(names)}
    assert cfg["label2id"] == {n: i for i, n in enumerate(names)}
    exec(printed, scope := {})  # the printed lines, as a user pastes them
    # An RGB photo, and a PNG with transparency: one rule for alpha in both (dropped).
    for image in (_png(tmp_path / "photo.png", 37, 61), _png(tmp_path / "a.png", 30, 41, 1, 4)):
        got = scope["classify"](image, top_k=5)
        x = vit_images.load_images([image], (48, 48), "pil_antialias")  # what HF computes
        probs = predict.predict(model, params, x)[0]
        top = np.argsort(-probs)[:5]
        assert [g["label"] for g in got] == [names[i] for i in top]
        np.testing.assert_allclose([g["score"] for g in got], probs[top], atol=1e-5)
    assert isinstance(scope["model"], transformers.ViTForImageClassification)


def test_labels_that_do_not_fit_are_named(capsys, tmp_path):
    from helpers import run_command

    from vit_jax import convert as command

    _, params, _ = make(TINY)
    weights.save_npz(tmp_path / "a.npz", params)
    (tmp_path / "three.txt").write_text("a\nb\nc\n")
    (tmp_path / "twice.txt").write_text("a\nb\nc\nd\ne\nf\na\n")
    cases = [
        ("hf", "three.txt", r"labels file .*three\.txt has 3 lines but the model has 7 classes"),
        ("hf", "twice.txt", r"class names must differ.*repeated: 'a'"),
        ("hf", "none.txt", r"labels file not found: .*none\.txt"),
        ("timm", "twice.txt", r"class names must differ.*repeated: 'a'"),
        ("npz", "three.txt", r"labels file .*three\.txt has 3 lines but the model has 7 classes"),
    ]
    for fmt, labels, message in cases:
        capsys.readouterr()
        code = run_command(
            command,
            f"--checkpoint={tmp_path / 'a.npz'}",
            f"--format={fmt}",
            f"--out={tmp_path / 'out'}",
            f"--labels={tmp_path / labels}",
        )
        err = capsys.readouterr().err
        assert code == 1 and err.startswith("error: ") and re.search(message, err), err
        assert not list(tmp_path.glob("out*"))


def _hf_model(tmp_path, hidden_act, eps=1e-12, name="hf"):
    """A transformers ViTForImageClassification with random weights saved at tmp_path/name;
    its logits on images(32)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        hidden_act=hidden_act,
        layer_norm_eps=eps,
        num_labels=5,
    )
    torch.manual_seed(0)
    src = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for key, p in src.named_parameters():
            p.add_(0.2 * torch.randn_like(p))
            if re.search(r"embeddings|cls_token|output\.dense", key):  # as quiet_params:
                p.mul_(0.1)  # a quiet residual stream, where the LayerNorm epsilon shows
        src.save_pretrained(tmp_path / name)
        x = torch.from_numpy(images(32)).permute(0, 3, 1, 2)
        return src(pixel_values=x).logits.numpy()


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh"])
def test_hf_import_matches_transformers(hidden_act, tmp_path):
    """transformers' ViT with its default eps 1e-12 and the exact or tanh GELU: imported
    as config.json says, the logits are transformers' (FIDELITY_ATOL), and the .npz it
    converts to loads later computing the same function."""
    theirs = _hf_model(tmp_path, hidden_act)
    model, params, size = weights.load_model(tmp_path / "hf")
    assert size == (32, 32) and model.num_heads == 3 and model.num_classes == 5
    gelu = "exact" if hidden_act == "gelu" else "tanh"
    assert (model.gelu, model.layer_norm_eps) == (gelu, 1e-12)
    x = images(32)
    assert np.abs(theirs).max() > 0.5
    np.testing.assert_allclose(logits(model, params, x), theirs, atol=FIDELITY_ATOL, rtol=0)
    for name, wrong in (("eps 1e-6", dict(layer_norm_eps=1e-6)), ("tanh", dict(gelu="tanh"))):
        if model.clone(**wrong) != model:
            error = np.abs(logits(model.clone(**wrong), params, x) - theirs).max()
            assert error > 10 * FIDELITY_ATOL, (name, error)
    convert.convert(tmp_path / "hf", "npz", tmp_path / "m.npz")
    again, p, _ = weights.load_model(tmp_path / "m.npz")
    assert (again.gelu, again.layer_norm_eps) == (gelu, 1e-12)
    np.testing.assert_allclose(logits(again, p, x), theirs, atol=FIDELITY_ATOL, rtol=0)


def test_original_weights_that_say_gelu_load_as_the_original_with_one_flag(capsys, tmp_path):
    """Files converted by others from the original JAX weights (google/vit-* on the hub)
    say hidden_act 'gelu' and eps 1e-12: read as they say, the logits are off the
    original's; --numerics=original computes the original function (the NumPy reference
    of the published numerics), and the .npz written is the published layout alone."""
    from helpers import run_command

    from vit_jax import convert as command

    model, params, _ = make(TINY, quiet=True)
    weights.save_npz(tmp_path / "orig.npz", params)
    convert.convert(tmp_path / "orig.npz", "hf", tmp_path / "hub")
    cfg = json.loads((tmp_path / "hub" / "config.json").read_text())
    cfg.update(hidden_act="gelu", layer_norm_eps=1e-12)  # as google/vit-base-patch16-224
    (tmp_path / "hub" / "config.json").write_text(json.dumps(cfg))
    x = images(32)
    want = reference_logits(model, params, x)
    m, p, _ = weights.load_model(tmp_path / "hub")
    assert (m.gelu, m.layer_norm_eps) == ("exact", 1e-12)
    assert np.abs(logits(m, p, x) - want).max() > 10 * FIDELITY_ATOL
    out = tmp_path / "back.npz"
    flags = [f"--checkpoint={tmp_path / 'hub'}", "--format=npz", f"--out={out}"]
    assert run_command(command, *flags, "--numerics=original") == 0, capsys.readouterr().err
    assert_npz_equal(out, tmp_path / "orig.npz")  # no numerics entry: the original's
    m, p, _ = weights.load_model(out)
    assert (m.gelu, m.layer_norm_eps) == ("tanh", 1e-6)
    np.testing.assert_allclose(logits(m, p, x), want, atol=FIDELITY_ATOL, rtol=0)


# ------------------------------------------------------------------ bad input


@pytest.fixture
def timm_file(tmp_path):
    model, params, _ = make(TINY)
    weights.save_npz(tmp_path / "a.npz", params)
    convert.convert(tmp_path / "a.npz", "timm", tmp_path / "good.safetensors")
    return safetensors_io.read(tmp_path / "good.safetensors")[0]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda sd: sd.pop("blocks.1.mlp.fc2.bias"), r"blocks\.1\.mlp\.fc2\.bias is missing"),
        (lambda sd: sd.update(extra=np.zeros(3, np.float32)), r"tensor extra \(3,\) is not"),
        (
            lambda sd: sd.update({"blocks.0.attn.proj.bias": np.zeros(5, np.float32)}),
            r"blocks\.0\.attn\.proj\.bias has shape \(5,\), expected \(32,\)",
        ),
        (
            lambda sd: sd.update({"blocks.0.norm1.weight": np.zeros(7, np.float32)}),
            r"blocks\.0\.norm1\.weight has shape \(7,\)",
        ),
    ],
    ids=["missing", "extra", "misshaped", "misshaped_norm"],
)
def test_bad_timm_files_are_named_and_leave_nothing(timm_file, tmp_path, edit, message):
    edit(timm_file)
    bad = tmp_path / "bad.safetensors"
    safetensors_io.write(bad, timm_file)
    out = tmp_path / "out.npz"
    with pytest.raises(CheckpointError, match=message):
        convert.convert(bad, "npz", out)
    assert not out.exists() and not list(tmp_path.glob("out*"))


def test_other_inputs_are_named(tmp_path):
    (tmp_path / "swin").mkdir()
    (tmp_path / "swin" / "config.json").write_text(json.dumps({"model_type": "swin"}))
    with pytest.raises(CheckpointError, match="'swin' model; the model types read are vit, dinov2"):
        weights.read_checkpoint(tmp_path / "swin")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="expected a published .npz, a timm .safetensors"):
        weights.read_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(FileNotFoundError):
        weights.read_checkpoint(tmp_path / "nothing.npz")
    model, params, _ = make(TINY)
    weights.save_npz(tmp_path / "a.npz", params)
    convert.convert(tmp_path / "a.npz", "timm", tmp_path / "t.safetensors")
    data = (tmp_path / "t.safetensors").read_bytes()
    (tmp_path / "t.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        convert.convert(tmp_path / "t.safetensors", "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CheckpointError, match="hybrid"):
        convert.convert(_hybrid_npz(tmp_path), "hf", tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == []


def _hybrid_npz(tmp_path):
    model, params, _ = make(HYBRID)
    weights.save_npz(tmp_path / "h.npz", params)
    return tmp_path / "h.npz"


def test_convert_command(tmp_path):
    model, params, _ = make(TINY)
    weights.save_npz(tmp_path / "a.npz", params)
    out = tmp_path / "exports" / "tiny" / "m.safetensors"  # --out's directories are made
    run = python_m(
        "vit_jax.convert",
        f"--checkpoint={tmp_path / 'a.npz'}",
        "--format=timm",
        f"--out={out}",
        "--num_classes=3",
    )
    assert run.returncode == 0, run.stderr
    assert "model = VisionTransformer(" in run.stdout and "strict" in run.stdout
    assert "num_classes=3" in run.stdout and "act_layer='gelu_tanh'" in run.stdout
    assert safetensors_io.read(out)[0]["head.weight"].shape == (3, 32)
    bad = python_m(
        "vit_jax.convert",
        f"--checkpoint={tmp_path / 'nope.npz'}",
        "--format=hf",
        f"--out={tmp_path / 'o'}",
    )
    assert bad.returncode == 1 and bad.stderr.startswith("error: checkpoint")


def test_hf_config_for_other_layouts():
    cfg = hf.config(get_model("ViT-B_16", 10), (384, 384))
    want = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, image_size=384, patch_size=16, num_channels=3,
                hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)  # fmt: skip
    assert {k: cfg[k] for k in want} == want
    assert cfg["id2label"] == {str(i): f"LABEL_{i}" for i in range(10)}
    exact = hf.config(get_model("ViT-B_16", 10, gelu="exact", layer_norm_eps=1e-12), (224, 224))
    assert (exact["hidden_act"], exact["layer_norm_eps"]) == ("gelu", 1e-12)
    with pytest.raises(ValueError, match="square"):
        hf.config(get_model("ViT-B_16", 10), (384, 512))


def test_unknown_numerics_in_a_file_are_named(tmp_path):
    from vit_jax.weights import meta

    with pytest.raises(CheckpointError, match="hidden_act 'relu'.*'gelu' \\(exact\\)"):
        Meta.from_hf({"hidden_act": "relu"}, "x/config.json")
    assert Meta.from_hf({}, "c").numerics == {"gelu": "exact", "layer_norm_eps": 1e-12}
    assert Meta.from_timm({"format": "pt"}, "t").numerics == meta.TIMM_DEFAULT
    older = Meta.from_timm({"format": "pt", "num_heads": "3"}, "t")
    assert older.numerics == {"gelu": "tanh", "layer_norm_eps": 1e-6}  # written here before
    bad = {"vit_jax_numerics": np.array('{"gelu": "sigmoid"}')}
    with pytest.raises(CheckpointError, match="m.npz .vit_jax_.*. names GELU 'sigmoid'"):
        Meta.from_npz(bad, "m.npz")
