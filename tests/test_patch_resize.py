"""FlexiViT patch resize: the pseudo-inverse kernel, and a checkpoint at any patch size."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from format_helpers import TINY, make
from helpers import images, initial_params, logits, run_command
from PIL import Image

from vit_jax import infer, weights
from vit_jax.models import get_model
from vit_jax.models.patch_resize import resample_kernel, resize_matrix, resize_matrix_1d
from vit_jax.models.vit import PatchEmbedding
from vit_jax.training import state


@pytest.mark.parametrize("old, new", [(8, 16), (16, 8), (4, 6), (7, 3)])
def test_resize_matrix_is_jax_bilinear(old, new):
    basis = np.eye(old * old).reshape(old * old, old, old)
    resized = jax.image.resize(basis, (old * old, new, new), "bilinear", antialias=False)
    want = np.asarray(resized).reshape(old * old, new * new).T
    np.testing.assert_allclose(resize_matrix(old, new), want, atol=1e-6)


def linear_by_hand(old, new):
    """The resize matrix as vit_jax computed it before jax.image.resize: weights from
    half-pixel centres, clamped at the edges."""
    m = np.zeros((new, old))
    for i in range(new):
        src = (i + 0.5) * old / new - 0.5
        lo = int(np.floor(src))
        t = src - lo
        for j, w in ((lo, 1.0 - t), (lo + 1, t)):
            m[i, min(max(j, 0), old - 1)] += w
    return m


def test_resize_matrix_1d_equals_the_old_one():
    for old in (1, 2, 5, 7, 8, 14, 16, 19):  # each pair compiles: a sample, odd and even,
        for new in (1, 3, 8, 16, 24):  # shrinking, equal and growing
            got = resize_matrix_1d(old, new)
            assert got.dtype == np.float64 and got.shape == (new, old)
            np.testing.assert_allclose(got, linear_by_hand(old, new), rtol=0, atol=1e-14)
    np.testing.assert_array_equal(
        resize_matrix_1d(2, 4), [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]]
    )


def resize_patches(x, p, q):
    """Each p x p patch of x [B, H, W, C] resized to q x q (bilinear): [B, H*q/p, W*q/p, C]."""
    b, h, w, c = x.shape
    patches = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    up = jax.image.resize(patches, (b, h // p, w // p, q, q, c), "bilinear", antialias=False)
    return np.asarray(up).transpose(0, 1, 3, 2, 4, 5).reshape(b, h // p * q, w // p * q, c)


def tokens(kernel, bias, x):
    p, _, _, d = kernel.shape
    embed = PatchEmbedding(d, p)
    return np.asarray(embed.apply({"params": {"kernel": kernel, "bias": bias}}, jnp.asarray(x)))


@pytest.mark.parametrize("old, new", [(8, 16), (8, 24), (4, 7)])
def test_upsampled_patches_give_the_same_tokens(old, new):
    rng = np.random.default_rng(0)
    kernel = rng.normal(0, 0.1, (old, old, 3, 16)).astype(np.float32)
    bias = rng.normal(0, 0.1, (16,)).astype(np.float32)
    x = images(old * 4)  # a 4 x 4 grid of patches
    up = resize_patches(x, old, new)
    got = tokens(resample_kernel(kernel, new), bias, up)
    np.testing.assert_allclose(got, tokens(kernel, bias, x), atol=1e-4)


@pytest.mark.parametrize("old, new", [(16, 8), (8, 5)])
def test_downsampling_is_the_least_squares_optimum(old, new):
    rng = np.random.default_rng(1)
    w = rng.normal(0, 1, (old, old, 1, 1))
    got = resample_kernel(w, new).reshape(-1)
    bt = resize_matrix(old, new).T  # [old^2, new^2]: <B x, w'> = <x, B^T w'>
    best = np.linalg.lstsq(bt, w.reshape(-1), rcond=None)[0]
    np.testing.assert_allclose(got, best, atol=1e-8)
    residual = lambda v: np.linalg.norm(bt @ v - w.reshape(-1))
    np.testing.assert_allclose(bt.T @ (bt @ got - w.reshape(-1)), 0, atol=1e-8)  # normal eqs
    for _ in range(5):  # no other kernel explains the original tokens better
        assert residual(got) <= residual(got + 1e-3 * rng.normal(size=got.shape))


def test_checkpoint_at_twice_the_patch_size(tmp_path):
    model, params, size = make(TINY)  # patch 8 at 32: a 4 x 4 grid
    path = tmp_path / "p8.npz"
    weights.save_npz(path, params)
    big = model.clone(patch_size=16)
    got = weights.load_pretrained(path, big, 64, reset_head=False, patch_size=16)
    x = images(size)
    np.testing.assert_allclose(
        logits(big, got, resize_patches(x, 8, 16)), logits(model, params, x), atol=1e-4
    )
    m, p, s = weights.load_model(path, patch_size=16)  # the grid of the file is kept
    assert (m.patch_size, s) == (16, (64, 64))
    assert p["embedding"]["kernel"].shape == (16, 16, 3, 32)
    m, p, s = weights.load_model(path, patch_size=4, image_size=48)  # new grid: 12 x 12
    assert p["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 145, 32)
    with pytest.raises(ValueError, match="patch_size=16 but the model's is 8"):
        weights.load_pretrained(path, model, 32, patch_size=16)


def test_fine_tuning_init_from_resamples(tmp_path):
    model, params, _ = make(TINY)
    weights.save_npz(tmp_path / "p8.npz", params)
    config = ml_collections.ConfigDict({"model": {"name": "testing", "patch_size": 4}})
    new = state.build_model(config.model, 3)
    assert new.patch_size == 4 and new == get_model("testing", 3, patch_size=4)
    start = state.Start(seed=0, image_size=32, init_from=str(tmp_path / "p8.npz"), patch_size=4)
    got = initial_params(start, new, 32)
    assert got["embedding"]["kernel"].shape == (4, 4, 3, 32)
    assert got["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 65, 32)


def test_infer_command_at_patch_16_gives_the_patch_8_models_output(tmp_path, capsys):
    """FlexiViT's exact case: upsampled 8 -> 16, a kernel sees each 16x16 patch resized from
    its 8x8 original as the old kernel saw the original. The command run at --patch_size=16
    on a 64 px image built that way prints the probabilities of the untouched patch-8 model
    on the 32 px original (no resampling code involved in the expected values)."""
    model, params, _ = make(TINY, num_classes=10)
    weights.save_npz(tmp_path / "p8.npz", params)
    # Multiples of 16: each output pixel of a 2x bilinear resize (weights 9/16, 3/16, 3/16,
    # 1/16 in the middle, fewer at the edges) is an integer: the PNG holds it exactly.
    small = np.random.default_rng(0).integers(0, 16, (32, 32, 3)) * 16.0  # [32, 32, 3]
    patches = small.reshape(4, 8, 4, 8, 3).transpose(0, 2, 1, 3, 4)  # [4, 4, 8, 8, 3]
    resized = jax.image.resize(patches, (4, 4, 16, 16, 3), "bilinear", antialias=False)
    big = np.asarray(resized, np.float64).transpose(0, 2, 1, 3, 4).reshape(64, 64, 3)
    assert np.abs(big - np.round(big)).max() < 1e-4
    Image.fromarray(np.round(big).astype(np.uint8)).save(tmp_path / "x.png")
    want = jax.nn.softmax(logits(model, params, small[None].astype(np.float32) / 127.5 - 1))[0]
    args = [f"--checkpoint={tmp_path / 'p8.npz'}", f"--image={tmp_path / 'x.png'}"]
    assert run_command(infer, *args, "--patch_size=16", "--top_k=10") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(tmp_path / "x.png")
    rows = [re.fullmatch(r"\s*\d+\. class (\d+)\s+([\d.]+)%", r) for r in out.splitlines()[1:11]]
    got = {int(m[1]): float(m[2]) / 100 for m in rows}
    assert list(got) == list(np.argsort(-np.asarray(want), kind="stable"))
    np.testing.assert_allclose([got[k] for k in range(10)], want, atol=6e-5)
    assert np.abs(np.asarray(want) - 0.1).max() > 0.01  # not a flat output
