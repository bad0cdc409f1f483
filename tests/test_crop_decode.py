"""Decoding only a JPEG's crop window (vit_jax/data/crop_decode.py, _crop_decode.c), held to
tf.image.decode_and_crop_jpeg bit for bit, and the AugReg presets' training crops to big_vision's
decode_jpeg_and_inception_crop + resize. Every file is generated here."""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
from PIL import Image

from vit_jax.configs import augreg, pretrain
from vit_jax.data import augment, crop_decode, folder_source, pipeline, pixels, tables
from vit_jax.data import config as config_lib

if crop_decode.native() is None:  # setup.sh builds it; CI fails this skip (conftest.py)
    pytest.skip(f"missing test dependency: {crop_decode.MISSING}", allow_module_level=True)


def jpeg(h: int, w: int, seed: int = 0, mode: str = "RGB", orientation=None, **save) -> bytes:
    """An h x w JPEG of smooth content with sharp noise on it (colour edges are where 4:2:0
    upsampling shows), in `mode` (RGB, L or CMYK)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(h // 5, 1), max(w // 5, 1), 4), np.uint8)
    smooth = np.asarray(Image.fromarray(small, "RGBA").resize((w, h), Image.BILINEAR), float)
    pixels_ = np.clip(smooth + rng.normal(0, 25, smooth.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels_, "RGBA").convert("RGB") if mode != "CMYK" else None
    image = Image.fromarray(pixels_, "CMYK") if mode == "CMYK" else image.convert(mode)
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    out = io.BytesIO()
    image.save(out, "JPEG", **{"quality": 90, **save})
    return out.getvalue()


# 4:2:0, 4:2:2, 4:4:4, progressive, gray and CMYK files of odd sizes, and a 1-pixel row.
JPEGS = {
    "420": dict(h=37, w=53, subsampling=2),
    "420-progressive": dict(h=61, w=45, subsampling=2, progressive=True),
    "422": dict(h=30, w=41, subsampling=1),
    "444-progressive": dict(h=41, w=27, subsampling=0, progressive=True, quality=95),
    "gray": dict(h=29, w=35, mode="L"),
    "cmyk": dict(h=23, w=31, mode="CMYK"),
    "1x9": dict(h=1, w=9),
}


def edge_windows(h: int, w: int, rng, n: int = 12) -> list[tuple[int, int, int, int]]:
    """Windows (top, left, height, width) touching every edge and corner, whole rows and
    columns, 1-pixel windows at the corners and inside, and random ones."""
    out = [(0, 0, h, w), (0, 0, 1, 1), (h - 1, w - 1, 1, 1), (0, w - 1, 1, 1), (h - 1, 0, 1, 1)]
    out += [(h // 2, w // 2, 1, 1), (0, 0, h, 1), (0, w - 1, h, 1), (0, 0, 1, w), (h - 1, 0, 1, w)]
    out += [(0, w // 3, h, w - w // 3), (h // 3, 0, h - h // 3, w // 2 + 1)]
    for _ in range(n):
        ch, cw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        out.append((int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw))
    return out


def sliced(image: np.ndarray, box) -> np.ndarray:
    y0, x0, ch, cw = box
    return image[y0 : y0 + ch, x0 : x0 + cw]


@pytest.mark.parametrize("name", JPEGS)
def test_windows_are_tensorflows_decode_and_crop_bit_for_bit(name):
    tf = pytest.importorskip("tensorflow")
    spec = JPEGS[name]
    data = jpeg(**spec)
    for box in edge_windows(spec["h"], spec["w"], np.random.default_rng(0)):
        want = tf.image.decode_and_crop_jpeg(data, box, channels=3, dct_method="INTEGER_FAST")
        got = crop_decode.decode_crop(data, box)
        assert got.dtype == np.uint8 and got.shape == (box[2], box[3], 3)
        np.testing.assert_array_equal(got, want.numpy(), err_msg=f"{name} {box}")


@pytest.mark.parametrize("name", ["420", "420-progressive", "422", "444-progressive", "gray"])
def test_a_window_differs_from_a_slice_only_in_its_first_and_last_columns(name):
    """Without TensorFlow too: 4:4:4 and gray files have no upsampling, so their windows are
    the slices of the whole decode; 4:2:0 and 4:2:2 windows differ in their edge columns,
    which upsampling reads as the image's edges, and nowhere else."""
    spec = JPEGS[name]
    data = jpeg(**spec)
    whole = pixels.decode(data, "tf_bilinear")
    differ = 0
    for box in edge_windows(spec["h"], spec["w"], np.random.default_rng(1), n=40):
        got = crop_decode.decode_crop(data, box).astype(int)
        diff = got != sliced(whole, box)
        if name.startswith(("444", "gray")):
            assert not diff.any(), box
        assert not diff[:, 1:-1].any(), box
        differ += diff.any()
    assert (differ > 0) == name.startswith("42"), differ


def test_an_exif_rotated_window_is_the_upright_images_window():
    """A 4:4:4 file (its windows are the whole decode's slices) stored in each of the 8
    orientations: the window of the upright image, as pixels.decode makes it upright."""
    rng = np.random.default_rng(2)
    for orientation in range(1, 9):
        data = jpeg(19, 26, orientation=orientation, subsampling=0, quality=95)
        upright = pixels.decode(data, "tf_bilinear")
        assert upright.shape[:2] == ((26, 19) if orientation >= 5 else (19, 26))
        for box in edge_windows(*upright.shape[:2], rng):
            got = crop_decode.decode_crop(data, box)
            np.testing.assert_array_equal(got, sliced(upright, box), err_msg=f"{orientation}")
        # A window picked from the upright size, as the Inception crop picks one.
        seen = []
        crop_decode.decode_crop(data, lambda h, w, seen=seen: seen.append((h, w)) or (0, 0, 1, 1))
        assert seen == [upright.shape[:2]]


def test_other_files_are_decoded_whole_then_sliced():
    """A PNG, and a JPEG whose window meets corrupt data (libjpeg warns; PIL decodes it,
    with its own DCT): pixels.decode's pixels, sliced."""
    png = io.BytesIO()
    Image.fromarray(np.arange(5 * 4 * 3, dtype=np.uint8).reshape(5, 4, 3)).save(png, "PNG")
    broken = bytearray(jpeg(40, 48))
    broken[len(broken) // 2 : len(broken) // 2 + 40] = b"\xff\x00" * 20  # a bad Huffman code
    for data, box in ((png.getvalue(), (1, 2, 3, 2)), (bytes(broken), (20, 3, 20, 40))):
        for method in pixels.METHODS:
            want = sliced(pixels.decode(data, method), box)
            np.testing.assert_array_equal(crop_decode.decode_crop(data, box, method), want)


def test_corrupt_and_truncated_files_raise_what_the_full_decode_raises():
    data = jpeg(40, 48)
    for bad in (data[: len(data) // 2], data[:-2], data[:300], b"\xff\xd8\xff\xe0 junk", b"x"):
        with pytest.raises(ValueError) as full:
            pixels.decode(bad, "tf_bilinear")
        with pytest.raises(ValueError) as crop:
            crop_decode.decode_crop(bad, (0, 0, 1, 1))
        assert str(crop.value) == str(full.value)
    with pytest.raises(ValueError, match=r"crop window \(0, 40, 2, 9\) is not inside the 40x48"):
        crop_decode.decode_crop(data, (0, 40, 2, 9))


def test_the_module_itself_refuses_a_bad_window_before_it_allocates():
    """The C module called directly (crop_decode.py checks first): an empty, negative or
    outside window, and numbers whose sums or products overflow an int or a Py_ssize_t, are
    a ValueError naming the window: never a SystemError, MemoryError or OverflowError."""
    module, data = crop_decode.native(), jpeg(40, 48)
    big = [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, 2**100]
    boxes = [(0, 0, b, b) for b in big] + [(b, 0, 1, 1) for b in big] + [(0, b, 1, 1) for b in big]
    boxes += (
        [(-b, 0, 1, 1) for b in big] + [(0, -b, 1, 1) for b in big] + [(0, 0, -b, 1) for b in big]
    )
    boxes += [(1, 1, 2**31 - 1, 1), (39, 47, 2, 1), (40, 0, 1, 1), (0, 48, 1, 1), (0, 0, 41, 48)]
    boxes += [(-1, 0, 1, 1), (0, -1, 1, 1), (0, 0, 0, 1), (0, 0, 1, 0), (0, 0, 40, 49)]
    for box in boxes:
        named = re.escape(f"crop window ({', '.join(map(str, box))}) is ")
        for fast in (True, False):
            with pytest.raises(ValueError, match=named + "(empty|not inside the 40x48 image)"):
                module.decode(data, *box, fast)
        with pytest.raises(ValueError, match="empty|Not a JPEG"):
            module.decode(b"not a JPEG", *box, True)  # empty first, then the file
    assert (
        module.decode(data, np.int64(39), 47, 1, 1, True)
        == crop_decode.decode_crop(data, (39, 47, 1, 1)).tobytes()
    )


def test_the_gil_is_released_while_decoding():
    """This thread's Python loop keeps running while another thread decodes: its longest
    pause is a small part of the decode's time (holding the GIL, it would be nearly all)."""
    import threading
    import time

    noise = np.random.default_rng(0).integers(0, 256, (300, 400, 3), np.uint8)
    out = io.BytesIO()  # 12 megapixels: a decode of about 0.1 s
    Image.fromarray(noise).resize((4000, 3000), Image.NEAREST).save(out, "JPEG", quality=95)
    thread = threading.Thread(
        target=crop_decode.decode_crop, args=(out.getvalue(), (0, 0, 3000, 4000))
    )
    gaps, start = [], time.perf_counter()
    last = start
    thread.start()
    while thread.is_alive():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    assert max(gaps) < (last - start) / 3, (max(gaps), last - start)


def write_folder(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def augreg_dataset(root, **overrides):
    """The AugReg preset's dataset section on an image folder, without mixup and flips."""
    cfg = augreg.get_config("tiny,none").dataset
    cfg.update(dict(source="folder", data_dir=str(root), flip=False, train_split="train"))
    cfg.update(dict(test_split="test", **overrides))
    return cfg


FOLDER = {
    f"{split}/{label}/{i}.jpg": jpeg(37 + 11 * i, 53 - 7 * i, seed=i, subsampling=2)
    for split in ("train", "test")
    for i, label in enumerate("abab")
}


def train_batch(cfg, step: int = 0) -> tuple[np.ndarray, pipeline.TrainBatch]:
    make = pipeline.TrainBatch(cfg, cfg.train_split, (24, 24), 0, 4, 0, 1)
    return make(step)["image"], make


def test_augreg_training_crops_are_big_visions(tmp_path):
    """The AugReg preset's training transform = big_vision's decode_jpeg_and_inception_crop
    (tf.image.decode_and_crop_jpeg) + tf.image.resize of the same window, then [-1, 1];
    decoding the whole file (the paper's presets) gives other pixels for some windows."""
    tf = pytest.importorskip("tensorflow")
    write_folder(tmp_path, FOLDER)
    cfg = augreg_dataset(tmp_path)
    assert cfg.decode == "crop" and pretrain.get_config("b16,imagenet2012").dataset.decode == "full"
    for step in range(3):
        images, make = train_batch(cfg, step)
        table, index, _, draws = make.share(step)
        for j, (i, u) in enumerate(zip(index, draws, strict=True)):
            data = open(table.paths[i], "rb").read()
            h, w = tf.image.extract_jpeg_shape(data).numpy()[:2]
            box = augment.crop_window(int(h), int(w), u, cfg.crop_min_area)
            crop = tf.image.decode_and_crop_jpeg(data, box, channels=3)  # big_vision's call
            want = (tf.image.resize(crop, (24, 24)).numpy() - 127.5) / 127.5
            np.testing.assert_allclose(images[j], want, atol=1e-5, rtol=0)
    cfg.decode = "full"
    full = [train_batch(cfg, s)[0] for s in range(3)]
    cfg.decode = "crop"
    crop = [train_batch(cfg, s)[0] for s in range(3)]
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(full, crop, strict=True))


def test_a_cache_keeps_the_bytes_so_the_pixels_do_not_change(tmp_path):
    write_folder(tmp_path, FOLDER)
    runs = []
    for cache in (False, True):
        cfg = augreg_dataset(tmp_path, cache=cache)
        runs.append([train_batch(cfg, s)[0] for s in range(2)])
        table = tables.open_table(cfg, cfg.train_split)
        assert isinstance(table.example(0)[0], bytes)  # read from the file, or cached
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_corrupt_file_is_named_as_the_full_decode_names_it(tmp_path):
    write_folder(tmp_path, {**FOLDER, "train/a/z.jpg": FOLDER["train/a/0.jpg"][:300]})
    errors = []
    for decode in ("full", "crop"):
        cfg = augreg_dataset(tmp_path, decode=decode)
        with pytest.raises(folder_source.CorruptImageError) as error:
            for step in range(4):
                train_batch(cfg, step)
        errors.append(str(error.value))
    assert errors[0] == errors[1] and "z.jpg" in errors[0]


def test_without_the_native_module_a_crop_config_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    from helpers import run_command

    from vit_jax import main

    monkeypatch.setitem(sys.modules, "vit_jax.data._crop_decode", None)  # import fails
    assert crop_decode.native() is None
    with pytest.raises(RuntimeError, match="apt-get install libjpeg62-turbo-dev"):
        crop_decode.decode_crop(jpeg(8, 8), (0, 0, 1, 1))
    write_folder(tmp_path, FOLDER)
    config_lib.validate(augreg_dataset(tmp_path, decode="full"))  # the others are unaffected
    config_lib.validate(augreg.get_config("tiny,none").dataset)  # idx: nothing to crop-decode
    flags = [f"--workdir={tmp_path}/run", "--config.dataset.source=folder"]
    flags.append(f"--config.dataset.data_dir={tmp_path}")
    assert run_command(main, "--config=augreg:tiny,none", *flags) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: --config.dataset.decode='crop': decoding only the crop"), err
    assert "apt-get install libjpeg62-turbo-dev" in err[0] and len(err) == 2, err
    assert not (tmp_path / "run").exists()


def test_bytes_after_the_end_marker_are_ignored_as_every_decoder_ignores_them():
    """A motion photo appends its video: its window is the window of the file without it
    (big_vision's pixels, not a whole decode's); a file cut before its end marker, even with
    such bytes in it, is still decoded whole, with its error."""
    rng = np.random.default_rng(5)
    video = b"\xff\xda\x00\x02" + rng.integers(0, 256, 5000, np.uint8).tobytes() + b"\xff\xd9"
    for data in (jpeg(40, 48), jpeg(33, 50, progressive=True)):
        for box in edge_windows(*pixels.decode(data, "tf_bilinear").shape[:2], rng):
            want = crop_decode.decode_crop(data, box)
            np.testing.assert_array_equal(crop_decode.decode_crop(data + video, box), want)
        assert crop_decode._whole(data + video) and not crop_decode._whole(data[:-2] + video[:9])
        with pytest.raises(ValueError) as full:
            pixels.decode(data[: len(data) // 2], "tf_bilinear")
        with pytest.raises(ValueError) as crop:
            crop_decode.decode_crop(data[: len(data) // 2], (0, 0, 1, 1))
        assert str(crop.value) == str(full.value)
