"""The towers' fields through every path of the model (issue 61): scan and remat compute
what the plain stack computes, LoRA's adapters reach the SwiGLU gate and start at the
base's logits, NaFlex patches at the full grid are the image's tokens, and the
intermediates count the class and register tokens. Each field moves the logits."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import traverse_util
from helpers import images, random_params

from vit_jax.models import apply_with_intermediates, attention, get_model, lora, naflex
from vit_jax.weights.npz import stack_blocks

TOWER = dict(
    registers=2, embed_prefix=False, layer_scale=1e-5, swiglu=True, mlp_norm=True,
    attention_norm=True, qkv_bias="qv", rope="eva", rope_grid=(3, 3), classifier="gap",
    class_token=True, fc_norm=True, pre_norm=True, gelu="quick", patch_size=8,
)  # fmt: skip
DINOV3 = dict(
    registers=2, layer_scale=1e-5, posemb="none", rope="dinov3", qkv_bias="", patch_size=8
)


def tower_params(model, size=32, seed=0):
    """Random parameters with LayerScale gains around 1 (so that every branch counts)."""
    flat = traverse_util.flatten_dict(random_params(model, size, seed=seed), sep="/")
    rng = np.random.default_rng(seed)
    for k, v in flat.items():
        if "layer_scale" in k:
            flat[k] = rng.normal(1.0, 0.5, v.shape).astype(np.float32)
    return traverse_util.unflatten_dict(flat, sep="/")


@pytest.mark.parametrize("fields", [TOWER, DINOV3], ids=["eva-like", "dinov3-like"])
def test_scan_remat_and_naflex_compute_the_plain_stack(fields):
    model = get_model("testing", 7, **fields)
    params, x = tower_params(model), images(32, n=3)
    want = np.asarray(jax.jit(model.apply)({"params": params}, x))
    assert np.abs(want).max() > 0.1
    stacked = traverse_util.unflatten_dict(
        stack_blocks(traverse_util.flatten_dict(params, sep="/")), sep="/"
    )
    for kw, p in ((dict(remat=True), params), (dict(scan=True), stacked),
                  (dict(scan=True, remat=True), stacked)):  # fmt: skip
        got = jax.jit(model.clone(**kw).apply)({"params": p}, x)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=str(kw))
    patches = naflex.patchify(np.asarray(x), 8, seq_len=20)  # 16 patches, 4 of padding
    got = jax.jit(model.clone(posemb_grid=(4, 4)).apply)({"params": params}, patches)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_each_field_moves_the_logits():
    """A field left out changes what the tower computes (none is a no-op by accident; the
    GELU form is, beside SwiGLU's SiLU)."""
    model = get_model("testing", 7, **TOWER)
    params, x = tower_params(model), images(32, n=2)
    want = np.asarray(model.apply({"params": params}, x))
    for change in (dict(rope=None), dict(attention_norm=False), dict(rope_grid=(4, 4)),
                   dict(classifier="token"), dict(rope_base=100.0)):  # fmt: skip
        got = np.asarray(model.clone(**change).apply({"params": params}, x))
        assert np.abs(got - want).max() > 1e-4, change


def test_intermediates_count_the_class_and_register_tokens():
    model = get_model("testing", 7, **TOWER)
    params = tower_params(model)
    logits, inter = apply_with_intermediates(model, params, images(32, n=2))
    assert logits.shape == (2, 7) and inter["pre_logits"].shape == (2, 32)
    assert inter["attention"].shape == (2, 2, 2, 3 + 16, 3 + 16)  # [L, B, H, S, S]
    np.testing.assert_allclose(inter["attention"].sum(-1), 1.0, rtol=1e-5)


def test_lora_adapts_the_swiglu_gate_and_starts_at_the_base():
    model = get_model("testing", 7, **TOWER)
    params, x = tower_params(model), images(32, n=2)
    adapted = model.clone(lora=lora.Lora(2, 2.0, lora.TARGETS["mlp"]))
    init = jax.jit(adapted.init)(jax.random.key(0), x)["params"]
    names = [k for k in traverse_util.flatten_dict(init, sep="/") if lora.MARK in k]
    assert any("/gate_lora_" in n for n in names) and any("/Dense_0_lora_" in n for n in names)
    start = {**traverse_util.flatten_dict(params, sep="/")}
    start |= {k: v for k, v in traverse_util.flatten_dict(init, sep="/").items() if lora.MARK in k}
    got = adapted.apply({"params": traverse_util.unflatten_dict(start, sep="/")}, x)
    np.testing.assert_allclose(got, model.apply({"params": params}, x), rtol=0, atol=1e-5)


def test_a_tower_traces_with_cudnns_fused_attention():
    """RoPE turns queries and keys before any attention choice: the DINOv3-like tower on
    NaFlex patches traces through JAX's cuDNN attention (the platform and cuDNN's version
    check stubbed, as tests/test_attention.py does for the adapter) to XLA's shape."""
    from unittest import mock  # noqa: PLC0415

    fused = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    model = get_model("testing", 7, dtype="bfloat16", posemb_grid=(4, 4), **DINOV3)
    params = tower_params(model.clone(dtype="float32", posemb_grid=None))
    patches = naflex.patchify(np.asarray(images(32, n=2)), 8, seq_len=20)
    step = jax.jit(model.clone(attention="cudnn").apply)
    gpu = mock.patch.object(attention, "target", lambda: ("gpu", "NVIDIA H200"))
    with gpu, mock.patch.object(fused, "check_cudnn_version", lambda *a, **k: None):
        out = jax.eval_shape(step, {"params": params}, patches)
    want = jax.eval_shape(jax.jit(model.clone(attention="xla").apply), {"params": params}, patches)
    assert (out.shape, out.dtype) == (want.shape, want.dtype) == ((2, 7), jax.numpy.float32)
