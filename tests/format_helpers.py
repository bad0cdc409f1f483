"""Helpers of the format tests: small and published-size models with every parameter random."""

import numpy as np
from helpers import flat, unflat

from vit_jax.models import get_model, param_shapes

TINY = dict(name="testing", overrides=dict(patch_size=8), size=32)  # width 32, 2 blocks
TI16 = dict(name="ViT-Ti_16", overrides={}, size=224)
HYBRID = dict(name="testing", overrides=dict(resnet_stages=(1, 1), patch_size=1, width=64), size=32)


def random_params(model, size, seed=0):
    """Every parameter random (a zero head or class token would hide mistakes), kernels
    scaled by 1/sqrt(fan-in) as in a trained model, so float32 logits are well conditioned."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, s in flat(param_shapes(model, size)).items():
        std = 0.3
        if k.endswith("kernel"):
            qkv = k.endswith(("query/kernel", "key/kernel", "value/kernel"))
            std = 1.0 / np.sqrt(s.shape[0] if qkv else np.prod(s.shape[:-1]))
        v = rng.normal(0.0, std, s.shape)
        if k.endswith("/scale"):
            v = 1.0 + 0.2 * v
        out[k] = v.astype(np.float32)
    return unflat(out)


def make(case, num_classes=7, seed=0):
    """(model, params, size) of a test case."""
    model = get_model(case["name"], num_classes, **case["overrides"])
    return model, random_params(model, case["size"], seed), case["size"]


def assert_bit_exact(a, b):
    fa, fb = flat(a), flat(b)
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert fa[k].dtype == fb[k].dtype, k
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
