"""The one token structure (models/tokens.py) and the position table's grid as a model
attribute: what an image and a NaFlex batch become, and the grid written with the weights
and read back from them, not from a batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import weights
from vit_jax.models import get_model, naflex
from vit_jax.models.tokens import Tokens
from vit_jax.weights.meta import Meta

SIZES = dict(width=32, depth=1, num_heads=4, mlp_dim=64, patch_size=4)


def test_an_image_is_every_token_real_on_a_full_grid():
    x = jnp.arange(2 * 2 * 3 * 5, dtype=jnp.float32).reshape(2, 2, 3, 5)  # [B, gh, gw, D]
    t = Tokens.of_image(x).with_prefix(jnp.ones((2, 1, 5)))
    assert t.full == (2, 3) and t.prefix == 1 and t.mask is None
    np.testing.assert_array_equal(t.x[:, 1:], x.reshape(2, 6, 5))
    np.testing.assert_array_equal(
        t.coords[0], [[0, 0], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    )
    np.testing.assert_array_equal(t.grids, [[2, 3], [2, 3]])


def test_naflex_patches_are_masked_with_the_prefix_real_and_padding_last():
    images = np.random.RandomState(0).uniform(-1, 1, (1, 8, 12, 3)).astype(np.float32)
    b = naflex.patchify(images, 4, 9)  # a 2 x 3 grid and 3 pads
    t = Tokens.of_patches(jnp.zeros((1, 9, 5)), b["coords"], b["valid"]).with_prefix(
        jnp.ones((1, 1, 5))
    )
    assert t.full is None and t.prefix == 1
    np.testing.assert_array_equal(t.mask.valid[0], [1] * 7 + [0] * 3)
    assert bool(t.mask.padding_last)
    np.testing.assert_array_equal(t.grids, [[2, 3]])
    gap = dict(b, valid=np.array([[1, 1, 0, 1, 1, 1, 1, 0, 0]], bool))
    assert not bool(
        Tokens.of_patches(jnp.zeros((1, 9, 5)), gap["coords"], gap["valid"]).mask.padding_last
    )


@pytest.mark.parametrize("posemb", ["learned", "learned_2d"])
def test_a_grid_that_is_not_square_is_written_with_the_weights_and_read_back(tmp_path, posemb):
    """A table on 3 x 5 patches: its rows cannot tell the grid, the file's record does;
    the loaded model computes as the saved one, on images and on NaFlex patches."""
    model = get_model(None, 5, **SIZES, posemb=posemb, posemb_grid=(3, 5))
    x = np.random.RandomState(1).uniform(-1, 1, (2, 12, 20, 3)).astype(np.float32)
    params = model.init(jax.random.key(0), x)["params"]
    params["head"]["kernel"] = jax.random.normal(jax.random.key(1), params["head"]["kernel"].shape)
    path = tmp_path / "grid.npz"
    weights.save_npz(path, params, Meta.of_model(model))
    assert Meta.of_model(model).posemb_grid == (3, 5)
    loaded = weights.load(path)
    assert loaded.model.posemb_grid == (3, 5) and loaded.image_size == (12, 20)
    want = model.apply({"params": params}, x)
    np.testing.assert_array_equal(loaded.model.apply({"params": loaded.params}, x), want)
    patches = naflex.patchify(x, 4, 20)
    np.testing.assert_allclose(
        loaded.model.apply({"params": loaded.params}, patches), want, atol=1e-5
    )
    with pytest.raises(ValueError, match="these images make a 3x4 grid of patches; the model.s"):
        model.apply({"params": params}, x[:, :16, :16])
    square = get_model(None, 5, **SIZES, posemb=posemb, posemb_grid=(4, 4))
    assert Meta.of_model(square).posemb_grid is None  # the table's rows tell it: nothing written


def test_a_model_converted_at_a_size_that_is_not_square_loads_at_it(tmp_path):
    """convert.write of a model built without posemb_grid records the grid of the size it
    writes at, so the file loads there without naming the size."""
    from vit_jax.weights import convert

    model = get_model("testing", 3, patch_size=8)
    params = model.init(jax.random.key(0), jnp.zeros((1, 32, 48, 3)))["params"]
    convert.write(params, model, (32, 48), "npz", tmp_path / "x.npz")
    loaded = weights.load(tmp_path / "x.npz")
    assert loaded.model.posemb_grid == (4, 6) and loaded.image_size == (32, 48)
