"""Looking inside a ViT: attention distance, rollout, position embeddings, filter PCA,
and the inspect command end to end. Expected values are computed independently here."""

from __future__ import annotations

import json
import math
import os
import sys

import jax
import numpy as np
import pytest
from helpers import python_m, random_params, run_command, write_idx_split
from PIL import Image

from vit_jax import figures, inspection, weights
from vit_jax.data import images as images_lib
from vit_jax.inspection import attention, filters, plots, posemb, report
from vit_jax.models import apply_with_intermediates, get_model


def attention_of(model, params, images):
    """The model's attention probabilities [L, B, H, N, N] (jitted: eager Flax is slow)."""
    fn = jax.jit(lambda p, x: apply_with_intermediates(model, p, x)[1]["attention"])
    return np.asarray(fn(params, images))


def centres(gh, gw, stride):
    """Patch centres in pixels, by a plain loop."""
    return [((i + 0.5) * stride, (j + 0.5) * stride) for i in range(gh) for j in range(gw)]


def brute_force_distance(att, gh, gw, stride, prefix):
    """Mean over patch queries of sum_k a[q, k] * |c_q - c_k| with the prefix dropped and
    the rows renormalised, by double loop over patch centres. att: [N, N]."""
    c = centres(gh, gw, stride)
    a = np.asarray(att, np.float64)[prefix:, prefix:]
    total = 0.0
    for q, (qy, qx) in enumerate(c):
        row = a[q] / a[q].sum()
        total += sum(row[k] * math.hypot(qy - ky, qx - kx) for k, (ky, kx) in enumerate(c))
    return total / len(c)


# ---------------------------------------------------------------- attention distance


def test_attending_to_itself_is_distance_zero():
    for prefix in (0, 1):
        att = np.broadcast_to(np.eye(prefix + 12), (2, 3, 4, prefix + 12, prefix + 12))
        got = attention.mean_attention_distance(att, (3, 4), 16, prefix)
        assert got.shape == (2, 3, 4)
        np.testing.assert_allclose(got, 0.0, atol=1e-6)


@pytest.mark.parametrize("grid,stride,prefix", [((5, 5), 16, 1), ((3, 4), 32, 0), ((1, 1), 8, 1)])
def test_uniform_attention_has_the_analytic_mean_distance(grid, stride, prefix):
    n = prefix + grid[0] * grid[1]
    att = np.full((1, 1, 1, n, n), 1.0 / n)  # uniform over all tokens, class token included
    c = centres(*grid, stride)
    want = sum(math.hypot(qy - ky, qx - kx) for qy, qx in c for ky, kx in c) / len(c) ** 2
    got = float(attention.mean_attention_distance(att, grid, stride, prefix)[0, 0, 0])
    assert got == pytest.approx(want, rel=1e-5)
    if grid == (5, 5):
        assert got == pytest.approx(brute_force_distance(att[0, 0, 0], 5, 5, 16, 1), rel=1e-5)


def test_random_attention_distance_matches_the_double_loop():
    rng = np.random.default_rng(0)
    att = rng.dirichlet(np.ones(13), size=(2, 3, 13))  # [L, H, N, N], 1 class token
    got = attention.mean_attention_distance(att, (3, 4), 16, 1)
    want = [
        [brute_force_distance(att[layer, h], 3, 4, 16, 1) for h in range(3)] for layer in range(2)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="does not fit a 4x4 grid"):
        attention.mean_attention_distance(att, (4, 4), 16, 1)


# ---------------------------------------------------------------- rollout


def test_rollout_of_identities_is_identity_and_rows_sum_to_one():
    eye = np.broadcast_to(np.eye(5), (3, 2, 4, 5, 5))
    np.testing.assert_allclose(
        attention.attention_rollout(eye), np.broadcast_to(np.eye(5), (2, 5, 5))
    )
    rng = np.random.default_rng(1)
    att = rng.dirichlet(np.ones(5), size=(3, 2, 4, 5))  # [L, B, H, N, N]
    rollout = np.asarray(attention.attention_rollout(att))
    np.testing.assert_allclose(rollout.sum(-1), 1.0, rtol=1e-5)
    # By hand: mean over heads, (A + I) / 2, later layers on the left.
    mixed = [(att[layer].mean(1) + np.eye(5)) / 2 for layer in range(3)]  # [B, N, N] each
    want = np.einsum("bij,bjk,bkl->bil", mixed[2], mixed[1], mixed[0])
    np.testing.assert_allclose(rollout, want, rtol=1e-5)


def test_rollout_maps_class_row_or_mean_of_rows():
    rng = np.random.default_rng(2)
    r = rng.uniform(size=(2, 7, 7))
    with_cls = np.asarray(attention.rollout_maps(r, (2, 3), 1))
    np.testing.assert_allclose(with_cls, r[:, 0, 1:].reshape(2, 2, 3), rtol=1e-6)
    gap = np.asarray(attention.rollout_maps(r[:, 1:, 1:], (2, 3), 0))
    np.testing.assert_allclose(gap, r[:, 1:, 1:].mean(1).reshape(2, 2, 3), rtol=1e-6)
    up = attention.upsample(np.ones((1, 2, 3)), (32, 48))
    np.testing.assert_allclose(up, 1.0, rtol=1e-6)


# ---------------------------------------------------------------- position embeddings


def test_cosine_similarity_maps():
    rng = np.random.default_rng(3)
    e = rng.normal(size=(6, 8))
    sim = posemb.cosine_similarity_maps(e, (2, 3))
    assert sim.shape == (2, 3, 2, 3)
    for i in range(2):
        for j in range(3):
            assert sim[i, j, i, j] == pytest.approx(1.0)
    a, b = e[1], e[5]  # positions (0, 1) and (1, 2)
    assert sim[0, 1, 1, 2] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    np.testing.assert_allclose(sim.reshape(6, 6), sim.reshape(6, 6).T)


def test_patch_embeddings_drop_the_class_row_and_build_2d_tables():
    model = get_model("testing", None)
    pe = np.arange(5 * 32, dtype=np.float32).reshape(1, 5, 32)
    params = {"Transformer": {"posembed_input": {"pos_embedding": pe}}}
    np.testing.assert_array_equal(posemb.patch_embeddings(params, model, (2, 2)), pe[0, 1:])
    with pytest.raises(ValueError, match="adapt the parameters"):
        posemb.patch_embeddings(params, model, (3, 3))
    model_2d = get_model("testing", None, posemb="learned_2d")
    row, col = np.ones((1, 2, 16)), 2 * np.ones((1, 3, 16))
    params = {
        "Transformer": {"posembed_input": {"pos_embedding_row": row, "pos_embedding_col": col}}
    }
    got = posemb.patch_embeddings(params, model_2d, (2, 3))
    assert got.shape == (6, 32)
    np.testing.assert_array_equal(got[:, :16], 1.0)
    np.testing.assert_array_equal(got[:, 16:], 2.0)
    with pytest.raises(posemb.NoPositionEmbeddings):
        posemb.patch_embeddings({}, get_model("testing", None, posemb="none"), (2, 2))


# ---------------------------------------------------------------- filter PCA


def test_filter_pca_orthonormal_ordered_and_equal_to_eigh():
    rng = np.random.default_rng(4)
    kernel = rng.normal(size=(4, 4, 3, 60)) * rng.uniform(0.1, 3.0, size=(4, 4, 3, 1))
    pca = filters.filter_pca(kernel, 10)
    c = pca.components.reshape(10, -1).astype(np.float64)
    assert pca.components.shape == (10, 4, 4, 3)
    np.testing.assert_allclose(c @ c.T, np.eye(10), atol=1e-5)
    assert np.all(np.diff(pca.explained_variance) <= 0)
    # Independently: eigenvectors of the filters' covariance matrix.
    x = kernel.reshape(48, 60).T
    values, vectors = np.linalg.eigh(np.cov(x, rowvar=False))
    values, vectors = values[::-1][:10], vectors[:, ::-1][:, :10]
    np.testing.assert_allclose(pca.explained_variance, values, rtol=1e-6)
    np.testing.assert_allclose(np.abs(np.sum(c * vectors.T, axis=1)), 1.0, atol=1e-4)
    np.testing.assert_allclose(
        pca.variance_ratio.sum(), values.sum() / np.trace(np.cov(x.T)), rtol=1e-6
    )
    tiles = filters.to_tiles(pca.components)
    assert tiles.min() == 0.0 and tiles.max() == 1.0
    np.testing.assert_allclose(tiles.reshape(10, -1).min(1), 0.0)
    np.testing.assert_allclose(tiles.reshape(10, -1).max(1), 1.0)


def test_hybrid_skips_the_filters_with_a_message():
    model = get_model("testing", None, resnet_stages=(), patch_size=2)  # root only
    assert model.token_stride == 8
    params = random_params(model, 32)
    images = np.random.default_rng(5).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    result = report.compute(model, params, images)
    assert "filters" in result.skipped
    assert "hybrid" in result.skipped["filters"] and "ResNet" in result.skipped["filters"]
    assert "filters_pca_components" not in result.arrays
    att = attention_of(model, params, images)
    want = [
        [brute_force_distance(att[layer, b, h], 4, 4, 8, 1) for b in range(2) for h in range(2)]
        for layer in range(2)
    ]  # distances in input pixels: stride 8 = 2 x the root's 4
    np.testing.assert_allclose(
        result.arrays["attention_distance_per_image"].reshape(2, 4), want, rtol=1e-4
    )


def test_missing_matplotlib_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[plot\]"):
        plots.pyplot()


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def command_run(tmp_path_factory):
    """`python -m vit_jax.figures` on a random `testing` checkpoint and two images at 64 px."""
    pytest.importorskip("matplotlib")
    tmp_path = tmp_path_factory.mktemp("inspect")
    model = get_model("testing", num_classes=5)
    params = random_params(model, 64)
    ckpt = str(tmp_path / "testing.npz")
    weights.save_npz(ckpt, params)
    rng = np.random.default_rng(6)
    paths = [str(tmp_path / "noise.png"), str(tmp_path / "square.jpg")]
    Image.fromarray(rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)).save(paths[0])
    square = np.zeros((60, 60, 3), np.uint8)
    square[10:40, 20:50] = (200, 60, 30)
    Image.fromarray(square).save(paths[1])
    out = tmp_path / "figures"
    args = ["--model=testing", f"--checkpoint={ckpt}", f"--out={out}"]
    proc = python_m("vit_jax.figures", *args, *[f"--image={p}" for p in paths])
    assert proc.returncode == 0, proc.stderr
    return proc, out, model, params, paths


def test_command_writes_the_figures_and_numbers(command_run):
    proc, out, *_ = command_run
    for key, name in report.PNG.items():
        if key == "relevance":  # only with --relevance (tests/test_relevance.py)
            assert not (out / name).exists()
            continue
        with Image.open(out / name) as png:
            assert png.format == "PNG" and min(png.size) > 200
        assert f"wrote {out / name}" in proc.stdout
    assert f"wrote {out / report.NUMBERS}" in proc.stdout
    summary = json.loads((out / report.SUMMARY).read_text())
    assert summary["grid"] == [4, 4] and summary["token_stride"] == 16
    assert summary["num_images"] == 2 and not summary["skipped"]
    assert summary["images"] == ["noise.png", "square.jpg"]  # the files' names, not 'image 1'
    assert summary["title"] == "testing at 64x64"


def test_rollout_rows_are_labelled_with_the_names(monkeypatch):
    pytest.importorskip("matplotlib")
    figures_drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures_drawn.append(fig))
    x, maps = np.zeros((2, 8, 8, 3)), np.ones((2, 8, 8))
    plots.plot_rollout(x, maps, "unused.png", "t", ["cat.jpg", "dog.png"])
    plots.plot_rollout(x, maps, "unused.png", "t")
    named, default = ([ax.get_ylabel() for ax in fig.axes[:4:2]] for fig in figures_drawn)
    assert named == ["cat.jpg", "dog.png"] and default == ["image 1", "image 2"]


def test_command_numbers_match_a_direct_computation(command_run):
    _, out, model, params, paths = command_run
    numbers = np.load(out / report.NUMBERS)
    summary = json.loads((out / report.SUMMARY).read_text())
    images = images_lib.load_images(paths, (64, 64), "tf_bilinear")  # the npz default
    att = attention_of(model, params, images)
    per_image = [
        [[brute_force_distance(att[layer, b, h], 4, 4, 16, 1) for h in range(2)] for b in range(2)]
        for layer in range(2)
    ]
    want = np.mean(per_image, axis=1)  # [L, H]: mean over the two images
    np.testing.assert_allclose(numbers["attention_distance"], want, rtol=1e-4)
    np.testing.assert_allclose(summary["attention_distance_pixels"], want, atol=1e-3)
    pe = params["Transformer"]["posembed_input"]["pos_embedding"][0, 1:]  # [16, D]
    unit = pe / np.linalg.norm(pe, axis=1, keepdims=True)
    sim = numbers["posemb_similarity"]
    np.testing.assert_allclose(sim.reshape(16, 16), unit @ unit.T, atol=1e-5)
    mixed = (att.mean(2) + np.eye(17)) / 2  # [L, B, N, N]
    flow = np.einsum("bij,bjk->bik", mixed[1], mixed[0])[:, 0, 1:].reshape(2, 4, 4)
    np.testing.assert_allclose(numbers["rollout"], flow, rtol=1e-4)
    x = params["embedding"]["kernel"].reshape(-1, 32).T.astype(np.float64)  # [D, P*P*C]
    values = np.linalg.eigvalsh(np.cov(x, rowvar=False))[::-1][:28]
    np.testing.assert_allclose(numbers["filters_pca_explained_variance"], values, rtol=1e-4)
    assert numbers["filters_pca_components"].shape == (28, 16, 16, 3)


def test_run_without_images_uses_the_first_test_images(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn = {}  # png name -> the figure, as the command drew it
    save = plots._save

    def keep(fig, path):
        drawn[os.path.basename(path)] = (fig.get_suptitle(), [ax.get_ylabel() for ax in fig.axes])
        save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    pytest.importorskip("tensorflow")
    for prefix, n in (("train", 4), ("t10k", 5)):  # test image i is flat grey 40 * i
        flat = np.broadcast_to((40 * np.arange(n))[:, None, None], (n, 8, 8))
        write_idx_split(tmp_path, prefix, flat, np.arange(n) % 2)
    model = get_model("testing", num_classes=5)
    params = random_params(model, 32, seed=1)
    ckpt = str(tmp_path / "t.npz")
    weights.save_npz(ckpt, params)

    sample = inspection.sample_images(3, (32, 32), str(tmp_path))
    np.testing.assert_allclose(
        sample,
        np.broadcast_to(((40 * np.arange(3) - 127.5) / 127.5)[:, None, None, None], (3, 32, 32, 3)),
        atol=1e-6,
    )
    out = tmp_path / "out"
    args = [f"--checkpoint={ckpt}", f"--out={out}", "--num_images=3", f"--data_dir={tmp_path}"]
    assert run_command(figures, *args) == 0
    numbers = np.load(out / report.NUMBERS)
    assert numbers["rollout"].shape == (3, 2, 2)
    summary = json.loads((out / report.SUMMARY).read_text())
    assert summary["num_images"] == 3 and summary["title"] == "t.npz at 32x32"
    assert summary["images"] == ["test image 0", "test image 1", "test image 2"]
    title, labels = drawn[report.PNG["rollout"]]
    assert title == "t.npz at 32x32"  # the checkpoint's file name, not 'model'
    assert labels[:6:2] == summary["images"]  # each row's input image (then a colorbar)
    # Attention distance by the double loop over the model's own attention weights on
    # the three test images (grid 2x2, 16 px per token, one class token).
    att = np.asarray(apply_with_intermediates(model, params, sample)[1]["attention"])
    want = [
        [np.mean([brute_force_distance(att[i, b, h], 2, 2, 16, 1) for b in range(3)])
         for h in range(2)]
        for i in range(2)
    ]  # fmt: skip
    np.testing.assert_allclose(numbers["attention_distance"], want, rtol=1e-5)
    assert np.ptp(numbers["attention_distance"]) > 0.1  # heads differ: not a constant
    assert f"wrote {out / report.NUMBERS}" in capsys.readouterr().out
