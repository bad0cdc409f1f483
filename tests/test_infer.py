"""Reading images (vit_jax.data.images), predictions (models.predict), the classify command."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from helpers import random_params, run_command
from PIL import Image

from vit_jax import infer, weights
from vit_jax.data import images as images_lib
from vit_jax.data import pixels
from vit_jax.models import get_model, predict


def _write(tmp_path, name, mode, size, color, **save_kwargs):
    path = tmp_path / name
    Image.new(mode, size, color).save(path, **save_kwargs)
    return str(path)


# ---------------------------------------------------------------- load_images


@pytest.mark.parametrize("method", pixels.METHODS)
def test_load_images_grayscale_rgba_jpeg(tmp_path, method):
    gray = tmp_path / "gray.png"
    ramp = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (48, 1))  # 48 x 64, 0..252
    Image.fromarray(ramp, mode="L").save(gray)
    rgba = _write(tmp_path, "rgba.png", "RGBA", (20, 30), (255, 0, 0, 255))
    jpeg = _write(tmp_path, "rgb.jpg", "RGB", (50, 40), (0, 0, 255), quality=100)

    images = images_lib.load_images([str(gray), rgba, jpeg], (16, 24), method)

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


@pytest.mark.parametrize("method", pixels.METHODS)
def test_load_images_white_and_black(tmp_path, method):
    white = _write(tmp_path, "white.png", "RGB", (7, 9), (255, 255, 255))
    black = _write(tmp_path, "black.jpg", "RGB", (40, 10), (0, 0, 0))
    images = images_lib.load_images([white, black], (8, 8), method)
    np.testing.assert_array_equal(images[0], np.ones((8, 8, 3), np.float32))
    np.testing.assert_array_equal(images[1], -np.ones((8, 8, 3), np.float32))


@pytest.mark.parametrize("method", pixels.METHODS)
def test_load_images_drop_alpha_as_pil_convert_does(tmp_path, method):
    """Alpha dropped, the colour under it kept (as TensorFlow, timm and transformers'
    pipeline read a file): a fully transparent red pixel is red."""
    clear = _write(tmp_path, "clear.png", "RGBA", (10, 10), (255, 0, 0, 0))
    half = _write(tmp_path, "half.png", "LA", (10, 10), (0, 128))
    palette = tmp_path / "palette.png"  # a palette with a transparent entry
    Image.new("P", (10, 10), 1).save(palette, transparency=1)
    images = images_lib.load_images([clear, half, str(palette)], (4, 4), method)
    np.testing.assert_array_equal(images[0], np.broadcast_to([1.0, -1.0, -1.0], (4, 4, 3)))
    np.testing.assert_array_equal(images[1], -np.ones((4, 4, 3), np.float32))  # black
    want = np.asarray(Image.open(palette).convert("RGB"), np.float32)[:4, :4]
    np.testing.assert_array_equal(images[2], (want - 127.5) / 127.5)


@pytest.mark.parametrize("method", pixels.METHODS)
def test_load_images_palette_and_cmyk(tmp_path, method):
    palette = tmp_path / "palette.png"
    Image.new("RGB", (6, 6), (0, 255, 0)).convert("P").save(palette)
    cmyk = _write(tmp_path, "cmyk.jpg", "CMYK", (6, 6), (0, 0, 0, 0), quality=100)
    images = images_lib.load_images([str(palette), cmyk], (3, 3), method)
    np.testing.assert_allclose(images[0], np.broadcast_to([-1.0, 1.0, -1.0], (3, 3, 3)))
    np.testing.assert_allclose(images[1], 1.0, atol=0.02)  # no ink = white


@pytest.mark.parametrize("method", pixels.METHODS)
def test_load_images_bilinear_resize_keeps_mean(tmp_path, method):
    path = tmp_path / "checker.png"
    checker = (np.indices((64, 64)).sum(0) % 2 * 255).astype(np.uint8)
    Image.fromarray(checker, mode="L").convert("RGB").save(path)
    image = images_lib.load_images([str(path)], (8, 8), method)[0]
    np.testing.assert_allclose(image, 0.0, atol=0.02)  # filtered down to mid-gray


@pytest.mark.parametrize("method", pixels.METHODS)
def test_missing_image_names_the_path(tmp_path, method):
    missing = str(tmp_path / "no_such_cat.jpg")
    with pytest.raises(FileNotFoundError, match="no_such_cat.jpg"):
        images_lib.load_images([missing], (8, 8), method)
    with pytest.raises(FileNotFoundError, match="no_such_cat.jpg"):
        images_lib.check_images_exist([missing])


@pytest.mark.parametrize("method", pixels.METHODS)
def test_unreadable_image_names_the_path(tmp_path, method):
    bad = tmp_path / "not_an_image.jpg"
    bad.write_bytes(b"this is not a JPEG")
    with pytest.raises(ValueError, match="not_an_image.jpg"):
        images_lib.load_images([str(bad)], (8, 8), method)
    truncated = tmp_path / "truncated.png"
    _write(tmp_path, "whole.png", "RGB", (64, 64), (1, 2, 3))
    truncated.write_bytes((tmp_path / "whole.png").read_bytes()[:60])
    with pytest.raises(ValueError, match="truncated.png"):
        images_lib.load_images([str(truncated)], (8, 8), method)


def test_parse_image_size():
    assert images_lib.parse_image_size(None) is None
    assert images_lib.parse_image_size(384) == (384, 384)
    assert images_lib.parse_image_size("224") == (224, 224)
    assert images_lib.parse_image_size("224,320") == (224, 320)
    assert images_lib.parse_image_size((32, 48)) == (32, 48)
    with pytest.raises(ValueError):
        images_lib.parse_image_size("big")
    with pytest.raises(ValueError):
        images_lib.parse_image_size("0")


# ---------------------------------------------------------------- class names


def test_class_names_imagenet():
    names = images_lib.class_names(1000)
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
    assert images_lib.class_names(3, str(labels)) == ["cat", "dog", "bird"]


def test_class_names_count_mismatch(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n")
    with pytest.raises(ValueError, match=r"2 lines.*5 classes"):
        images_lib.class_names(5, str(labels))


def test_class_names_generic():
    assert images_lib.class_names(3) == ["class 0", "class 1", "class 2"]


# ---------------------------------------------------------------- top_k / predict


def test_top_k_ordering():
    probs = np.array([[0.1, 0.5, 0.15, 0.25], [0.7, 0.05, 0.2, 0.05]], np.float32)
    indices, values = predict.top_k(probs, 3)
    np.testing.assert_array_equal(indices, [[1, 3, 2], [0, 2, 1]])  # tie -> lower index
    np.testing.assert_allclose(values, [[0.5, 0.25, 0.15], [0.7, 0.2, 0.05]])
    indices, values = predict.top_k(probs, 10)  # k > K gives K
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
    probs = predict.predict(_LinearModel(), params, images.astype(np.float32), batch_size=3)
    assert probs.shape == (7, 3)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    m = np.linspace(-1, 1, 7)
    logits = np.stack([m, -m, np.zeros_like(m)], axis=1)
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, expected, rtol=1e-5)


def test_format_predictions():
    text = predict.format_predictions(
        ["a.jpg", "b.png"],
        np.array([[1, 0], [0, 1]]),
        np.array([[0.75, 0.25], [0.5, 0.5]]),
        ["cat", "dog"],
    )
    blocks = text.split("\n\n")
    assert blocks[0].splitlines()[0] == "a.jpg"
    assert blocks[0].splitlines()[1] == "   1. dog   75.00%  (class 1)"
    assert blocks[1].splitlines()[1].split()[1] == "cat"
    # Without class names a class is named once, not `class 1  75.00%  (class 1)`.
    generic = predict.format_predictions(
        ["a.jpg"], np.array([[1, 10]]), np.array([[0.75, 0.25]]), images_lib.class_names(11)
    )
    assert generic.splitlines()[1:] == ["   1. class 1    75.00%", "   2. class 10   25.00%"]


# ---------------------------------------------------------------- the command


def _checkpoint(tmp_path, num_classes=1000, **overrides):
    """A random 'testing' model (random head, so every class and image differs; small
    biases, so that the kernels, and with them the image, decide the output)."""
    model = get_model("testing", num_classes, **overrides)
    params = random_params(model, 32, seed=3, scale=0.1)
    path = str(tmp_path / "testing.npz")
    weights.save_npz(path, params)
    return path, model, params


def _blocks(out: str) -> list[tuple[str, list[tuple[str, float]]]]:
    """The command's output -> [(path, [(class name, probability), ...]), ...]."""
    result = []
    for block in out.strip().split("\n\n"):
        first, *rows = block.splitlines()
        matches = [re.fullmatch(r"\s*\d+\. (.*?)\s+([\d.]+)%(  \(class \d+\))?", r) for r in rows]
        result.append((first, [(m[1], float(m[2]) / 100) for m in matches]))
    return result


def _direct(model, params, paths, size):
    x = images_lib.load_images(paths, size, "tf_bilinear")  # the npz default
    return np.asarray(jax.nn.softmax(model.apply({"params": params}, x, train=False)))


@pytest.mark.parametrize("size", [None, 48], ids=["native", "image_size_48"])
def test_command_matches_direct_apply_per_image(tmp_path, capsys, size):
    """Two different images, a random head with pre_logits: each printed block is its own
    image's top-k, equal to a direct apply at the checkpoint's (or the given) size."""
    path, model, params = _checkpoint(tmp_path, 10, representation_size=16)
    rng = np.random.default_rng(0)
    paths = []
    for name, low in (("a.png", 0), ("b.png", 128)):  # a dark and a bright noise image
        pixels = rng.integers(low, low + 128, (40, 56, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / name)
        paths.append(str(tmp_path / name))
    args = [f"--checkpoint={path}", *(f"--image={p}" for p in paths), "--top_k=3"]
    if size:
        args.append(f"--image_size={size}")
        params = weights.load_pretrained(path, model, size, reset_head=False)
    assert run_command(infer, *args) == 0
    want = _direct(model, params, paths, (size or 32, size or 32))
    assert np.abs(want[0] - want[1]).max() > 0.02  # the two images differ (by ~0.06)
    out = capsys.readouterr().out
    assert "(class" not in out  # a class without a name is named once
    blocks = _blocks(out)
    assert [b[0] for b in blocks] == paths
    for (_, rows), probs in zip(blocks, want, strict=True):
        order = np.argsort(-probs, kind="stable")[:3]
        assert [name for name, _ in rows] == [f"class {i}" for i in order]
        np.testing.assert_allclose([p for _, p in rows], probs[order], atol=6e-5)


def test_command_labels_and_imagenet_names(tmp_path, capsys):
    path, model, params = _checkpoint(tmp_path, 1000)
    img = _write(tmp_path, "x.png", "RGB", (33, 17), (200, 10, 90))
    best = int(np.argmax(_direct(model, params, [img], (32, 32))[0]))
    assert run_command(infer, f"--checkpoint={path}", f"--image={img}", "--top_k=1") == 0
    assert images_lib.imagenet_class_names()[best] in capsys.readouterr().out
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"thing {i}\n" for i in range(1000)))
    args = [f"--checkpoint={path}", f"--image={img}", "--top_k=1", f"--labels={labels}"]
    assert run_command(infer, *args, "--model=testing") == 0
    assert _blocks(capsys.readouterr().out)[0][1][0][0] == f"thing {best}"


def test_command_user_errors_are_one_line(tmp_path, capsys):
    path, _, _ = _checkpoint(tmp_path, 10)
    img = _write(tmp_path, "x.png", "RGB", (8, 8), (0, 0, 0))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    missing = str(tmp_path / "nowhere.jpg")
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n")
    cases = [
        ([f"--checkpoint={path}", f"--image={missing}"], f"image not found: {missing}"),
        ([f"--checkpoint={tmp_path}/missing.npz", f"--image={img}"], "missing.npz: no such file"),
        (
            [f"--checkpoint={path}", f"--image={bad}"],
            f"error: cannot read image {bad}: not an image file that Pillow reads (JPEG, PNG, "
            "...)\n",
        ),
        ([f"--checkpoint={path}", f"--image={img}", f"--labels={labels}"], "has 2 lines but"),
        ([f"--checkpoint={path}", f"--image={img}", "--model=B/16"], "does not fit the model"),
        ([f"--checkpoint={path}", f"--image={img}", "--image_size=big"], "is not N or H,W"),
    ]
    for args, message in cases:
        assert run_command(infer, *args) == 1, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, err
        assert "Traceback" not in err and "VIT_JAX_DEBUG=1" in err
    # Flag errors read the same, naming where the flags are listed.
    assert run_command(infer, f"--checkpoint={path}", f"--image={img}", "--top_k=0") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: flag --top_k=0: 0 is not a positive integer")
    assert "python -m vit_jax.infer --help lists the flags" in err


def test_override_sets_a_model_option_the_file_cannot_tell(tmp_path, capsys):
    """A model trained with fixed sin-cos position embeddings stores none: the file alone
    cannot say so, --override=posemb=sincos_2d does, and the output is that model's."""
    path, model, params = _checkpoint(tmp_path, 10, posemb="sincos_2d")
    assert model.posemb == "sincos_2d" and "posembed_input" not in params["Transformer"]
    rng = np.random.default_rng(1)
    img = tmp_path / "x.png"
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(img)
    args = [f"--checkpoint={path}", f"--image={img}", "--top_k=10", "--image_size=32"]
    assert run_command(infer, *args) == 1
    err = capsys.readouterr().err
    assert "has no learned position embeddings" in err and "--override=posemb=sincos_2d" in err
    printed = {}
    for posemb in ("sincos_2d", "none"):
        assert run_command(infer, *args, f"--override=posemb={posemb}") == 0
        ((_, rows),) = _blocks(capsys.readouterr().out)
        printed[posemb] = dict(rows)
    want = _direct(model, params, [str(img)], (32, 32))[0]
    assert printed["sincos_2d"] == pytest.approx({f"class {i}": p for i, p in enumerate(want)},
                                                 abs=6e-5)  # fmt: skip
    other = _direct(model.clone(posemb="none"), params, [str(img)], (32, 32))[0]
    assert printed["none"] == pytest.approx({f"class {i}": p for i, p in enumerate(other)},
                                            abs=6e-5)  # fmt: skip
    assert np.abs(want - other).max() > 1e-3  # the option changes the function
    # The fused kernel (Pallas' interpret mode here) prints what XLA's attention does; a
    # choice this host cannot run is refused before the checkpoint is read.
    assert (
        run_command(infer, *args, "--override=posemb=sincos_2d", "--override=attention=splash") == 0
    )
    ((_, rows),) = _blocks(capsys.readouterr().out)
    assert dict(rows) == pytest.approx(printed["sincos_2d"], abs=2e-6)
    assert (
        run_command(infer, "--checkpoint=nowhere.npz", *args[1:], "--override=attention=cudnn") == 1
    )
    assert capsys.readouterr().err.startswith(
        "error: attention=cudnn needs an NVIDIA GPU, and there is no GPU here"
    )
    # Not a KEY=VALUE, and no such option: one error line each, naming --override.
    assert run_command(infer, *args, "--override=posemb") == 1
    assert "--override=posemb: expected KEY=VALUE" in capsys.readouterr().err
    assert run_command(infer, *args, "--override=posemb=sincos_2d", "--override=depthh=3") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --override: ") and "depthh" in err and "Traceback" not in err
