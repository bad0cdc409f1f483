"""The fused attention choices compute what XLA's explicit softmax does (the splash kernel in
Pallas' interpret mode on this CPU), on one device and in a shard_map over a mesh; the
maps inspection reads stay; what a platform cannot run is refused in one line."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vit_jax.inspection import relevance
from vit_jax.models import apply_with_intermediates, attention, get_model
from vit_jax.parallel import sharding
from vit_jax.training import check


def tiny(size: int, **fields):
    """A one-block ViT on 2 x 2 patches of `size` px: (size / 2)² + 1 tokens."""
    model = get_model("ViT-Ti_16", None, patch_size=2, width=32, mlp_dim=64, depth=1,
                      num_heads=2, **fields)  # fmt: skip
    x = jax.random.uniform(jax.random.key(size), (2, size, size, 3), minval=-1, maxval=1)
    return model, model.init(jax.random.key(1), x)["params"], x


@pytest.mark.parametrize("size, tokens", [(28, 197), (48, 577), (64, 1025), (74, 1370)])
def test_splash_computes_what_xla_does_forward_and_backward(size, tokens):
    """The paper's fine-tuning sequence lengths (224 px and 384 with /16; L/16 at 512, H/14
    at 518), each padded to a multiple of 128 inside attention."""
    xla, params, x = tiny(size, attention="xla")
    assert xla.grid((size, size))[0] ** 2 + 1 == tokens
    splash = xla.clone(attention="splash")
    loss = lambda m: jax.jit(
        jax.value_and_grad(lambda p: jnp.mean(jnp.sin(m.apply({"params": p}, x))))
    )
    (a, grads_a), (b, grads_b) = loss(xla)(params), loss(splash)(params)
    np.testing.assert_allclose(splash.apply({"params": params}, x),
                               xla.apply({"params": params}, x), atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(b, a, atol=1e-6)  # a loss near 0 (2e-3): rtol is no measure
    for path, g in jax.tree_util.tree_leaves_with_path(grads_b):
        want = dict(jax.tree_util.tree_leaves_with_path(grads_a))[path]
        np.testing.assert_allclose(g, want, atol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_what_the_pad_holds_does_not_matter():
    q, k, v = (
        jax.random.normal(key, (2, 197, 2, 64)) for key in jax.random.split(jax.random.key(0), 3)
    )
    zeros = attention.splash(q / 8, k, v, interpret=True)
    large = attention.splash(q / 8, k, v, interpret=True, fill=1e4)
    assert zeros.shape == (2, 197, 2, 64)
    np.testing.assert_array_equal(large, zeros)


@pytest.mark.parametrize("tokens", [197, 198])
def test_the_cudnn_path_pads_an_odd_sequence_and_masks_the_pad(tokens):
    """cuDNN's training kernel refuses odd lengths (seen on an H200, JAX 0.11.2): one pad
    token, masked by length. The same padding and mask run here through JAX's XLA kernel."""
    q, k, v = (jax.random.normal(key, (2, tokens, 2, 64))
               for key in jax.random.split(jax.random.key(tokens), 3))  # fmt: skip
    p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q / 8, k), axis=-1)
    want = jnp.einsum("bhqk,bkhd->bqhd", p, v)
    for fill in (0.0, 1e4):
        got = attention.cudnn(q / 8, k, v, impl="xla", fill=fill)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_on_a_mesh_the_kernel_runs_in_a_shard_map_over_the_batch():
    """XLA does not partition a Mosaic kernel: over 8 devices each runs its own images."""
    xla, params, x = tiny(28, attention="xla")
    x = jnp.concatenate([x] * 4)  # 8 images, one a device
    mesh = sharding.make_mesh(devices=jax.devices()[:8])
    x = jax.device_put(x, NamedSharding(mesh, P(sharding.BATCH_AXES)))
    splash = xla.clone(attention="splash")
    run = lambda m: sharding.on_mesh(mesh, lambda p, x: m.apply({"params": p}, x))
    assert "shard_map" in str(jax.make_jaxpr(run(splash))(params, x))
    assert "shard_map" not in str(jax.make_jaxpr(run(xla))(params, x))
    np.testing.assert_allclose(jax.jit(run(splash))(params, x), xla.apply({"params": params}, x),
                               atol=1e-5)  # fmt: skip


def test_inspection_reads_the_probabilities_whatever_the_model_runs():
    xla, params, x = tiny(28, attention="xla")
    _, want = apply_with_intermediates(xla, params, x)
    splash = xla.clone(attention="splash")
    _, got = apply_with_intermediates(splash, params, x)
    assert got["attention"][0].shape == (2, 2, 197, 197)
    np.testing.assert_array_equal(got["attention"][0], want["attention"][0])
    # the relevance maps' gradients come through the same probabilities
    xla, splash = xla.clone(num_classes=3), splash.clone(num_classes=3)
    params = xla.init(jax.random.key(2), x)["params"]
    params["head"]["kernel"] = jax.random.normal(jax.random.key(3), (32, 3))
    maps = [relevance(m, params, np.asarray(x), [0, 2]) for m in (xla, splash)]
    assert maps[0].shape == (2, 2, 14, 14) and np.abs(maps[0]).max() > 0
    np.testing.assert_array_equal(maps[1], maps[0])


def test_auto_fuses_where_the_platform_has_a_kernel_that_pays(monkeypatch):
    assert attention.choose("auto", 10_000, jnp.bfloat16) == "xla"  # on CPUs, always
    for platform, kind, dtype, tokens, want in [
        ("tpu", "TPU v5 lite", jnp.bfloat16, 577, "splash"),
        ("tpu", "TPU v5 lite", jnp.bfloat16, 197, "xla"),
        ("tpu", "TPU v3", jnp.bfloat16, 1025, "xla"),  # v3 compiles splash in float32 only
        ("gpu", "NVIDIA H100 80GB HBM3", jnp.bfloat16, 577, "cudnn"),
        ("gpu", "NVIDIA H200", jnp.bfloat16, 197, "cudnn"),  # 1.19x faster there: BENCHMARKS.md
        ("gpu", "NVIDIA H100 80GB HBM3", jnp.float32, 577, "xla"),
    ]:
        monkeypatch.setattr(attention, "target", lambda p=platform, k=kind: (p, k))
        assert attention.choose("auto", tokens, dtype) == want, (kind, dtype, tokens)
        assert attention.choose("auto", tokens, dtype, dropout=0.1) == "xla"


def test_what_the_platform_cannot_run_is_refused_with_what_to_use(monkeypatch):
    with pytest.raises(
        ValueError,
        match=r"^attention=cudnn needs an NVIDIA GPU, and there is no GPU here \(cpu\): use",
    ):
        attention.choose("cudnn", 577, jnp.bfloat16)
    with pytest.raises(
        ValueError, match=r"^attention='flash': expected one of auto, xla, splash, cudnn$"
    ):
        attention.choose("flash", 577, jnp.float32)
    with pytest.raises(
        ValueError, match="no attention dropout: set attention_dropout=0, or attention=xla"
    ):
        attention.choose("splash", 577, jnp.float32, dropout=0.1)
    monkeypatch.setattr(attention, "target", lambda: ("gpu", "NVIDIA H100 80GB HBM3"))
    with pytest.raises(
        ValueError,
        match="runs in bfloat16 or float16, not float32: set dtype=bfloat16, or attention=xla",
    ):
        attention.choose("cudnn", 577, jnp.float32)
    with pytest.raises(
        ValueError,
        match="splash does not compile for NVIDIA H100 80GB HBM3 in bfloat16: use attention=cudnn",
    ):
        attention.choose("splash", 577, jnp.bfloat16)
    monkeypatch.setattr(attention, "target", lambda: ("tpu", "TPU v3"))
    with pytest.raises(
        ValueError,
        match="splash does not compile for TPU v3 in bfloat16: use attention=xla, or dtype=float32",
    ):
        attention.choose("splash", 577, jnp.bfloat16)
    assert attention.choose("splash", 577, jnp.float32) == "splash"


def test_a_run_config_with_a_choice_this_host_cannot_run_is_refused():
    """Against this host's devices, after the processes joined (check.device_problems: the
    config alone must not start JAX's backend, which would make joining impossible)."""
    config = tiny_config()
    config.model.attention = "cudnn"
    assert check.problems(config) == []
    (problem,) = check.device_problems(config, devices=8, processes=1)
    assert problem.field == "model.attention" and "there is no GPU here" in problem.allowed
    config.model.attention = "flash"
    (problem,) = check.problems(config)
    assert problem.allowed == "expected one of 'auto', 'xla', 'splash', 'cudnn'", problem


def test_the_cudnn_adapter_masks_by_lengths_only_where_padding_is_last(monkeypatch):
    """One mask contract: lengths where every row's padding comes last (the fast path),
    JAX's boolean mask otherwise, decided on concrete arrays in Python (a mask with padding
    in the middle never reaches the length path) and by lax.cond under jit. Both agree with
    the explicit softmax over the real tokens; lengths alone would not, with a gap."""
    keys = jax.random.split(jax.random.key(3), 3)
    q, k, v = (
        jax.random.normal(key, (2, 9, 2, 16)) / s for key, s in zip(keys, (4, 1, 1), strict=True)
    )
    last = np.array([[1] * 6 + [0] * 3, [1] * 9], bool)  # padding last; a full row
    middle = np.array([[1, 1, 0, 0, 1, 1, 1, 0, 0], [1] * 9], bool)  # a gap in row 0

    def want(valid):  # [B, N, H, hd]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        p = jax.nn.softmax(jnp.where(valid[:, None, None, :], logits, -jnp.inf), axis=-1)
        return np.asarray(jnp.einsum("bhqk,bkhd->bqhd", p, v))

    calls, by_lengths = [], attention.by_lengths
    monkeypatch.setattr(attention, "by_lengths", lambda *a: calls.append(a) or by_lengths(*a))
    jitted = jax.jit(lambda m: attention.cudnn(q, k, v, impl="xla", mask=m))
    for valid, reached in ((last, 1), (middle, 0)):
        calls.clear()
        got = np.asarray(attention.cudnn(q, k, v, impl="xla", mask=attention.Mask.of(valid)))
        assert len(calls) == reached
        np.testing.assert_allclose(got[valid], want(valid)[valid], atol=1e-5)  # real queries
        np.testing.assert_allclose(
            np.asarray(jitted(attention.Mask.of(valid)))[valid], got[valid], atol=1e-6
        )
    assert bool(attention.Mask.of(last).padding_last)
    assert not bool(attention.Mask.of(middle).padding_last)
    run = functools.partial(jax.nn.dot_product_attention, scale=1.0, implementation="xla")
    gap = np.asarray(by_lengths(run, q, k, v, jnp.asarray(middle)))  # what lengths would do
    assert np.abs(gap[middle] - want(middle)[middle]).max() > 1e-2


def test_the_cudnn_adapter_traces_both_branches_for_cudnn_itself():
    """Under jit lax.cond traces the length path and the mask path alike, so both must be
    what JAX's cuDNN implementation accepts (its boolean mask becomes a bias, refused
    unless [B, 1, N, N]): traced here on the CPU with its cuDNN version check stubbed."""
    from unittest import mock

    fused = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    q = jnp.zeros((2, 9, 2, 16), jnp.bfloat16)  # an odd length: one pad token more
    valid = np.array([[1, 1, 0, 0, 1, 1, 1, 0, 0], [1] * 9], bool)
    step = jax.jit(lambda q, m: attention.cudnn(q, q, q, mask=m))
    with mock.patch.object(fused, "check_cudnn_version", lambda *a, **k: None):
        out = jax.eval_shape(step, q, attention.Mask.of(valid))
    assert out.shape == (2, 9, 2, 16) and out.dtype == jnp.bfloat16
