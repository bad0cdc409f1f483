"""Tests of vit_jax.infer: image loading, class names, top-k, end to end."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vit_jax import infer


def _have_model_and_checkpoint() -> bool:
    """True once vit_jax.models.get_model and vit_jax.checkpoint exist."""
    try:
        if importlib.util.find_spec("vit_jax.checkpoint") is None:
            return False
        return hasattr(importlib.import_module("vit_jax.models"), "get_model")
    except ImportError:
        return False


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_model = pytest.mark.skipif(
    not _have_model_and_checkpoint(),
    reason="needs vit_jax.models.get_model and vit_jax.checkpoint",
)


def _write(tmp_path, name, mode, size, color, **save_kwargs):
    path = tmp_path / name
    Image.new(mode, size, color).save(path, **save_kwargs)
    return str(path)


# ---------------------------------------------------------------- load_images


def test_load_images_grayscale_rgba_jpeg(tmp_path):
    gray = tmp_path / "gray.png"
    ramp = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (48, 1))  # 48 x 64, 0..252
    Image.fromarray(ramp, mode="L").save(gray)
    rgba = _write(tmp_path, "rgba.png", "RGBA", (20, 30), (255, 0, 0, 255))
    jpeg = _write(tmp_path, "rgb.jpg", "RGB", (50, 40), (0, 0, 255), quality=100)

    images = infer.load_images([str(gray), rgba, jpeg], (16, 24))

    assert images.shape == (3, 16, 24, 3)
    assert images.dtype == np.float32
    assert images.min() >= -1.0 and images.max() <= 1.0
    # Grayscale: three equal channels, left dark to right bright.
    np.testing.assert_array_equal(images[0, ..., 0], images[0, ..., 1])
    np.testing.assert_array_equal(images[0, ..., 0], images[0, ..., 2])
    assert images[0, 0, 0, 0] < -0.9 and images[0, 0, -1, 0] > 0.9
    # Opaque red RGBA: exactly (1, -1, -1).
    np.testing.assert_allclose(images[1], np.broadcast_to([1.0, -1.0, -1.0], (16, 24, 3)))
    # Blue JPEG (lossy): close to (-1, -1, 1).
    np.testing.assert_allclose(
        images[2], np.broadcast_to([-1.0, -1.0, 1.0], (16, 24, 3)), atol=0.05
    )


def test_load_images_white_and_black(tmp_path):
    white = _write(tmp_path, "white.png", "RGB", (7, 9), (255, 255, 255))
    black = _write(tmp_path, "black.jpg", "RGB", (40, 10), (0, 0, 0))
    images = infer.load_images([white, black], (8, 8))
    np.testing.assert_array_equal(images[0], np.ones((8, 8, 3), np.float32))
    np.testing.assert_array_equal(images[1], -np.ones((8, 8, 3), np.float32))


def test_load_images_transparent_goes_on_white(tmp_path):
    clear = _write(tmp_path, "clear.png", "RGBA", (10, 10), (0, 0, 0, 0))
    half = _write(tmp_path, "half.png", "LA", (10, 10), (0, 128))
    images = infer.load_images([clear, half], (4, 4))
    np.testing.assert_array_equal(images[0], np.ones((4, 4, 3), np.float32))
    # Black at alpha 128/255 over white: 255 * (1 - 128/255) = 127 -> about 0.
    np.testing.assert_allclose(images[1], 0.0, atol=0.01)


def test_load_images_palette_and_cmyk(tmp_path):
    palette = tmp_path / "palette.png"
    Image.new("RGB", (6, 6), (0, 255, 0)).convert("P").save(palette)
    cmyk = _write(tmp_path, "cmyk.jpg", "CMYK", (6, 6), (0, 0, 0, 0), quality=100)
    images = infer.load_images([str(palette), cmyk], (3, 3))
    np.testing.assert_allclose(images[0], np.broadcast_to([-1.0, 1.0, -1.0], (3, 3, 3)))
    np.testing.assert_allclose(images[1], 1.0, atol=0.02)  # no ink = white


def test_load_images_bilinear_resize_keeps_mean(tmp_path):
    path = tmp_path / "checker.png"
    checker = (np.indices((64, 64)).sum(0) % 2 * 255).astype(np.uint8)
    Image.fromarray(checker, mode="L").convert("RGB").save(path)
    image = infer.load_images([str(path)], (8, 8))[0]
    np.testing.assert_allclose(image, 0.0, atol=0.02)  # filtered down to mid-gray


def test_missing_image_names_the_path(tmp_path):
    missing = str(tmp_path / "no_such_cat.jpg")
    with pytest.raises(FileNotFoundError, match="no_such_cat.jpg"):
        infer.load_images([missing], (8, 8))
    with pytest.raises(FileNotFoundError, match="no_such_cat.jpg"):
        infer.check_images_exist([missing])


def test_unreadable_image_names_the_path(tmp_path):
    bad = tmp_path / "not_an_image.jpg"
    bad.write_bytes(b"this is not a JPEG")
    with pytest.raises(ValueError, match="not_an_image.jpg"):
        infer.load_images([str(bad)], (8, 8))
    truncated = tmp_path / "truncated.png"
    _write(tmp_path, "whole.png", "RGB", (64, 64), (1, 2, 3))
    truncated.write_bytes((tmp_path / "whole.png").read_bytes()[:60])
    with pytest.raises(ValueError, match="truncated.png"):
        infer.load_images([str(truncated)], (8, 8))


def test_parse_image_size():
    assert infer.parse_image_size(None) is None
    assert infer.parse_image_size(384) == (384, 384)
    assert infer.parse_image_size("224") == (224, 224)
    assert infer.parse_image_size("224,320") == (224, 320)
    assert infer.parse_image_size((32, 48)) == (32, 48)
    with pytest.raises(ValueError):
        infer.parse_image_size("big")
    with pytest.raises(ValueError):
        infer.parse_image_size("0")


# ---------------------------------------------------------------- class names


def test_class_names_imagenet():
    names = infer.class_names(1000)
    assert len(names) == 1000
    assert all(names)
    assert len(set(names)) == 1000
    assert names[0] == "tench"
    assert names[1] == "goldfish"
    assert names[2] == "great white shark"
    assert names[207] == "golden retriever"
    assert names[281] == "tabby"
    assert names[999] == "toilet tissue"


def test_class_names_from_file(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n  bird  \n\n")
    assert infer.class_names(3, str(labels)) == ["cat", "dog", "bird"]


def test_class_names_count_mismatch(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n")
    with pytest.raises(ValueError, match=r"2 lines.*5 classes"):
        infer.class_names(5, str(labels))


def test_class_names_generic():
    assert infer.class_names(3) == ["class 0", "class 1", "class 2"]


# ---------------------------------------------------------------- top_k / predict


def test_top_k_ordering():
    probs = np.array([[0.1, 0.5, 0.15, 0.25], [0.7, 0.05, 0.2, 0.05]], np.float32)
    indices, values = infer.top_k(probs, 3)
    np.testing.assert_array_equal(indices, [[1, 3, 2], [0, 2, 1]])  # tie -> lower index
    np.testing.assert_allclose(values, [[0.5, 0.25, 0.15], [0.7, 0.2, 0.05]])
    indices, values = infer.top_k(probs, 10)  # k > K gives K
    assert indices.shape == (2, 4)


class _LinearModel:
    """Stand-in for a Flax module: logits = mean pixel * w + b."""

    def apply(self, variables, x, train=False):
        assert train is False
        p = variables["params"]
        return x.mean(axis=(1, 2, 3))[:, None] * p["w"] + p["b"]


def test_predict_batches_with_partial_last_batch():
    params = {"w": np.array([1.0, -1.0, 0.0], np.float32), "b": np.zeros(3, np.float32)}
    images = np.linspace(-1, 1, 7, dtype=np.float32)[:, None, None, None] * np.ones((7, 4, 4, 3))
    probs = infer.predict(_LinearModel(), params, images.astype(np.float32), batch_size=3)
    assert probs.shape == (7, 3)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    m = np.linspace(-1, 1, 7)
    logits = np.stack([m, -m, np.zeros_like(m)], axis=1)
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, expected, rtol=1e-5)


def test_format_predictions():
    text = infer.format_predictions(
        ["a.jpg", "b.png"],
        np.array([[1, 0], [0, 1]]),
        np.array([[0.75, 0.25], [0.5, 0.5]]),
        ["cat", "dog"],
    )
    blocks = text.split("\n\n")
    assert blocks[0].splitlines()[0] == "a.jpg"
    assert "dog" in blocks[0].splitlines()[1] and "75.00%" in blocks[0].splitlines()[1]
    assert blocks[1].splitlines()[1].split()[1] == "cat"


# ---------------------------------------------------------------- end to end


def _testing_checkpoint(tmp_path, best_class=207, bias=5.0):
    import jax

    from vit_jax import checkpoint
    from vit_jax.models import get_model

    model = get_model("testing", num_classes=1000)
    params = model.init(jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32), train=False)
    params = jax.tree_util.tree_map(lambda a: np.array(a), params["params"])
    params["head"]["kernel"] = np.zeros_like(params["head"]["kernel"])
    params["head"]["bias"] = np.zeros_like(params["head"]["bias"])
    params["head"]["bias"][best_class] = bias
    path = str(tmp_path / "testing.npz")
    checkpoint.save_npz(path, params)
    return path


@needs_model
def test_run_end_to_end(tmp_path, capsys):
    ckpt = _testing_checkpoint(tmp_path)
    cat = _write(tmp_path, "cat.jpg", "RGB", (50, 40), (200, 120, 40))
    dog = _write(tmp_path, "dog.png", "L", (20, 64), 90)

    results = infer.run("testing", ckpt, [cat, dog], k=3, batch_size=1)

    # Zero head kernel: logits are the bias, so p(207) = e^5 / (e^5 + 999).
    expected = np.exp(5.0) / (np.exp(5.0) + 999)
    assert len(results) == 2
    for top in results:
        assert len(top) == 3
        assert top[0][0] == "golden retriever"
        assert top[0][1] == pytest.approx(expected, rel=1e-4)
    blocks = capsys.readouterr().out.strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [cat, dog]
    for block in blocks:
        first = block.splitlines()[1]
        assert "golden retriever" in first and "(class 207)" in first
        assert f"{100 * expected:.2f}%" in first


@needs_model
def test_run_other_image_size_and_labels(tmp_path, capsys):
    ckpt = _testing_checkpoint(tmp_path, best_class=3)
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"thing {i}\n" for i in range(1000)))
    img = _write(tmp_path, "x.png", "RGB", (33, 17), (0, 0, 0))
    results = infer.run("testing", ckpt, [img], image_size=48, labels_file=str(labels), k=1)
    assert results[0][0][0] == "thing 3"
    assert "thing 3" in capsys.readouterr().out


@needs_model
def test_run_matches_direct_apply_with_pre_logits(tmp_path, capsys):
    """A file with a representation layer (as ImageNet-21k ones have) keeps it."""
    import jax

    from vit_jax import checkpoint
    from vit_jax.models import get_model

    model = get_model("testing", num_classes=10, representation_size=16)
    params = model.init(jax.random.key(1), np.zeros((1, 32, 32, 3), np.float32), train=False)
    params = jax.tree_util.tree_map(np.array, params["params"])
    assert "pre_logits" in params
    rng = np.random.default_rng(0)
    params["head"]["kernel"] = rng.normal(size=params["head"]["kernel"].shape).astype(np.float32)
    path = str(tmp_path / "rep.npz")
    checkpoint.save_npz(path, params)
    pixels = rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8)
    img = str(tmp_path / "noise.png")
    Image.fromarray(pixels).save(img)

    results = infer.run("testing", path, [img], k=10)

    x = infer.load_images([img], (32, 32))
    expected = np.asarray(jax.nn.softmax(model.apply({"params": params}, x, train=False)))[0]
    got = dict(results[0])
    assert len(got) == 10
    for i in range(10):
        assert got[f"class {i}"] == pytest.approx(float(expected[i]), rel=1e-4, abs=1e-6)
    assert expected.max() - expected.min() > 0.05  # the head is not trivial
    capsys.readouterr()


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "vit_jax.infer", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def test_cli_missing_image_is_a_one_line_error(tmp_path):
    missing = str(tmp_path / "nowhere.jpg")
    proc = _cli(f"--checkpoint={tmp_path / 'unused.npz'}", f"--image={missing}", "--model=testing")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: image not found: {missing}"


@needs_model
def test_cli_end_to_end(tmp_path):
    ckpt = _testing_checkpoint(tmp_path)
    img = _write(tmp_path, "pup.jpg", "RGB", (45, 30), (10, 200, 30))
    proc = _cli("--model=testing", f"--checkpoint={ckpt}", f"--image={img}", "--top_k=2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == img
    assert "golden retriever" in lines[1]
    assert len(lines) == 3


def test_missing_checkpoint_error_from_run(tmp_path):
    img = _write(tmp_path, "x.png", "RGB", (8, 8), (0, 0, 0))
    if not _have_model_and_checkpoint():
        pytest.skip("needs vit_jax.checkpoint")
    with pytest.raises((FileNotFoundError, OSError, ValueError), match="missing.npz"):
        infer.run("testing", str(tmp_path / "missing.npz"), [img])
