"""Looking inside a model fed NaFlex batches (vit_jax/inspection/ on models/naflex.py's
input): attention distance, rollout and relevance maps come back on each image's own grid,
padding in none of them, and equal the image path's where the two are the same function;
a `map` model's maps read its head's attention as the final row. Expected values are
computed independently here (NumPy loops over the intermediates)."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
from helpers import images, random_params

from vit_jax import inspection
from vit_jax.inspection import attention, report
from vit_jax.inspection.relevance import HEAD, attention_of, relevance
from vit_jax.models import get_model, naflex

SIZES = dict(width=32, depth=2, num_heads=4, mlp_dim=64, patch_size=4)


def model_and_params(seed: int = 0, **fields):
    """A small ViT with random weights at 16 px (a 4 x 4 position table)."""
    model = get_model(None, 5, **{**SIZES, **fields})
    return model, random_params(model, 16, seed=seed)


def mixed(*batches: dict) -> dict:
    """One NaFlex batch of the rows of several (one N)."""
    return {k: np.concatenate([b[k] for b in batches]) for k in naflex.KEYS}


def rollout_by_hand(att: np.ndarray) -> np.ndarray:
    """(mean_h A + I), rows renormalised, later layers on the left, in float64.  [L, H, N, N]
    of one image -> [N, N]"""
    r = np.eye(att.shape[-1])
    for a in np.asarray(att, np.float64):
        a = a.mean(0) + np.eye(len(r))
        r = (a / a.sum(-1, keepdims=True)) @ r
    return r


def distance_by_hand(att: np.ndarray, cells: list, stride: int, prefix: int) -> float:
    """Mean over the image's patch queries of sum_k a[q, k] |c_q - c_k| over its patch keys
    (renormalised), by double loop. att [N, N] of one head; cells: the real patches' (row,
    column), in sequence order (padding after them is left out)."""
    n = len(cells)
    a = np.asarray(att, np.float64)[prefix : prefix + n, prefix : prefix + n]
    total = 0.0
    for q, (qy, qx) in enumerate(cells):
        row = a[q] / a[q].sum()
        total += sum(
            row[k] * math.hypot(qy - ky, qx - kx) * stride for k, (ky, kx) in enumerate(cells)
        )
    return total / n


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_at_the_tables_grid_the_maps_are_the_image_paths_padded_or_not(classifier):
    """A NaFlex batch at the table's own 4 x 4 grid is the image path's function: its
    distance, rollout and relevance maps are the image path's, without padding and with 9
    pads a row (none of them in the maps: each is 4 x 4)."""
    model, params = model_and_params(classifier=classifier)
    x = images(16, n=2)
    distance, maps = inspection.analyse_images(model, params, x)  # [L, B, H], [B, 4, 4]
    rel = relevance(model, params, x, [1, 3])  # [B, 2, 4, 4]
    for seq_len in (16, 25):
        flex = naflex.patchify(x, 4, seq_len)
        got_distance, got_maps = inspection.analyse_images(model, params, flex)
        got_rel = relevance(model, params, flex, [1, 3])
        assert [m.shape for m in got_maps] == [(4, 4)] * 2
        assert [r.shape for r in got_rel] == [(2, 4, 4)] * 2
        np.testing.assert_allclose(got_distance, distance, rtol=1e-5)
        np.testing.assert_allclose(np.stack(got_maps), maps, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(np.stack(got_rel), rel, rtol=1e-4, atol=1e-6 * abs(rel).max())
    assert maps.std() > 1e-4 and distance.min() > 0  # a function of the image, not flat


@pytest.mark.parametrize("classifier", ["token", "gap", "map"])
def test_a_mixed_batch_gives_each_image_its_own_grid_and_the_image_paths_maps(classifier):
    """Tall, wide and small images padded to 12 patches in one batch: each image's rollout
    and relevance maps are gh x gw and equal the image path's for that image alone (sin-cos
    embeddings: nothing is resized, so the two paths are one function at any shape), and
    its mean attention distance is the double loop's over its own patches."""
    model, params = model_and_params(classifier=classifier, posemb="sincos_2d")
    shapes = [(24, 8), (8, 24), (8, 8)]
    alone = [images((h, w), n=1, seed=i) for i, (h, w) in enumerate(shapes)]
    x = mixed(*(naflex.patchify(a, 4, 12) for a in alone))
    distance, maps = inspection.analyse_images(model, params, x, batch_size=2)
    rel = relevance(model, params, x, [[0], [2], [4]], batch_size=2)
    assert [m.shape for m in maps] == [(6, 2), (2, 6), (2, 2)]
    att = np.asarray(jax.jit(lambda p, x: attention_of(model, p, x)[0])(params, x))
    prefix = int(model.has_class_token)
    for b, (a, (h, w)) in enumerate(zip(alone, shapes, strict=True)):
        d, m = inspection.analyse_images(model, params, a)
        np.testing.assert_allclose(maps[b], m[0], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(distance[:, b], d[:, 0], rtol=1e-4)
        want = relevance(model, params, a, [[0, 2, 4][b]])[0]
        np.testing.assert_allclose(rel[b], want, rtol=1e-4, atol=1e-6 * abs(want).max())
        if prefix:  # each layer's and head's class-token attention: [L, H, gh, gw]
            own = np.asarray(jax.jit(lambda p, a: attention_of(model, p, a)[0])(params, a))
            cut = attention.on_grids(att[:, :, :, 0, 1:].transpose(1, 0, 2, 3), x)[b]
            want = own[:, 0, :, 0, 1:].reshape(2, 4, h // 4, w // 4)
            np.testing.assert_allclose(cut, want, rtol=1e-4, atol=1e-7)
        cells = [(i, j) for i in range(h // 4) for j in range(w // 4)]
        by_hand = distance_by_hand(att[1, b, 2], cells, 4, prefix)  # layer 1, head 2
        assert distance[1, b, 2] == pytest.approx(by_hand, rel=1e-5)


def test_a_map_models_rollout_is_its_heads_row_times_the_rollout_by_hand():
    """classifier='map': the map is the MAP head's attention over the tokens, mean over
    heads, times the blocks' rollout, read from the intermediates by hand; padding neither
    changes it nor appears in it. A 'gap' model's is the mean of its real patches' rows."""
    model, params = model_and_params(classifier="map", seed=3)
    x = mixed(naflex.patchify(images((12, 8), n=1), 4, 9), naflex.patchify(images(8, n=1), 4, 9))
    _, maps = inspection.analyse_images(model, params, x)
    _, state = jax.jit(lambda p, x: model.apply({"params": p}, x, mutable=["intermediates"]))(
        params, x
    )
    inter = state["intermediates"]
    blocks = [inter["Transformer"][f"encoderblock_{i}"] for i in range(2)]
    att = np.stack([b["MultiHeadDotProductAttention_1"]["attention"][0] for b in blocks])
    head = np.asarray(inter[HEAD[0]][HEAD[1]]["attention"][0], np.float64)  # [B, H, 1, N]
    for b, n in enumerate([6, 4]):  # real patches: 3 x 2 and 2 x 2
        r = rollout_by_hand(att[:, b, :, :n, :n])
        want = head[b, :, 0, :n].mean(0) @ r
        np.testing.assert_allclose(maps[b].ravel(), want, rtol=1e-5)
        np.testing.assert_allclose(head[b, :, 0, n:], 0)  # pads: no weight
    gap, gap_params = model_and_params(classifier="gap", seed=3)
    _, gap_maps = inspection.analyse_images(gap, gap_params, x)
    att = np.asarray(jax.jit(lambda p, x: attention_of(gap, p, x)[0])(gap_params, x))
    for b, n in enumerate([6, 4]):
        want = rollout_by_hand(att[:, b, :, :n, :n]).mean(0)
        np.testing.assert_allclose(gap_maps[b].ravel(), want, rtol=1e-5)


def test_a_map_models_relevance_weights_its_heads_row_as_every_layer():
    """classifier='map' relevance: R = I, R <- R + mean_h (∇A ⊙ A)⁺ R over the blocks, then
    the head's mean_h (∇A ⊙ A)⁺ row times R, with the gradients of the class's logit taken
    here by jax.grad through the 'perturbations' and the rule applied in NumPy."""
    model, params = model_and_params(classifier="map", seed=4)
    x = naflex.patchify(images((8, 12), n=1), 4, 8)  # 6 patches, 2 pads
    got = relevance(model, params, x, [2])[0][0]  # [2, 3]
    made = lambda x: model.apply({"params": params}, x, mutable=["perturbations"])[1]
    shapes = jax.eval_shape(made, x)["perturbations"]
    zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)

    def logit(pert):
        out, state = model.apply(
            {"params": params, "perturbations": pert}, x, mutable=["intermediates"]
        )
        return out[0, 2], state["intermediates"]

    grads, inter = jax.jit(jax.grad(logit, has_aux=True))(zeros)
    bar = lambda a, g: np.maximum(np.asarray(a, np.float64) * g, 0).mean(axis=(0, 1))[..., :6, :6]
    r = np.eye(6)
    for i in range(2):
        block, grad = inter["Transformer"][f"encoderblock_{i}"], grads["Transformer"]
        a = block["MultiHeadDotProductAttention_1"]["attention"][0]
        g = grad[f"encoderblock_{i}"]["MultiHeadDotProductAttention_1"]["probabilities"]
        r = r + bar(a, g) @ r
    row = bar(inter[HEAD[0]][HEAD[1]]["attention"][0], grads[HEAD[0]][HEAD[1]]["probabilities"])
    np.testing.assert_allclose(got.ravel(), row[0] @ r, rtol=1e-4, atol=1e-7)
    assert got.max() > 0


def test_on_grids_places_each_value_at_its_coordinates():
    """Values of patches in any order land at their (row, column); the padding's nowhere;
    leading axes kept ([B, K, n] -> [K, gh, gw] each)."""
    coords = np.array(
        [[[1, 0], [0, 1], [0, 0], [1, 1], [0, 0]], [[0, 2], [0, 0], [0, 1], [0, 0], [0, 0]]]
    )
    x = {"coords": coords, "valid": np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)}
    values = np.arange(20.0).reshape(2, 2, 5)  # [B, K, n]
    got = attention.on_grids(values, x)
    np.testing.assert_array_equal(got[0], [[[2, 1], [0, 3]], [[7, 6], [5, 8]]])
    np.testing.assert_array_equal(got[1], [[[11, 12, 10]], [[16, 17, 15]]])
    np.testing.assert_array_equal(attention.on_grids(values, (1, 5)), values.reshape(2, 2, 1, 5))


def test_compute_and_write_a_naflex_batch(tmp_path):
    """report.compute and write take a NaFlex batch: the rollout per image at its own grid,
    saved as rollout/0, rollout/1 and drawn over the images `naflex_images` rebuilds (the
    patched images exactly); the similarity of the stored 4 x 4 table; relevance alike."""
    model, params = model_and_params()
    alone = [images((12, 8), n=1, seed=5), images((8, 16), n=1, seed=6)]
    x = mixed(*(naflex.patchify(a, 4, 10) for a in alone))
    result = report.compute(model, params, x, num_components=4)
    report.explain(result, model, params, x, classes=["1"])
    pictures = report.naflex_images(x, 4)
    for got, want in zip(pictures, alone, strict=True):
        np.testing.assert_array_equal(got, want[0])
    assert result.arrays["posemb_similarity"].shape == (4, 4, 4, 4)
    assert result.info["grid"] == [[3, 2], [2, 4]] and result.info["num_images"] == 2
    assert result.info["image_size"] == [[12, 8], [8, 16]]
    pytest.importorskip("matplotlib")
    written = report.write(result, pictures, str(tmp_path), "naflex")
    saved = np.load(tmp_path / "inspect.npz")
    assert saved["rollout/0"].shape == (3, 2) and saved["rollout/1"].shape == (2, 4)
    assert saved["relevance/1"].shape == (1, 2, 4)
    np.testing.assert_array_equal(saved["rollout/1"], result.arrays["rollout"][1])
    assert "rollout" not in saved.files and str(tmp_path / "relevance.png") in written
    assert json.load(open(tmp_path / "inspect.json"))["grid"] == [[3, 2], [2, 4]]
