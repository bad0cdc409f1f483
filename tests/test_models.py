"""Model family: exact parameter counts, the published name tree, options, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import optax
import pytest
from helpers import flat, logits, unflat

from vit_jax import weights
from vit_jax.models import VARIANTS, apply_with_intermediates, count_params, get_model, param_shapes
from vit_jax.models.posemb import sincos_2d

# Published counts (1000-class head, 224 px, no representation layer); 'testing' by hand:
# embedding 16*16*3*32+32, cls 32, posemb 197*32, 2 blocks of 8544, encoder_norm 64,
# head 32*1000+1000.
EXPECTED_COUNTS = {
    "testing": 81_096,
    "ViT-Ti_16": 5_717_416,
    "ViT-S_16": 22_050_664,
    "ViT-S_32": 22_878_952,
    "ViT-B_8": 86_576_872,
    "ViT-B_16": 86_567_656,
    "ViT-B_32": 88_224_232,
    "ViT-L_16": 304_326_632,
    "ViT-L_32": 306_535_400,
    "ViT-H_14": 632_045_800,
    "R+ViT-Ti_16": 6_337_704,
    "R26+ViT-S_32": 36_431_912,
    "R26+ViT-B_32": 101_383_976,
    "R50+ViT-B_16": 98_659_112,
    "R50+ViT-L_32": 328_994_856,
    "ViT-S_16-gap-norep": 22_049_896,
    "ViT-B_16-gap-norep": 86_566_120,
    "ViT-S_32-gap-norep": 22_878_184,
    "ViT-B_32-gap-norep": 88_222_696,
}


def test_every_variant_has_a_count():
    assert set(VARIANTS) == set(EXPECTED_COUNTS), "add the published count of new variants"


@pytest.mark.parametrize("name", sorted(EXPECTED_COUNTS))
def test_parameter_count(name):
    assert count_params(param_shapes(get_model(name, 1000), 224)) == EXPECTED_COUNTS[name]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_output_shape(name):
    model = get_model(name, 7)
    size = 2 * model.token_stride
    x = jax.ShapeDtypeStruct((3, size, size, 3), jnp.float32)
    out = jax.eval_shape(lambda x: model.init_with_output(jax.random.key(0), x)[0], x)
    assert out.shape == (3, 7) and out.dtype == jnp.float32


def published_keys(depth: int, stages=None, cls=True) -> set[str]:
    """The published name tree, written from the format's description."""
    keys = {
        "embedding/kernel",
        "embedding/bias",
        "Transformer/posembed_input/pos_embedding",
        "Transformer/encoder_norm/scale",
        "Transformer/encoder_norm/bias",
        "head/kernel",
        "head/bias",
    } | ({"cls"} if cls else set())
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        keys |= {
            b + f"{ln}/{p}" for ln in ("LayerNorm_0", "LayerNorm_2") for p in ("scale", "bias")
        }
        keys |= {
            b + f"MultiHeadDotProductAttention_1/{n}/{p}"
            for n in ("query", "key", "value", "out")
            for p in ("kernel", "bias")
        }
        keys |= {b + f"MlpBlock_3/Dense_{j}/{p}" for j in (0, 1) for p in ("kernel", "bias")}
    if stages is not None:
        keys |= {"conv_root/kernel", "gn_root/scale", "gn_root/bias"}
        for s, n in enumerate(stages, 1):
            for u in range(1, n + 1):
                names = ["1", "2", "3"] + (["_proj"] if u == 1 else [])
                keys |= {f"block{s}/unit{u}/conv{c}/kernel" for c in names}
                keys |= {f"block{s}/unit{u}/gn{c}/{p}" for c in names for p in ("scale", "bias")}
    return keys


@pytest.mark.parametrize("name", ["ViT-B_16", "R50+ViT-B_16", "R+ViT-Ti_16", "ViT-B_16-gap-norep"])
def test_parameter_names_are_the_published_ones(name):
    model = get_model(name, 1000)
    got = set(flat(param_shapes(model, 224)))
    assert got == published_keys(model.depth, model.resnet_stages, model.has_class_token)


def test_published_shapes_of_attention():
    shapes = flat(param_shapes(get_model("ViT-B_16", 1000), 224))
    att = "Transformer/encoderblock_3/MultiHeadDotProductAttention_1/"
    assert shapes[att + "query/kernel"].shape == (768, 12, 64)
    assert shapes[att + "query/bias"].shape == (12, 64)
    assert shapes[att + "out/kernel"].shape == (12, 64, 768)
    assert shapes["Transformer/posembed_input/pos_embedding"].shape == (1, 197, 768)
    assert shapes["embedding/kernel"].shape == (16, 16, 3, 768)


def test_short_names_and_overrides():
    assert get_model("B/16", 10).width == 768
    hybrid = get_model("R50+B/16", 10)
    assert (
        hybrid.resnet_stages == (3, 4, 9) and hybrid.patch_size == 1 and hybrid.token_stride == 16
    )
    assert get_model("R50+L/32", 10).resnet_stages == (3, 4, 6, 3)
    m = get_model("Ti/8", 10, depth=3, mlp_dim=100)
    assert (m.width, m.depth, m.mlp_dim, m.patch_size) == (192, 3, 100, 8)
    with pytest.raises(ValueError, match="unknown model 'X/16'"):
        get_model("X/16", 10)
    with pytest.raises(TypeError, match="unknown model option"):
        get_model("B/16", 10, widht=3)
    with pytest.raises(ValueError, match="multiple of 16"):
        get_model("R50+B/8", 10)


def _init(model, size=32, batch=2, seed=0):
    x = jax.random.uniform(
        jax.random.key(seed + 1), (batch, size, size, model.channels), minval=-1, maxval=1
    )
    params = jax.jit(model.init)(jax.random.key(seed), x)["params"]
    # A zero head would make every logit test trivial: give it values.
    params["head"]["kernel"] = jax.random.normal(jax.random.key(7), params["head"]["kernel"].shape)
    return params, x


def _loss_grads(model, params, x):
    """Gradients of a softmax cross-entropy against fixed labels, in the published layout."""
    labels = jax.nn.one_hot(jnp.arange(x.shape[0]) % 5, 5)

    def loss(p):
        out = model.apply({"params": p}, x, train=False)
        return optax.softmax_cross_entropy(out, labels).mean()

    grads = jax.jit(jax.grad(loss))(params)
    return flat(unflat(weights.unstack_blocks(flat(jax.device_get(grads)))))


def test_scan_and_remat_compute_the_same_function_and_gradients():
    model = get_model("testing", 5)
    params, x = _init(model)
    want, want_grads = logits(model, params, x), _loss_grads(model, params, x)
    for kw in (dict(scan=True), dict(remat=True), dict(scan=True, remat=True)):
        other = get_model("testing", 5, **kw)
        p = weights.adapt(params, other, 32, reset_head=False)
        np.testing.assert_allclose(logits(other, p, x), want, atol=1e-5)
        # Checkpoints see the same names whatever the switches.
        assert set(flat(unflat(weights.unstack_blocks(flat(p))))) == set(flat(params))
        grads = _loss_grads(other, p, x)
        assert grads.keys() == want_grads.keys()
        for k, g in want_grads.items():
            np.testing.assert_allclose(grads[k], g, atol=1e-5, err_msg=f"{kw} {k}")


def test_intermediates():
    """Each block's output, its attention weights, pre_logits and logits against the
    float64 NumPy reference, step by step (not against the model's own other outputs)."""
    model = get_model("testing", 5)
    params, x = _init(model)
    out, inter = apply_with_intermediates(model, params, x)
    n = 1 + 2 * 2
    assert inter["blocks"].shape == (2, 2, n, 32)
    assert inter["attention"].shape == (2, 2, 2, n, n)
    p = {k: np.asarray(v, np.float64) for k, v in flat(params).items()}
    tokens = ref._embed(p, np.asarray(x, np.float64), 16)  # [2, 4, 32]
    cls = np.broadcast_to(p["cls"], (2, 1, 32))
    h = np.concatenate([cls, tokens], 1) + p["Transformer/posembed_input/pos_embedding"]
    for i in range(2):
        block = f"Transformer/encoderblock_{i}"
        y = ref._layer_norm(h, p[f"{block}/LayerNorm_0/scale"], p[f"{block}/LayerNorm_0/bias"])
        attn = f"{block}/MultiHeadDotProductAttention_1"
        q, k = (
            np.einsum("nld,dhk->nhlk", y, p[f"{attn}/{w}/kernel"])
            + p[f"{attn}/{w}/bias"][None, :, None]
            for w in ("query", "key")
        )  # [2, heads, n, 16]
        weights_ = ref._softmax(np.einsum("nhqk,nhmk->nhqm", q, k) / np.sqrt(16))
        np.testing.assert_allclose(inter["attention"][i], weights_, atol=1e-5, err_msg=block)
        h = ref._encoder_block(p, block, h, num_heads=2)
        np.testing.assert_allclose(inter["blocks"][i], h, atol=1e-4, err_msg=block)
    enc = "Transformer/encoder_norm"
    pre = ref._layer_norm(h, p[f"{enc}/scale"], p[f"{enc}/bias"])[:, 0]
    np.testing.assert_allclose(inter["pre_logits"], pre, atol=1e-4)
    np.testing.assert_allclose(out, pre @ p["head/kernel"] + p["head/bias"], atol=2e-4)
    np.testing.assert_allclose(
        out, ref.vit_logits(p, np.asarray(x), num_heads=2, patch_size=16), atol=2e-4
    )


def test_classifier_and_representation_options():
    gap = get_model("testing", 5, classifier="gap", representation_size=12)
    params, x = _init(gap)
    assert "cls" not in params and params["pre_logits"]["kernel"].shape == (32, 12)
    _, inter = apply_with_intermediates(gap, params, x)
    assert inter["blocks"].shape[2] == 4 and inter["pre_logits"].shape == (2, 12)
    assert np.all(np.abs(inter["pre_logits"]) <= 1.0)  # tanh
    unpooled = get_model("testing", 5, classifier="unpooled")
    p, x = _init(unpooled)
    assert logits(unpooled, p, x).shape == (2, 4, 5)


def test_position_embedding_kinds():
    for kind, keys in (
        ("none", set()),
        ("sincos_2d", set()),
        ("learned_2d", {"pos_embedding_row", "pos_embedding_col"}),
    ):
        model = get_model("testing", 5, posemb=kind)
        params, x = _init(model, size=48)
        assert set(params["Transformer"].get("posembed_input", {})) == keys
        assert logits(model, params, x).shape == (2, 5)
    row = params["Transformer"]["posembed_input"]["pos_embedding_row"]
    assert row.shape == (1, 3, 16)
    pe = sincos_2d((2, 3), 8)  # [gh*gw, D]: sin/cos of x then of y, omega = 1, 1/100
    y, x = 1, 2
    np.testing.assert_allclose(
        pe[y * 3 + x],
        [
            np.sin(x),
            np.sin(x / 100),
            np.cos(x),
            np.cos(x / 100),
            np.sin(y),
            np.sin(y / 100),
            np.cos(y),
            np.cos(y / 100),
        ],
        rtol=1e-6,
    )


def test_posemb_none_is_permutation_equivariant():
    """Without position embeddings, shuffling patches leaves the class token unchanged."""
    model = get_model("testing", 5, posemb="none")
    params, x = _init(model, size=32)
    swapped = jnp.concatenate([x[:, 16:], x[:, :16]], axis=1)  # swap the patch rows
    np.testing.assert_allclose(logits(model, params, x), logits(model, params, swapped), atol=1e-5)
    learned = get_model("testing", 5)
    p, _ = _init(learned)
    assert not np.allclose(logits(learned, p, x), logits(learned, p, swapped))


def test_dropout_needs_rng_only_in_training():
    model = get_model("testing", 5, dropout=0.5, attention_dropout=0.5, stochastic_depth=0.5)
    params, x = _init(model)
    a = logits(model, params, x, train=False)  # no rng needed
    train = jax.jit(lambda p, x, r: model.apply({"params": p}, x, train=True, rngs={"dropout": r}))
    b, b2 = train(params, x, jax.random.key(1)), train(params, x, jax.random.key(1))
    c = train(params, x, jax.random.key(2))
    np.testing.assert_array_equal(b, b2)  # deterministic per rng
    assert not np.allclose(a, b) and not np.allclose(b, c)
    with pytest.raises(Exception, match="dropout"):
        model.apply({"params": params}, x, train=True)


def test_bfloat16_compute_keeps_float32_params():
    model = get_model("testing", 5, dtype="bfloat16")
    params, x = _init(model)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    ref = logits(get_model("testing", 5), params, x)
    out = logits(model, params, x)
    assert out.dtype == jnp.float32
    # The blocks really compute in bfloat16 (a dtype ignored would pass a loose margin) ...
    _, inter = jax.jit(lambda p, x: apply_with_intermediates(model, p, x))(params, x)
    assert inter["blocks"].dtype == jnp.bfloat16
    assert inter["attention"].dtype == jnp.float32  # the softmax is taken in float32
    # ... and stay within bfloat16's rounding of float32 (8 bits of mantissa, 2 blocks).
    err = float(jnp.abs(out - ref).max()) / float(jnp.abs(ref).max())
    assert 1e-6 < err < 0.03, err


def test_param_dtype_stores_parameters_in_bfloat16():
    model = get_model("testing", 5, param_dtype="bfloat16")
    shapes = param_shapes(model, 32)
    assert {p.dtype for p in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.bfloat16)}
    params, x = _init(model)
    ref = get_model("testing", 5)
    out = logits(model, params, x)
    want = logits(ref, jax.tree.map(lambda p: p.astype(jnp.float32), params), x)
    np.testing.assert_allclose(out, want, atol=1e-5)  # float32 compute on the same values


def test_hybrid_runs_and_checks_sizes():
    model = get_model(
        "R50+B/16", 3, width=32, depth=1, num_heads=2, mlp_dim=16, resnet_stages=(1, 1, 1)
    )
    params, x = _init(model, size=32)
    assert params["block2"]["unit1"]["conv1"]["kernel"].shape == (1, 1, 256, 128)
    assert params["block2"]["unit1"]["conv2"]["kernel"].shape == (3, 3, 128, 128)
    assert float(jnp.abs(params["block1"]["unit1"]["gn3"]["scale"]).max()) == 0.0
    assert logits(model, params, x).shape == (2, 3)
    with pytest.raises(ValueError, match="not a multiple of the patch size 16"):
        logits(model, params, x[:, :24])


def test_bad_input_errors():
    model = get_model("testing", 5)
    params, x = _init(model)
    with pytest.raises(ValueError, match="48x40 is not a multiple of the patch size 16 px"):
        model.apply({"params": params}, jnp.zeros((1, 48, 40, 3)))
    with pytest.raises(ValueError, match="1 channels, the model is built for 3"):
        model.apply({"params": params}, jnp.zeros((1, 32, 32, 1)))
    with pytest.raises(ValueError, match="add a batch axis"):
        model.apply({"params": params}, jnp.zeros((32, 32, 3)))
    with pytest.raises(ValueError, match="3x3 grid.*load_pretrained"):
        model.apply({"params": params}, jnp.zeros((1, 48, 48, 3)))
    gray = get_model("testing", 5, channels=1)
    p = gray.init(jax.random.key(0), jnp.zeros((1, 32, 32, 1)))["params"]
    assert p["embedding"]["kernel"].shape == (16, 16, 1, 32)


def test_param_shapes_traces_a_model_once_per_size():
    """Reading a checkpoint asks for the model's table twice (to check the file, then to
    adapt it): the model is traced once, and each caller gets its own dict."""
    from vit_jax.models import _traced_shapes

    model = get_model("testing", 3)
    _traced_shapes.cache_clear()
    first = param_shapes(model, 32)
    first["head"]["kernel"] = None  # a caller's change stays its own
    again = param_shapes(model, 32)
    assert again["head"]["kernel"].shape[-1] == 3
    assert (_traced_shapes.cache_info().misses, _traced_shapes.cache_info().hits) == (1, 1)
    assert (
        param_shapes(model, (32, 48))["Transformer"]["posembed_input"]
        != again["Transformer"]["posembed_input"]
    )
    assert _traced_shapes.cache_info().misses == 2
