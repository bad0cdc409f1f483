"""Self-checks of the NumPy reference (tests/numpy_reference.py); no vit_jax needed."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest
import scipy.signal


def _load_reference():
    path = pathlib.Path(__file__).with_name("numpy_reference.py")
    spec = importlib.util.spec_from_file_location("_vit_numpy_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _load_reference()


# ----------------------------------------------------------------------------
# Naive loop implementations to check the vectorised primitives against.
# ----------------------------------------------------------------------------


def _out_and_pad(size, k, stride, padding):
    if padding == "VALID":
        return (size - k) // stride + 1, 0
    out = math.ceil(size / stride)
    return out, max((out - 1) * stride + k - size, 0) // 2


def _naive_conv(x, w, stride, padding):
    n, h, wd, _ = x.shape
    kh, kw, _, cout = w.shape
    oh, ph = _out_and_pad(h, kh, stride, padding)
    ow, pw = _out_and_pad(wd, kw, stride, padding)
    out = np.zeros((n, oh, ow, cout))
    for i in range(oh):
        for j in range(ow):
            for di in range(kh):
                for dj in range(kw):
                    r, c = i * stride + di - ph, j * stride + dj - pw
                    if 0 <= r < h and 0 <= c < wd:
                        out[:, i, j] += x[:, r, c] @ w[di, dj]
    return out


def _naive_max_pool(x, k, stride):
    n, h, wd, c = x.shape
    oh, ph = _out_and_pad(h, k, stride, "SAME")
    ow, pw = _out_and_pad(wd, k, stride, "SAME")
    out = np.full((n, oh, ow, c), -np.inf)
    for i in range(oh):
        for j in range(ow):
            for di in range(k):
                for dj in range(k):
                    r, cc = i * stride + di - ph, j * stride + dj - pw
                    if 0 <= r < h and 0 <= cc < wd:
                        out[:, i, j] = np.maximum(out[:, i, j], x[:, r, cc])
    return out


def _plain_ln(x, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


# ----------------------------------------------------------------------------
# Primitives.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "h,w,k,stride,padding",
    [
        (7, 6, 3, 2, "SAME"),
        (8, 8, 3, 2, "SAME"),
        (9, 10, 7, 2, "SAME"),
        (5, 5, 2, 1, "SAME"),  # even kernel: pad before < pad after
        (8, 7, 1, 2, "SAME"),
        (8, 8, 4, 4, "VALID"),
        (9, 7, 3, 3, "VALID"),
    ],
)
def test_conv_matches_naive_loop(h, w, k, stride, padding):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, h, w, 3))
    kern = rng.normal(size=(k, k, 3, 4))
    got = ref._conv2d(x, kern, stride, padding)
    want = _naive_conv(x, kern, stride, padding)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_conv_same_against_scipy_correlate():
    """TF 'SAME' for odd k: stride 1 = centred correlation; stride 2 picks its
    even rows for odd sizes (pads 1/1) and odd rows for even sizes (pads 0/1)."""
    rng = np.random.default_rng(1)
    kern = rng.normal(size=(3, 3))
    for size, start in [(7, 0), (8, 1)]:
        img = rng.normal(size=(size, size))
        full = scipy.signal.correlate(img, kern, mode="same")
        x, w = img[None, :, :, None], kern[:, :, None, None]
        np.testing.assert_allclose(ref._conv2d(x, w, 1, "SAME")[0, :, :, 0], full, atol=1e-12)
        np.testing.assert_allclose(
            ref._conv2d(x, w, 2, "SAME")[0, :, :, 0], full[start::2, start::2], atol=1e-12
        )


@pytest.mark.parametrize("size", [7, 8])
def test_max_pool_same_pads_with_minus_inf(size):
    rng = np.random.default_rng(2)
    x = -np.abs(rng.normal(size=(2, size, size, 3))) - 1.0  # all negative
    got = ref._max_pool(x, 3, 2)
    np.testing.assert_array_equal(got, _naive_max_pool(x, 3, 2))
    assert got.shape == (2, math.ceil(size / 2), math.ceil(size / 2), 3)
    assert np.all(got < 0)  # zero padding would have leaked 0s into the border


def test_standardize_weight():
    rng = np.random.default_rng(3)
    w = rng.normal(loc=0.7, scale=3.0, size=(3, 3, 5, 6))
    ws = ref._standardize_weight(w)
    s = (w - w.mean(axis=(0, 1, 2))).std(axis=(0, 1, 2))  # population std per cout
    np.testing.assert_allclose(ws.mean(axis=(0, 1, 2)), 0.0, atol=1e-12)
    np.testing.assert_allclose(ws.std(axis=(0, 1, 2)), s / (s + 1e-5), rtol=1e-12)
    # eps is outside the sqrt: the exact value of one entry.
    wc = w[..., 0] - w[..., 0].mean()
    assert ws[1, 2, 3, 0] == pytest.approx(wc[1, 2, 3] / (np.sqrt((wc**2).mean()) + 1e-5), 1e-12)


def test_group_norm_statistics_and_affine():
    rng = np.random.default_rng(4)
    x = rng.normal(loc=2.0, scale=5.0, size=(2, 4, 5, 64))
    y = ref._group_norm(x, np.ones(64), np.zeros(64))
    g = y.reshape(2, 4, 5, 32, 2)
    np.testing.assert_allclose(g.mean(axis=(1, 2, 4)), 0.0, atol=1e-12)
    var_x = x.reshape(2, 4, 5, 32, 2).var(axis=(1, 2, 4))
    np.testing.assert_allclose(g.var(axis=(1, 2, 4)), var_x / (var_x + 1e-6), rtol=1e-12)
    scale, bias = rng.normal(size=64), rng.normal(size=64)
    np.testing.assert_allclose(ref._group_norm(x, scale, bias), y * scale + bias, atol=1e-12)
    # (1, 1, 1, C) storage is accepted too.
    np.testing.assert_allclose(
        ref._group_norm(x, scale.reshape(1, 1, 1, 64), bias.reshape(1, 1, 1, 64)),
        y * scale + bias,
        atol=1e-12,
    )


def test_layer_norm_gelu_softmax():
    rng = np.random.default_rng(5)
    x = rng.normal(loc=1.0, scale=3.0, size=(3, 7, 16))
    y = ref._layer_norm(x, np.ones(16), np.zeros(16))
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), x.var(-1) / (x.var(-1) + 1e-6), rtol=1e-12)
    # tanh approximation (exact erf GELU(1) = 0.841344746...).
    assert ref._gelu(np.array(1.0)) == pytest.approx(0.8411919906082768, abs=1e-12)
    assert ref._gelu(np.array(0.0)) == 0.0
    assert ref._gelu(np.array(-20.0)) == pytest.approx(0.0, abs=1e-12)
    p = ref._softmax(rng.normal(scale=30.0, size=(4, 9)))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)
    assert np.all(p >= 0)
    np.testing.assert_allclose(ref._softmax(np.log([[1.0, 3.0]])), [[0.25, 0.75]], atol=1e-12)


# ----------------------------------------------------------------------------
# Position-embedding resize.
# ----------------------------------------------------------------------------


def test_resize_posemb_identity_and_class_row():
    rng = np.random.default_rng(6)
    pe = rng.normal(size=(1, 1 + 16, 8))
    np.testing.assert_allclose(ref.resize_posemb(pe, (4, 4)), pe, atol=1e-12)
    out = ref.resize_posemb(pe, (6, 3))
    assert out.shape == (1, 1 + 18, 8)
    np.testing.assert_array_equal(out[:, 0], pe[:, 0])
    pe_gap = pe[:, 1:]
    np.testing.assert_allclose(ref.resize_posemb(pe_gap, (4, 4), False), pe_gap, atol=1e-12)
    np.testing.assert_allclose(ref.resize_posemb(pe_gap, (6, 3), False), out[:, 1:], atol=1e-12)


def test_resize_posemb_is_bilinear():
    """order=1 zoom maps corner to corner: a ramp a*r + b*c stays a ramp."""
    gs, d = 3, 2
    r, c = np.meshgrid(np.arange(gs), np.arange(gs), indexing="ij")
    grid = np.stack([2.0 * r + 0.5 * c, -r + 3.0], axis=-1)  # [gs, gs, d]
    pe = np.concatenate([np.full((1, 1, d), 9.0), grid.reshape(1, gs * gs, d)], axis=1)
    out = ref.resize_posemb(pe, (5, 4))[0, 1:].reshape(5, 4, d)
    rr, cc = np.meshgrid(np.arange(5) * 2 / 4, np.arange(4) * 2 / 3, indexing="ij")
    np.testing.assert_allclose(out[..., 0], 2.0 * rr + 0.5 * cc, atol=1e-12)
    np.testing.assert_allclose(out[..., 1], -rr + 3.0, atol=1e-12)


# ----------------------------------------------------------------------------
# Transformer.
# ----------------------------------------------------------------------------


def _vit_params(
    rng,
    *,
    d=8,
    heads=2,
    mlp=16,
    layers=2,
    classes=5,
    patch=2,
    chans=1,
    tokens=4,
    classifier="token",
    representation=None,
    scale=0.5,
):
    dh = d // heads
    n = rng.normal
    p = {
        "embedding/kernel": n(scale=scale, size=(patch, patch, chans, d)),
        "embedding/bias": n(scale=scale, size=(d,)),
        "Transformer/posembed_input/pos_embedding": n(
            scale=scale, size=(1, tokens + (classifier == "token"), d)
        ),
        "Transformer/encoder_norm/scale": 1 + n(scale=0.1, size=(d,)),
        "Transformer/encoder_norm/bias": n(scale=0.1, size=(d,)),
        "head/kernel": n(scale=scale, size=(representation or d, classes)),
        "head/bias": n(scale=scale, size=(classes,)),
    }
    if classifier == "token":
        p["cls"] = n(scale=scale, size=(1, 1, d))
    if representation:
        p["pre_logits/kernel"] = n(scale=scale, size=(d, representation))
        p["pre_logits/bias"] = n(scale=scale, size=(representation,))
    for i in range(layers):
        b = f"Transformer/encoderblock_{i}/"
        a = b + "MultiHeadDotProductAttention_1/"
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            p[b + ln + "/scale"] = 1 + n(scale=0.1, size=(d,))
            p[b + ln + "/bias"] = n(scale=0.1, size=(d,))
        for name in ("query", "key", "value"):
            p[a + name + "/kernel"] = n(scale=scale, size=(d, heads, dh))
            p[a + name + "/bias"] = n(scale=scale, size=(heads, dh))
        p[a + "out/kernel"] = n(scale=scale, size=(heads, dh, d))
        p[a + "out/bias"] = n(scale=scale, size=(d,))
        p[b + "MlpBlock_3/Dense_0/kernel"] = n(scale=scale, size=(d, mlp))
        p[b + "MlpBlock_3/Dense_0/bias"] = n(scale=scale, size=(mlp,))
        p[b + "MlpBlock_3/Dense_1/kernel"] = n(scale=scale, size=(mlp, d))
        p[b + "MlpBlock_3/Dense_1/bias"] = n(scale=scale, size=(d,))
    return p


def _image_4x4():
    """2 images 4x4x1 -> 4 patches of 2x2; with an identity embedding the token
    of patch (gr, gc) is img[2gr:2gr+2, 2gc:2gc+2].ravel()."""
    rng = np.random.default_rng(7)
    img = rng.uniform(-1, 1, size=(2, 4, 4, 1))
    tokens = np.stack(
        [
            img[:, 2 * gr : 2 * gr + 2, 2 * gc : 2 * gc + 2, 0].reshape(2, 4)
            for gr in range(2)
            for gc in range(2)
        ],
        axis=1,
    )  # [2, 4, 4]
    return img, tokens


def _set_identity_embedding(p):
    p["embedding/kernel"] = np.eye(4).reshape(2, 2, 1, 4)
    p["embedding/bias"] = np.zeros(4)


@pytest.mark.parametrize("classifier", ["token", "gap"])
@pytest.mark.parametrize("representation", [None, 3])
def test_zero_blocks_are_identity(classifier, representation):
    """All block weights zero: the encoder reduces to encoder_norm(embed + pos)."""
    rng = np.random.default_rng(8)
    p = _vit_params(rng, d=4, heads=2, classifier=classifier, representation=representation)
    _set_identity_embedding(p)
    for k in p:
        if k.startswith("Transformer/encoderblock_"):
            p[k] = np.zeros_like(p[k])
    img, tokens = _image_4x4()
    x = tokens
    if classifier == "token":
        x = np.concatenate([np.broadcast_to(p["cls"], (2, 1, 4)), x], axis=1)
    x = x + p["Transformer/posembed_input/pos_embedding"]
    x = _plain_ln(x) * p["Transformer/encoder_norm/scale"] + p["Transformer/encoder_norm/bias"]
    x = x[:, 0] if classifier == "token" else x.mean(1)
    if representation:
        x = np.tanh(x @ p["pre_logits/kernel"] + p["pre_logits/bias"])
    want = x @ p["head/kernel"] + p["head/bias"]
    got = ref.vit_logits(p, img, num_heads=2, patch_size=2, classifier=classifier)
    assert got.shape == (2, 5) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_bias_only_blocks_add_constants():
    """Zero kernels but biases: attention returns sum_h bv_h @ Wo_h + bo whatever
    the weights (rows sum to 1); MLP returns its Dense_1 bias."""
    rng = np.random.default_rng(9)
    p = _vit_params(rng, d=4, heads=2, layers=3)
    _set_identity_embedding(p)
    shift = np.zeros(4)
    for i in range(3):
        a = f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/"
        p[a + "value/kernel"] = np.zeros((4, 2, 2))
        p[f"Transformer/encoderblock_{i}/MlpBlock_3/Dense_0/kernel"] = np.zeros((4, 16))
        p[f"Transformer/encoderblock_{i}/MlpBlock_3/Dense_1/kernel"] = np.zeros((16, 4))
        shift += (
            p[a + "value/bias"].reshape(4) @ p[a + "out/kernel"].reshape(4, 4)
            + p[a + "out/bias"]
            + p[f"Transformer/encoderblock_{i}/MlpBlock_3/Dense_1/bias"]
        )
    img, tokens = _image_4x4()
    x = np.concatenate([np.broadcast_to(p["cls"], (2, 1, 4)), tokens], axis=1)
    x = x + p["Transformer/posembed_input/pos_embedding"] + shift
    x = _plain_ln(x) * p["Transformer/encoder_norm/scale"] + p["Transformer/encoder_norm/bias"]
    want = x[:, 0] @ p["head/kernel"] + p["head/bias"]
    got = ref.vit_logits(p, img, num_heads=2, patch_size=2)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_uniform_attention_averages_values():
    """Key kernel/bias zero -> uniform attention -> each token gets mean(v)."""
    rng = np.random.default_rng(10)
    d, heads = 8, 2
    p = _vit_params(rng, d=d, heads=heads, layers=1)
    b = "Transformer/encoderblock_0/"
    a = b + "MultiHeadDotProductAttention_1/"
    p[a + "key/kernel"] = np.zeros((d, heads, d // heads))
    p[a + "key/bias"] = np.zeros((heads, d // heads))
    p[b + "MlpBlock_3/Dense_1/kernel"] = np.zeros((16, d))
    x = rng.normal(size=(2, 5, d))
    y = _plain_ln(x) * p[b + "LayerNorm_0/scale"] + p[b + "LayerNorm_0/bias"]
    v = y.mean(1) @ p[a + "value/kernel"].reshape(d, d) + p[a + "value/bias"].reshape(d)
    attn_out = v @ p[a + "out/kernel"].reshape(d, d) + p[a + "out/bias"]
    want = x + attn_out[:, None] + p[b + "MlpBlock_3/Dense_1/bias"]
    got = ref._encoder_block(p, "Transformer/encoderblock_0", x, heads)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_attention_matches_per_head_loop():
    rng = np.random.default_rng(11)
    d, heads, dh = 12, 3, 4
    p = _vit_params(rng, d=d, heads=heads, layers=1)
    a = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/"
    x = rng.normal(size=(2, 6, d))
    want = np.broadcast_to(p[a + "out/bias"], (2, 6, d)).copy()
    for n in range(2):
        for h in range(heads):
            q, k, v = (
                x[n] @ p[a + f"{t}/kernel"][:, h] + p[a + f"{t}/bias"][h]
                for t in ("query", "key", "value")
            )
            s = q @ k.T / math.sqrt(dh)
            w = np.exp(s - s.max(1, keepdims=True))
            w /= w.sum(1, keepdims=True)
            want[n] += (w @ v) @ p[a + "out/kernel"][h]
    got = ref._attention(p, "Transformer/encoderblock_0", x, heads)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_patch_embedding_order():
    """Conv patchify: row-major patches, each flattened in (row, col, chan) order."""
    rng = np.random.default_rng(12)
    img = rng.normal(size=(2, 6, 4, 3))
    w = rng.normal(size=(2, 2, 3, 5))
    p = {"embedding/kernel": w, "embedding/bias": np.arange(5.0)}
    got = ref._embed(p, img, 2)
    want = np.stack(
        [
            img[:, 2 * r : 2 * r + 2, 2 * c : 2 * c + 2].reshape(2, 12) @ w.reshape(12, 5)
            for r in range(3)
            for c in range(2)
        ],
        axis=1,
    ) + np.arange(5.0)
    np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_random_vit_smoke(classifier):
    rng = np.random.default_rng(13)
    p = _vit_params(
        rng, d=16, heads=4, layers=3, classes=7, patch=4, chans=3, tokens=16, classifier=classifier
    )
    p = {k: v.astype(np.float32) for k, v in p.items()}  # checkpoints are float32
    img = rng.uniform(-1, 1, size=(2, 16, 16, 3)).astype(np.float32)
    out = ref.vit_logits(p, img, num_heads=4, patch_size=4, classifier=classifier)
    assert out.shape == (2, 7) and out.dtype == np.float64
    assert np.all(np.isfinite(out))
    assert not np.allclose(out[0], out[1])
    with pytest.raises(ValueError):
        ref.vit_logits(p, img[:, :12, :12], num_heads=4, patch_size=4, classifier=classifier)
    with pytest.raises(ValueError):
        ref.vit_logits(p, img, num_heads=2, patch_size=4, classifier=classifier)


# ----------------------------------------------------------------------------
# ResNet hybrid stem.
# ----------------------------------------------------------------------------


def _gn_params(rng, p, name, c):
    p[name + "/scale"] = 1 + 0.1 * rng.normal(size=(c,))
    p[name + "/bias"] = 0.1 * rng.normal(size=(c,))


def _unit_params(rng, p, prefix, cin, width, proj):
    n = rng.normal
    p[prefix + "/conv1/kernel"] = n(size=(1, 1, cin, width))
    p[prefix + "/conv2/kernel"] = n(size=(3, 3, width, width))
    p[prefix + "/conv3/kernel"] = n(size=(1, 1, width, 4 * width))
    for name, c in (("gn1", width), ("gn2", width), ("gn3", 4 * width)):
        _gn_params(rng, p, prefix + "/" + name, c)
    if proj:
        p[prefix + "/conv_proj/kernel"] = n(size=(1, 1, cin, 4 * width))
        _gn_params(rng, p, prefix + "/gn_proj", 4 * width)


def _hybrid_params(rng, stages, tokens, d=8, chans=3):
    p = _vit_params(
        rng,
        d=d,
        heads=2,
        layers=1,
        patch=1,
        tokens=tokens,
        chans=64 if not stages else 256 * 2 ** (len(stages) - 1),
    )
    p["conv_root/kernel"] = rng.normal(size=(7, 7, chans, 64))
    _gn_params(rng, p, "gn_root", 64)
    cin = 64
    for i, depth in enumerate(stages):
        width = 64 * 2**i
        for u in range(depth):
            _unit_params(rng, p, f"block{i + 1}/unit{u + 1}", cin, width, proj=(u == 0))
            cin = 4 * width
    return p


def test_unit_without_projection_is_identity_when_gn3_is_zero():
    """gn3 scale = bias = 0 (as at init): the unit returns relu(residual)."""
    rng = np.random.default_rng(14)
    p = {}
    _unit_params(rng, p, "u", 256, 64, proj=False)
    p["u/gn3/scale"] = np.zeros((1, 1, 1, 256))
    p["u/gn3/bias"] = np.zeros((1, 1, 1, 256))
    x = np.abs(rng.normal(size=(2, 5, 5, 256)))
    np.testing.assert_allclose(ref._bottleneck_unit(p, "u", x, 1), x, atol=1e-12)
    # With a projection the residual is GN(WSconv 1x1 stride s (x)).
    _unit_params(rng, p, "v", 256, 64, proj=True)
    p["v/gn3/scale"] = np.zeros(256)
    p["v/gn3/bias"] = np.zeros(256)
    w = p["v/conv_proj/kernel"]
    w = (w - w.mean((0, 1, 2))) / ((w - w.mean((0, 1, 2))).std((0, 1, 2)) + 1e-5)
    res = x[:, ::2, ::2] @ w[0, 0]  # 1x1 stride 2 SAME on odd size: no padding
    want = np.maximum(ref._group_norm(res, p["v/gn_proj/scale"], p["v/gn_proj/bias"]), 0)
    np.testing.assert_allclose(ref._bottleneck_unit(p, "v", x, 2), want, atol=1e-12)


def test_root_only_stem_matches_naive():
    rng = np.random.default_rng(15)
    p = _hybrid_params(rng, (), tokens=16)
    img = rng.uniform(-1, 1, size=(2, 13, 14, 3))
    w = ref._standardize_weight(p["conv_root/kernel"])
    y = _naive_conv(img, w, 2, "SAME")  # [2, 7, 7, 64]
    y = np.maximum(ref._group_norm(y, p["gn_root/scale"], p["gn_root/bias"]), 0)
    want = _naive_max_pool(y, 3, 2)  # [2, 4, 4, 64]
    got = ref._resnet_stem(p, img, ())
    assert got.shape == (2, 4, 4, 64)
    np.testing.assert_allclose(got, want, atol=1e-10)
    out = ref.vit_logits(p, img, num_heads=2, patch_size=1, resnet_stages=())
    assert out.shape == (2, 5) and np.all(np.isfinite(out))


def test_hybrid_reference_shapes():
    rng = np.random.default_rng(16)
    p = _hybrid_params(rng, (2, 1), tokens=64)  # 64 px: root conv 32, pool 16, stage 2 -> 8
    img = rng.uniform(-1, 1, size=(2, 64, 64, 3))
    stem = ref._resnet_stem(p, img, (2, 1))
    assert stem.shape == (2, 8, 8, 512)  # root /4, stage 1 stride 1, stage 2 stride 2
    assert np.all(stem >= 0)
    out = ref.vit_logits(p, img, num_heads=2, patch_size=1, resnet_stages=(2, 1))
    assert out.shape == (2, 5) and np.all(np.isfinite(out))
    gap = dict(p)
    del gap["cls"]
    gap["Transformer/posembed_input/pos_embedding"] = p["Transformer/posembed_input/pos_embedding"][
        :, 1:
    ]
    out_gap = ref.vit_logits(
        gap, img, num_heads=2, patch_size=1, classifier="gap", resnet_stages=(2, 1)
    )
    assert out_gap.shape == (2, 5) and np.all(np.isfinite(out_gap))
