"""safetensors, timm and Hugging Face formats: layouts, fidelity, round trips, bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest
from format_helpers import HYBRID, TI16, TINY, assert_bit_exact, make
from helpers import flat, images, logits

from vit_jax import checkpoint, formats
from vit_jax.architecture import CheckpointError
from vit_jax.formats import convert, hf, safetensors_io, timm
from vit_jax.models import get_model

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
    assert timm.create_model_args(r50, (384, 384)) == (
        "vit_base_r50_s16_384",
        {"num_classes": 1000, "act_layer": "gelu_tanh"},
    )
    assert timm.create_model_args(ti, (256, 256)) == (
        "vit_tiny_patch16_224",
        {"img_size": 256, "num_classes": 1000, "act_layer": "gelu_tanh"},
    )
    root = get_model("R+ViT-Ti_16", 10)  # root-only stem: backbone is the stem itself
    keys = timm.timm_shapes(root, (224, 224))
    assert "patch_embed.backbone.conv.weight" in keys and "patch_embed.backbone.norm.bias" in keys


# ------------------------------------------------------------------ timm's semantics


def timm_forward(sd, x_nhwc, heads):
    """timm VisionTransformer.forward on its state dict, in torch (plain ViTs), with
    act_layer='gelu_tanh' and LayerNorm eps 1e-6 as create_model_args names."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    t = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in sd.items()}
    x = torch.from_numpy(x_nhwc).permute(0, 3, 1, 2)
    w = t["patch_embed.proj.weight"]
    x = F.conv2d(x, w, t["patch_embed.proj.bias"], stride=w.shape[-1]).flatten(2).transpose(1, 2)
    x = torch.cat([t["cls_token"].expand(x.shape[0], -1, -1), x], 1) + t["pos_embed"]
    b, n, d = x.shape
    ln = lambda x, p: F.layer_norm(x, (d,), t[p + ".weight"], t[p + ".bias"], 1e-6)
    lin = lambda x, p: F.linear(x, t[p + ".weight"], t[p + ".bias"])
    i = 0
    while f"blocks.{i}.norm1.weight" in t:
        p = f"blocks.{i}."
        qkv = lin(ln(x, p + "norm1"), p + "attn.qkv").reshape(b, n, 3, heads, d // heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) * (d // heads) ** -0.5, -1) @ v
        x = x + lin(a.transpose(1, 2).reshape(b, n, d), p + "attn.proj")
        h = F.gelu(lin(ln(x, p + "norm2"), p + "mlp.fc1"), approximate="tanh")
        x = x + lin(h, p + "mlp.fc2")
        i += 1
    return lin(ln(x, "norm")[:, 0], "head").numpy()


@pytest.mark.parametrize("case", [TINY, TI16], ids=["tiny", "Ti16"])
def test_timm_export_runs_in_torch_and_imports_back(case, tmp_path):
    model, params, size = make(case)
    src = tmp_path / "src.npz"
    checkpoint.save_npz(src, params)
    for res in (size, size + 2 * model.patch_size):  # native, then a resolution change
        out = tmp_path / f"m{res}.safetensors"
        done = convert.convert(src, "timm", out, image_size=res)
        sd, meta = safetensors_io.read(out)
        assert _shapes(sd) == _shapes(timm.timm_shapes(done.model, (res, res)))
        ours = logits(done.model, convert.load(src, image_size=res)[1], images(res))
        np.testing.assert_allclose(timm_forward(sd, images(res), model.num_heads), ours, atol=1e-4)
    # import: a timm file (written by torch's reference writer when present) -> same logits
    sd = {
        k: np.random.default_rng(3).normal(0, 0.2, v.shape).astype(np.float32)
        for k, v in timm.timm_shapes(model, (size, size)).items()
    }
    path = tmp_path / "timm.safetensors"
    st = pytest.importorskip("safetensors.numpy")
    st.save_file(sd, str(path))
    m, p, s = checkpoint.load_model(path)
    assert s == (size, size) and m.num_heads == model.num_heads
    np.testing.assert_allclose(
        logits(m, p, images(size)), timm_forward(sd, images(size), m.num_heads), atol=1e-4
    )


@pytest.mark.parametrize(
    "case, fmt, middle",
    [(TINY, "timm", "b.safetensors"), (HYBRID, "timm", "b.safetensors"), (TINY, "hf", "hf")],
    ids=["timm-tiny", "timm-hybrid", "hf-tiny"],
)
def test_npz_to_format_and_back_is_bit_exact(case, fmt, middle, tmp_path):
    _, params, _ = make(case)
    checkpoint.save_npz(tmp_path / "a.npz", params)
    convert.convert(tmp_path / "a.npz", fmt, tmp_path / middle)
    convert.convert(tmp_path / middle, "npz", tmp_path / "c.npz")
    a, c = np.load(tmp_path / "a.npz"), np.load(tmp_path / "c.npz")
    assert sorted(a.files) == sorted(c.files)
    for k in a.files:
        np.testing.assert_array_equal(a[k], c[k], err_msg=k)
        assert a[k].dtype == c[k].dtype
    assert_bit_exact(params, formats.read_checkpoint(tmp_path / middle))


# ------------------------------------------------------------------ Hugging Face


@pytest.mark.parametrize("case", [TINY, TI16], ids=["tiny", "Ti16"])
def test_hf_export_loads_in_transformers_with_same_logits(case, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, params, size = make(case)
    src = tmp_path / "src.npz"
    checkpoint.save_npz(src, params)
    for res in (size, size + 2 * model.patch_size):
        out = tmp_path / f"hf{res}"
        done = convert.convert(src, "hf", out, image_size=res)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["hidden_act"] == "gelu_pytorch_tanh" and cfg["layer_norm_eps"] == 1e-6
        hf_model, info = transformers.ViTForImageClassification.from_pretrained(
            out, output_loading_info=True
        )
        assert not any(info.values()), info  # no missing, unexpected, mismatched keys
        x = images(res)
        with torch.no_grad():
            theirs = hf_model.eval()(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).logits
        ours = logits(done.model, convert.load(src, image_size=res)[1], x)
        np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-4)
    assert_bit_exact(params, formats.read_checkpoint(tmp_path / f"hf{size}"))


def test_hf_import_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        num_labels=5,
    )
    torch.manual_seed(0)
    src = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(0.2 * torch.randn_like(p))
    src.save_pretrained(tmp_path / "hf")
    model, params, size = checkpoint.load_model(tmp_path / "hf")
    assert size == (32, 32) and model.num_heads == 3 and model.num_classes == 5
    x = images(32)
    with torch.no_grad():
        theirs = src(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).logits.numpy()
    np.testing.assert_allclose(logits(model, params, x), theirs, atol=1e-4)


# ------------------------------------------------------------------ bad input


@pytest.fixture
def timm_file(tmp_path):
    model, params, _ = make(TINY)
    checkpoint.save_npz(tmp_path / "a.npz", params)
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
    with pytest.raises(CheckpointError, match="'swin'.*only model_type 'vit'"):
        formats.read_checkpoint(tmp_path / "swin")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="expected a published .npz, a timm .safetensors"):
        formats.read_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(FileNotFoundError):
        formats.read_checkpoint(tmp_path / "nothing.npz")
    model, params, _ = make(TINY)
    checkpoint.save_npz(tmp_path / "a.npz", params)
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
    checkpoint.save_npz(tmp_path / "h.npz", params)
    return tmp_path / "h.npz"


def test_convert_command(tmp_path):
    model, params, _ = make(TINY)
    checkpoint.save_npz(tmp_path / "a.npz", params)
    out = tmp_path / "m.safetensors"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "vit_jax.convert",
            f"--checkpoint={tmp_path / 'a.npz'}",
            "--format=timm",
            f"--out={out}",
            "--num_classes=3",
        ],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": "."},
    )
    assert run.returncode == 0, run.stderr
    assert "timm.create_model('vit_base_patch8_224'" in run.stdout
    assert "num_classes=3" in run.stdout and "act_layer='gelu_tanh'" in run.stdout
    assert safetensors_io.read(out)[0]["head.weight"].shape == (3, 32)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "vit_jax.convert",
            f"--checkpoint={tmp_path / 'nope.npz'}",
            "--format=hf",
            f"--out={tmp_path / 'o'}",
        ],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": "."},
    )
    assert bad.returncode == 1 and bad.stderr.startswith("error: checkpoint")


def test_hf_config_for_other_layouts():
    assert hf.config(get_model("ViT-B_16", 10), (384, 384))["image_size"] == 384
    with pytest.raises(ValueError, match="square"):
        hf.config(get_model("ViT-B_16", 10), (384, 512))
    assert flat  # helpers are shared with the other format tests
