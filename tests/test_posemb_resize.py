"""Position tables resized as each tower's source resizes them: PyTorch's bicubic, with
antialias (timm's resample_abs_pos_embed) and without (transformers' Dinov2)."""

from __future__ import annotations

import numpy as np
import pytest

from vit_jax.models.posemb import resize_torch, torch_weights

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize(
    ("old", "new"), [((16, 16), (24, 20)), ((37, 37), (16, 16)), ((4, 6), (9, 3))]
)
def test_resize_torch_is_pytorchs_bicubic(old, new, antialias):
    grid = np.random.default_rng(0).normal(size=(*old, 8)).astype(np.float32)
    x = torch.tensor(grid).permute(2, 0, 1)[None]
    ref = torch.nn.functional.interpolate(x, size=new, mode="bicubic", antialias=antialias)
    ref = ref[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(resize_torch(grid, new, antialias), ref, atol=1e-5, rtol=0)


def test_the_two_bicubics_differ_and_keep_constants():
    """a = -0.75 without antialias, PIL's -0.5 with it: different weights, each row sums to 1."""
    plain, aa = torch_weights(16, 24, False), torch_weights(16, 24, True)
    assert np.abs(plain - aa).max() > 1e-3
    np.testing.assert_allclose(plain.sum(1), 1, atol=1e-12)
    np.testing.assert_allclose(aa.sum(1), 1, atol=1e-12)
