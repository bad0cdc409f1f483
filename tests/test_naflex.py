"""NaFlex input (models/naflex.py): an image given as patches with their coordinates is the
same function as the image path at the position table's own grid; padding, whatever it
holds, changes nothing and learns nothing; every attention choice masks it; the position
resize has jax.image.scale_and_translate's numerics (big_vision's `_pos_emb_resize`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import apply_with_intermediates, get_model, naflex

SIZES = dict(width=32, depth=2, num_heads=4, mlp_dim=64, patch_size=4)


def model_and_params(seed: int = 0, **fields):
    """A small ViT on 16 x 16 px (a 4 x 4 grid), its parameters made unlike an init's."""
    model = get_model(None, 5, **{**SIZES, **fields})
    x = jnp.zeros((1, 16, 16, 3))
    params = model.init(jax.random.key(seed), x)["params"]
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    noisy = [a + 0.2 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)]
    return model, jax.tree.unflatten(tree, noisy)


def images(b: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, (b, h, w, 3)).astype(np.float32)


def mixed(*batches: dict) -> dict:
    """One NaFlex batch of the rows of several (one N)."""
    return {k: np.concatenate([b[k] for b in batches]) for k in naflex.KEYS}


@pytest.mark.parametrize("classifier", ["token", "gap", "map"])
@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("posemb", ["learned", "learned_2d", "sincos_2d"])
def test_at_the_tables_own_grid_patches_give_the_image_paths_logits(classifier, scan, posemb):
    model, params = model_and_params(classifier=classifier, scan=scan, posemb=posemb)
    x = images(2, 16, 16)
    want = model.apply({"params": params}, x)
    for seq_len in (16, 21):  # no padding; five pads a row
        got = model.apply({"params": params}, naflex.patchify(x, 4, seq_len))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert float(jnp.abs(want).max()) > 0.1  # a function of the input, not a zero head


def test_each_row_is_its_own_image_at_its_own_shape():
    """Three grids in one batch (tall, wide, small): each row's logits are those of its image
    alone; with sin-cos embeddings (computed at the coordinates, nothing resized) they are
    also the image path's at that image's size."""
    model, params = model_and_params(posemb="sincos_2d", classifier="gap")
    shapes = [(24, 8), (8, 24), (8, 8)]
    alone = [images(1, h, w, seed=i) for i, (h, w) in enumerate(shapes)]
    batch = mixed(*(naflex.patchify(x, 4, 12) for x in alone))
    got = model.apply({"params": params}, batch)
    np.testing.assert_array_equal(naflex.grids(batch), [[6, 2], [2, 6], [2, 2]])
    for row, x in enumerate(alone):
        np.testing.assert_allclose(got[row], model.apply({"params": params}, x)[0], atol=1e-5)


@pytest.mark.parametrize("classifier", ["token", "gap", "map"])
def test_what_padding_holds_changes_no_logit_and_padding_gets_no_gradient(classifier):
    model, params = model_and_params(classifier=classifier)
    x = mixed(naflex.patchify(images(1, 12, 8), 4, 10), naflex.patchify(images(1, 8, 8), 4, 10))
    assert not x["valid"].all()
    loss = lambda patches: jnp.sum(
        jnp.sin(model.apply({"params": params}, {**x, "patches": patches}))
    )
    want, grads = jax.value_and_grad(loss)(x["patches"])
    for fill in (1e30, np.nan, np.inf, -np.inf):
        poisoned = np.where(x["valid"][..., None], x["patches"], np.float32(fill))
        coords = np.where(x["valid"][..., None], x["coords"], 7)  # off every grid: ignored
        out = model.apply({"params": params}, {**x, "patches": poisoned, "coords": coords})
        np.testing.assert_array_equal(out, model.apply({"params": params}, x))  # bit for bit
        np.testing.assert_array_equal(jax.grad(loss)(poisoned), grads)
    pads = ~x["valid"]
    assert np.all(grads[pads] == 0) and np.abs(grads[~pads]).max() > 1e-4
    assert np.isfinite(want)


def test_splash_agrees_with_xla_with_padding():
    """Pallas' interpret mode on this CPU: padding set apart by segment ids, on top of the
    kernel's own padding to 128."""
    model, params = model_and_params(attention="xla", patch_size=2)
    x = mixed(naflex.patchify(images(1, 20, 12), 2, 70), naflex.patchify(images(1, 14, 14), 2, 70))
    loss = lambda m: jax.value_and_grad(
        lambda p: jnp.mean(jnp.sin(m.apply({"params": p}, x))), allow_int=True
    )
    (a, ga), (b, gb) = loss(model)(params), loss(model.clone(attention="splash"))(params)
    np.testing.assert_allclose(b, a, atol=1e-6)
    for (path, g), want in zip(jax.tree_util.tree_leaves_with_path(gb), jax.tree.leaves(ga)):
        np.testing.assert_allclose(g, want, atol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_cudnn_is_refused_on_a_cpu_as_for_images():
    model, params = model_and_params(dtype="bfloat16")
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        model.clone(attention="cudnn").apply(
            {"params": params}, naflex.patchify(images(1, 16, 16), 4, 20)
        )


def test_the_position_resize_is_the_identity_at_its_grid_and_scale_and_translate_elsewhere():
    table = jax.random.normal(jax.random.key(0), (6, 6, 8))
    y, x = np.mgrid[:6, :6]
    coords = np.stack([y.ravel(), x.ravel()], -1)[None]  # [1, 36, 2]
    same = naflex.table_at(table, jnp.array([[6, 6]]), coords)
    np.testing.assert_array_equal(same[0], table.reshape(36, 8))
    for gh, gw in ((3, 10), (9, 4), (1, 1)):
        y, x = np.mgrid[:gh, :gw]
        coords = np.pad(np.stack([y.ravel(), x.ravel()], -1), ((0, 40 - gh * gw), (0, 0)))[None]
        got = naflex.table_at(table, jnp.array([[gh, gw]]), coords)[0, : gh * gw]
        want = jax.image.scale_and_translate(
            table, (gh, gw, 8), (0, 1), jnp.array([gh / 6, gw / 6]), jnp.zeros(2), "bilinear"
        )  # antialias=True is its default, as big_vision calls it
        np.testing.assert_allclose(got, want.reshape(gh * gw, 8), atol=1e-6)
    axis = naflex.axis_at(table[:, 0], jnp.array([3]), jnp.arange(3)[None])
    want = jax.image.scale_and_translate(table[:, 0], (3, 8), (0,), jnp.array([0.5]),
                                         jnp.zeros(1), "bilinear")  # fmt: skip
    np.testing.assert_allclose(axis[0], want, atol=1e-6)


def test_intermediates_have_the_padded_sequence_and_maps_of_the_map_head():
    model, params = model_and_params(classifier="map")
    x = naflex.patchify(images(2, 8, 12), 4, 9)  # 6 patches, 3 pads
    logits, inter = apply_with_intermediates(model, params, x)
    assert logits.shape == (2, 5) and inter["attention"].shape == (2, 2, 4, 9, 9)
    np.testing.assert_array_equal(inter["attention"][..., 6:], 0)  # no query looks at a pad
    np.testing.assert_allclose(inter["attention"].sum(-1), 1, atol=1e-6)


def test_bad_input_is_named_with_the_way_out():
    model, params = model_and_params()
    x = naflex.patchify(images(1, 8, 8), 4, 6)
    apply = lambda **change: model.apply({"params": params}, {**x, **change})
    with pytest.raises(ValueError, match=r"padding \(valid False\) must come after"):
        apply(valid=x["valid"][:, ::-1])
    with pytest.raises(ValueError, match="reaches rows and columns 0 to 5 at most"):
        apply(coords=x["coords"] + 6)
    with pytest.raises(
        ValueError, match="the model embeds 48 .* patchify with the model's patch size, not 2"
    ):
        apply(patches=x["patches"][..., :12])
    with pytest.raises(ValueError, match="keys"):
        model.apply({"params": params}, {"patches": x["patches"]})
    hybrid = get_model("R50+ViT-B_16", None, resnet_stages=())
    with pytest.raises(ValueError, match="NaFlex input is for plain ViTs"):
        hybrid.init(jax.random.key(0), naflex.patchify(images(1, 32, 32), 16, 4))
    with pytest.raises(ValueError, match="4 patches, more than seq_len=3"):
        naflex.patchify(images(1, 8, 8), 4, 3)


@pytest.mark.parametrize("posemb", ["learned", "learned_2d"])
def test_the_table_is_made_on_the_models_grid_never_the_batchs(posemb):
    """40 patches a row: the table is the model's posemb_grid (3 x 5), whatever the batch's
    length, read resized per image; a model without one refuses to guess it from patches."""
    model = get_model(None, 5, **SIZES, posemb=posemb, posemb_grid=(3, 5))
    x = mixed(naflex.patchify(images(1, 20, 32), 4, 40), naflex.patchify(images(1, 8, 8), 4, 40))
    params = model.init(jax.random.key(0), x)["params"]
    table = params["Transformer"]["posembed_input"]
    shapes = {k: v.shape for k, v in table.items()}
    want = {"learned": {"pos_embedding": (1, 16, 32)}}.get(
        posemb, {"pos_embedding_row": (1, 3, 16), "pos_embedding_col": (1, 5, 16)}
    )
    assert shapes == want
    short = naflex.patchify(images(1, 8, 8), 4, 4)  # 4 patches a row: the same table
    table = model.init(jax.random.key(0), short)["params"]["Transformer"]["posembed_input"]
    assert {k: v.shape for k, v in table.items()} == want
    assert np.isfinite(model.apply({"params": params}, x)).all()
    with pytest.raises(ValueError, match="without posemb_grid: the position table's grid is"):
        get_model(None, 5, **SIZES, posemb=posemb).init(jax.random.key(0), x)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's attention: an NVIDIA GPU only")
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_cudnn_agrees_with_xla_with_padding_on_a_gpu(classifier):
    """Lengths for cuDNN, a dense mask for XLA, in bfloat16; a last row of padding alone."""
    model, params = model_and_params(dtype="bfloat16", classifier=classifier, patch_size=2)
    x = mixed(naflex.patchify(images(2, 20, 12), 2, 70), naflex.patchify(images(1, 14, 14), 2, 70))
    x["valid"][-1] = False
    xla = model.apply({"params": params}, x)
    fused = model.clone(attention="cudnn").apply({"params": params}, x)
    assert np.isfinite(fused).all()
    np.testing.assert_allclose(fused[:2], xla[:2], atol=3e-2)
