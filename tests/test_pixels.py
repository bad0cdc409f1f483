"""The one preprocessing primitive (vit_jax/data/pixels.py), held to the pipelines it
reproduces: tf_bilinear to TensorFlow's decode_jpeg + tf.image.resize, pil_antialias to
PIL's decode + crop + resize; and the method a checkpoint records, through every format
and command that reads it."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers import random_params, run_command, tf_resize
from PIL import Image, ImageOps

from vit_jax import weights
from vit_jax.data import images as images_lib
from vit_jax.data import pixels
from vit_jax.models import get_model
from vit_jax.weights.meta import Meta


def jpeg(h: int, w: int, seed: int = 0, gray=False, orientation=None, **save) -> bytes:
    """A JPEG of smooth random content (it compresses like a photo) of h x w."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(h // 6, 1), max(w // 6, 1), 3), np.uint8)
    image = Image.fromarray(small).resize((w, h), Image.BILINEAR)
    image = image.convert("L") if gray else image
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    out = io.BytesIO()
    image.save(out, "JPEG", **{"quality": 85, **save})
    return out.getvalue()


# Odd sizes, every chroma subsampling, progressive and gray files.
JPEGS = [
    dict(h=37, w=53, subsampling=2),
    dict(h=101, w=67, subsampling=0, progressive=True, quality=95),
    dict(h=64, w=33, subsampling=1, quality=75),
    dict(h=45, w=29, gray=True, progressive=True),
    dict(h=1, w=9),
]


def pil_decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as f:
        return np.asarray(ImageOps.exif_transpose(f).convert("RGB"))


@pytest.mark.parametrize("spec", JPEGS, ids=lambda s: f"{s['h']}x{s['w']}")
def test_jpegs_decode_as_pil_and_as_tensorflow(spec):
    """pil_antialias decodes a JPEG to PIL's pixels, tf_bilinear to tf.io.decode_jpeg's
    (the integer-fast DCT TensorFlow defaults to: up to a few levels from PIL's)."""
    data = jpeg(**spec)
    np.testing.assert_array_equal(pixels.decode(data, "pil_antialias"), pil_decode(data))
    tf = pytest.importorskip("tensorflow")
    want = tf.io.decode_jpeg(data, channels=3).numpy()
    np.testing.assert_array_equal(pixels.decode(data, "tf_bilinear"), want)


def test_exif_orientation_makes_every_jpeg_upright_as_pil_does():
    for orientation in range(1, 9):
        data = jpeg(7, 11, orientation=orientation, quality=95)
        got = pixels.decode(data, "pil_antialias")
        np.testing.assert_array_equal(got, pil_decode(data), err_msg=f"orientation {orientation}")


def test_other_files_and_modes_take_pils_path():
    """CMYK JPEGs and PNGs are decoded by PIL, the same for both methods."""
    cmyk = io.BytesIO()
    Image.new("CMYK", (6, 5), (10, 200, 30, 0)).save(cmyk, "JPEG", quality=100)
    png = io.BytesIO()
    Image.fromarray(np.arange(60, dtype=np.uint8).reshape(5, 4, 3)).save(png, "PNG")
    for data in (cmyk.getvalue(), png.getvalue()):
        for method in pixels.METHODS:
            np.testing.assert_array_equal(pixels.decode(data, method), pil_decode(data))


def windows(h: int, w: int, rng, n: int = 6):
    """Crop windows (y0, x0, height, width) of an h x w image, the whole one first."""
    out = [(0, 0, h, w)]
    for _ in range(n - 1):
        ch, cw = rng.integers(1, h + 1), rng.integers(1, w + 1)
        out.append((int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw))
    return [tuple(int(v) for v in box) for box in out]


# Shrinking, growing, exact factors (OpenCV takes another code path at 2x) and 1 pixel.
SIZES = [(224, 224), (16, 12), (18, 26), (1, 1), (5, 40)]


def test_tf_bilinear_is_tf_image_resize():
    """decode then resize (tf_bilinear) = tf.image.resize of the crop of tf.io.decode_jpeg's
    pixels, to 1e-4 in [-1, 1] units; without TensorFlow, its formula written out."""
    try:
        import tensorflow as tf
    except ImportError:
        tf = None
    rng = np.random.default_rng(0)
    for spec in JPEGS:
        data = jpeg(**spec)
        decoded = pixels.decode(data, "tf_bilinear")
        for box in windows(spec["h"], spec["w"], rng):
            y0, x0, ch, cw = box
            crop = decoded[y0 : y0 + ch, x0 : x0 + cw]
            for size in [*SIZES, (2 * ch, 2 * cw), (max(ch // 2, 1), max(cw // 2, 1))]:
                got = pixels.resize(pixels.decode(data, "tf_bilinear"), size, "tf_bilinear", box)
                assert got.dtype == np.float32 and got.shape == (*size, 3)
                np.testing.assert_allclose(got / 127.5, tf_resize(crop, size) / 127.5, atol=1e-4)
                if tf is not None:
                    want = tf.image.resize(crop, size).numpy()
                    np.testing.assert_allclose(got / 127.5, want / 127.5, atol=1e-4)


def test_pil_antialias_is_pil_bit_for_bit():
    """decode then resize (pil_antialias) with a window = PIL's decode, crop and bilinear
    resize: the same bytes."""
    rng = np.random.default_rng(1)
    for spec in JPEGS:
        data = jpeg(**spec)
        decoded = pil_decode(data)
        for box in windows(spec["h"], spec["w"], rng):
            y0, x0, ch, cw = box
            for size in SIZES:
                image = pixels.decode(data, "pil_antialias")
                got = pixels.resize(image, size, "pil_antialias", box)
                pil = Image.fromarray(decoded).crop((x0, y0, x0 + cw, y0 + ch))
                want = np.asarray(pil.resize(size[::-1], Image.BILINEAR))
                assert got.dtype == np.uint8
                np.testing.assert_array_equal(got, want, err_msg=f"{box} -> {size}")


def test_an_unknown_method_is_named_with_the_choices():
    with pytest.raises(
        ValueError, match=r"preprocessing 'bicubic' is not one of tf_bilinear or pil_antialias"
    ):
        pixels.resize(pixels.decode(jpeg(8, 8), "pil_antialias"), (4, 4), "bicubic")


# ---------------------------------------------------------------- what a checkpoint records


def tiny_checkpoint(tmp_path, method=None, name="a.npz"):
    model = get_model("testing", 3, patch_size=8)
    params = random_params(model, (16, 16))
    path = tmp_path / name
    weights.save_npz(path, params, Meta(preprocessing=method))
    return path, model, params


@pytest.mark.parametrize("method", [None, "tf_bilinear", "pil_antialias"])
def test_npz_records_the_method_unless_it_is_the_published_files(tmp_path, method):
    from vit_jax.weights import read

    path, _, _ = tiny_checkpoint(tmp_path, method)
    with np.load(path) as f:
        assert ("vit_jax_preprocessing" in f.files) == (method == "pil_antialias")
    assert read.read_source(path).meta.preprocessing == (method or "tf_bilinear")
    assert weights.load(path).preprocessing == (method or "tf_bilinear")


@pytest.mark.parametrize("fmt", ["npz", "timm", "hf"])
def test_every_format_keeps_the_method_and_other_tools_files_say_pil(tmp_path, fmt):
    from vit_jax.weights import convert, read, safetensors_io

    src, _, _ = tiny_checkpoint(tmp_path, "pil_antialias")
    out = tmp_path / ("out" + {"npz": ".npz", "timm": ".safetensors", "hf": ""}[fmt])
    convert.convert(src, fmt, out)
    assert read.read_source(out).meta.preprocessing == "pil_antialias"
    told = tmp_path / ("told" + {"npz": ".npz", "timm": ".safetensors", "hf": ""}[fmt])
    convert.convert(src, fmt, told, preprocessing="tf_bilinear")  # told otherwise
    assert read.read_source(told).meta.preprocessing == "tf_bilinear"
    if fmt == "timm":  # a file timm wrote: no metadata of this package's
        tensors, meta = safetensors_io.read(out)
        safetensors_io.write(out, tensors, {"format": "pt"})
        assert read.read_source(out).meta.preprocessing == "pil_antialias"
    if fmt == "hf":
        cfg = json.loads((out / "config.json").read_text())
        del cfg["vit_jax_preprocessing"]
        (out / "config.json").write_text(json.dumps(cfg))
        assert read.read_source(out).meta.preprocessing == "pil_antialias"


def test_infer_json_uses_the_recorded_method_unless_told(tmp_path, capsys):
    """infer --json: one object a line with the path, the size, the method used and the
    top-k at full precision, equal to a direct apply on that method's pixels."""
    import jax

    from vit_jax import infer

    path, model, params = tiny_checkpoint(tmp_path, "pil_antialias")
    image = tmp_path / "x.jpg"
    image.write_bytes(jpeg(37, 53))
    for flag, method in ((None, "pil_antialias"), ("tf_bilinear", "tf_bilinear")):
        capsys.readouterr()
        args = [f"--checkpoint={path}", f"--image={image}", "--json", "--top_k=3"]
        assert run_command(infer, *args, *([f"--preprocessing={flag}"] if flag else [])) == 0
        (line,) = capsys.readouterr().out.strip().splitlines()
        got = json.loads(line)
        assert got["image"] == str(image) and got["image_size"] == [16, 16]
        assert got["preprocessing"] == method
        x = images_lib.load_images([str(image)], (16, 16), method)
        probs = np.asarray(jax.nn.softmax(model.apply({"params": params}, x, train=False)))[0]
        top = np.argsort(-probs)[:3]
        assert [t["index"] for t in got["top_k"]] == top.tolist()
        assert [t["label"] for t in got["top_k"]] == [f"class {i}" for i in top]
        np.testing.assert_allclose([t["probability"] for t in got["top_k"]], probs[top], rtol=1e-6)
    # The two methods give other pixels, so other probabilities.
    a, b = (images_lib.load_images([str(image)], (16, 16), m) for m in pixels.METHODS)
    assert np.abs(a - b).max() > 0.01


def test_hf_export_processor_computes_the_packages_pil_antialias_pixels(tmp_path):
    """The preprocessor_config.json of an hf export, through transformers' own processor
    (the PIL backend the printed recipe names), gives pil_antialias's pixels: the method
    the config declares."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from vit_jax.weights import convert

    src, _, _ = tiny_checkpoint(tmp_path)
    out = tmp_path / "hf"
    done = convert.convert(src, "hf", out)
    assert "backend='pil'" in done.how_to_load and "tf.image.resize" in done.how_to_load
    processor = transformers.AutoImageProcessor.from_pretrained(out, backend="pil")
    for i, (h, w) in enumerate([(37, 53), (9, 7), (64, 64)]):
        path = tmp_path / f"{i}.jpg"
        path.write_bytes(jpeg(h, w, seed=i))
        with Image.open(path) as f:
            theirs = processor(images=f, return_tensors="np")["pixel_values"][0]
        ours = images_lib.load_images([str(path)], (16, 16), "pil_antialias")[0]
        np.testing.assert_allclose(theirs.transpose(1, 2, 0), ours, atol=1e-6)
