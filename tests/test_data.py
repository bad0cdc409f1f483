"""Tests of vit_jax.data: idx and folder sources, preprocessing against PIL, determinism,
resume, sharding (the TFDS source: test_tfds.py)."""

from __future__ import annotations

import itertools
import logging
import os

import numpy as np
import pytest
from helpers import tf_resize, write_idx, write_idx_split
from PIL import Image

from vit_jax import data
from vit_jax.data import augment, idx_source, pixels, splits, subsets

H = W = 8  # stored image size of the synthetic datasets
N_TRAIN, N_TEST = 40, 20


def idx_images(n: int, offset: int) -> np.ndarray:
    """Distinct images: pixel [i, y, x] = (3 * (i + offset) + 8 * y + x) % 256.  # [n, H, W]"""
    i = np.arange(n)[:, None, None] + offset
    return ((3 * i + 8 * np.arange(H)[:, None] + np.arange(W)) % 256).astype(np.uint8)


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("idx"))
    for prefix, n, offset in (("train", N_TRAIN, 0), ("t10k", N_TEST, 60)):
        write_idx_split(root, prefix, idx_images(n, offset), np.arange(n) % 10)
    return root


def idx_cfg(root: str, **overrides):
    cfg = data.default_config()
    cfg.data_dir = root
    cfg.update(overrides)
    return cfg


def exact_cfg(root: str, **overrides):
    """Training without augmentation: train batches are exact copies of stored images."""
    return idx_cfg(root, crop_min_area=1.0, flip=False, **overrides)


def to_pixels(images: np.ndarray) -> np.ndarray:
    """[-1, 1] float images [b, H, W, 3] -> the stored uint8 values of channel 0."""
    return np.rint(images[..., 0] * 127.5 + 127.5).astype(np.int64)


def image_ids(images: np.ndarray) -> list[int]:
    """Identifies synthetic idx images by their first pixel (3 * i mod 256, i < 85)."""
    return [int(p) // 3 for p in to_pixels(images)[:, 0, 0]]


def train(cfg, n: int, **kwargs) -> list[dict[str, np.ndarray]]:
    """The first n train batches (one process, global batch 8, stored size, seed 0)."""
    kwargs = dict(global_batch=8, image_size=H, seed=0, process_index=0, process_count=1) | kwargs
    return list(itertools.islice(data.train_iterator(cfg, **kwargs), n))


def eval_all(cfg, split: str, **kwargs) -> dict[str, np.ndarray]:
    """All batches of an eval pass, concatenated (one process, batch 4, stored size)."""
    kwargs = dict(global_batch=4, image_size=H, process_index=0, process_count=1) | kwargs
    batches = list(data.eval_iterator(cfg, split, **kwargs))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


# ---- idx source --------------------------------------------------------------------


def test_read_idx_both_compressions_and_bad_magic(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    for name in ("a-idx3-ubyte", "a-idx3-ubyte.gz"):
        write_idx(str(tmp_path / name), array)
        np.testing.assert_array_equal(idx_source.read_idx(str(tmp_path / name)), array)
    (tmp_path / "bad").write_bytes(b"\x12\x34\x08\x01rest")
    with pytest.raises(ValueError, match="not an idx file"):
        idx_source.read_idx(str(tmp_path / "bad"))


def test_missing_idx_dir_says_how_to_install(tmp_path):
    cfg = idx_cfg(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        data.num_examples(cfg, "train")


def test_idx_eval_batch_is_exact_and_padded(idx_dir):
    cfg = idx_cfg(idx_dir)
    assert data.num_classes(cfg) == 10
    assert data.num_examples(cfg, "test") == N_TEST
    one_process = {"process_index": 0, "process_count": 1}
    batches = list(data.eval_iterator(cfg, "test", global_batch=8, image_size=H, **one_process))
    assert len(batches) == 3  # 20 examples: 8 + 8 + 4 real and 4 padding
    assert all(b["image"].shape == (8, H, W, 3) and b["image"].dtype == np.float32 for b in batches)
    np.testing.assert_array_equal(batches[-1]["mask"], [1, 1, 1, 1, 0, 0, 0, 0])
    got = np.concatenate([b["image"] for b in batches])[:N_TEST]
    expected = (idx_images(N_TEST, 60).astype(np.float32) - 127.5) / 127.5
    np.testing.assert_array_equal(got, np.repeat(expected[..., None], 3, axis=-1))
    labels = np.concatenate([b["label"] for b in batches])
    np.testing.assert_array_equal(labels[:N_TEST], np.eye(10)[np.arange(N_TEST) % 10])
    np.testing.assert_array_equal(labels[N_TEST:], 0.0)


def test_idx_train_batch_shapes_range_and_one_hot(idx_dir):
    cfg = idx_cfg(idx_dir, label_smoothing=0.1)
    # process_index / process_count default to jax's (one process here).
    batch = next(data.train_iterator(cfg, global_batch=8, image_size=(12, 10), seed=0))
    assert set(batch) == {"image", "label"}
    assert batch["image"].shape == (8, 12, 10, 3) and batch["image"].dtype == np.float32
    assert batch["image"].min() >= -1.0 and batch["image"].max() <= 1.0
    assert batch["label"].shape == (8, 10) and batch["label"].dtype == np.float32
    np.testing.assert_allclose(batch["label"].sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        np.sort(batch["label"], 1)[:, [0, -1]], [[0.01, 0.91]] * 8, rtol=1e-5
    )


def test_class_subset_relabels_in_listed_order(idx_dir):
    cfg = idx_cfg(idx_dir, classes=[6, 5])
    assert data.num_classes(cfg) == 2
    assert data.num_examples(cfg, "test") == 4  # test labels i % 10, i < 20
    out = eval_all(cfg, "test")
    # Test images 5, 6, 15, 16 in storage order; class 6 -> 0, class 5 -> 1.
    assert [i - 60 for i in image_ids(out["image"])] == [5, 6, 15, 16]
    np.testing.assert_array_equal(out["label"].argmax(1), [1, 0, 1, 0])
    assert train(cfg, 1)[0]["label"].shape == (8, 2)


def test_slicing_selects_the_first_half(idx_dir):
    cfg = idx_cfg(idx_dir, train_split="train[:50%]")
    assert data.num_examples(cfg, "train[:50%]") == 20
    assert data.num_examples(cfg, "train[-10:]") == 10
    out = eval_all(cfg, "train[:50%]", global_batch=8)
    assert image_ids(out["image"][out["mask"] == 1]) == list(range(20))


def test_split_syntax_matches_tfds():
    assert splits.resolve("train", 1000) == splits.Split("train", 0, 1000)
    assert splits.resolve("train[:10%]", 1000) == splits.Split("train", 0, 100)
    assert splits.resolve("train[90%:]", 1000) == splits.Split("train", 900, 1000)
    assert splits.resolve("train[100:-100]", 1000) == splits.Split("train", 100, 900)
    assert splits.resolve("train[:33.4%]", 10) == splits.Split("train", 0, 3)
    with pytest.raises(ValueError, match="beyond"):
        splits.resolve("train[:2000]", 1000)
    with pytest.raises(ValueError, match="expected 'name' or 'name\\[start:stop\\]'"):
        splits.resolve("train[1:2:3]", 1000)


def test_examples_per_class_keeps_n_per_class_deterministically(idx_dir):
    cfg = idx_cfg(idx_dir, examples_per_class=2)
    assert data.num_examples(cfg, "train") == 20
    assert data.num_examples(cfg, "test") == N_TEST  # the budget applies to train only
    labels = np.arange(N_TRAIN) % 10
    kept, new = subsets.select(labels, None, 10, examples_per_class=2, subset_seed=0)
    assert np.bincount(new).tolist() == [2] * 10
    again, _ = subsets.select(labels, None, 10, examples_per_class=2, subset_seed=0)
    other, _ = subsets.select(labels, None, 10, examples_per_class=2, subset_seed=1)
    np.testing.assert_array_equal(kept, again)
    assert not np.array_equal(kept, other)
    # Every train batch of an epoch draws from exactly the kept examples.
    batches = train(exact_cfg(idx_dir, examples_per_class=2), 2, global_batch=10)
    seen = [i for b in batches for i in image_ids(b["image"])]
    assert sorted(seen) == kept.tolist()


def test_train_epoch_visits_each_example_once(idx_dir):
    batches = train(exact_cfg(idx_dir), 10, seed=3)  # two epochs of 40
    ids = [image_ids(b["image"]) for b in batches]
    first, second = sum(ids[:5], []), sum(ids[5:], [])
    assert sorted(first) == sorted(second) == list(range(N_TRAIN))
    assert first != second  # a new permutation every epoch
    labels = np.concatenate([b["label"] for b in batches]).argmax(1)
    np.testing.assert_array_equal(labels, np.asarray(first + second) % 10)


def test_process_shares_are_disjoint_and_cover(idx_dir):
    cfg = exact_cfg(idx_dir)
    whole = train(cfg, 5)
    shares = [train(cfg, 5, process_index=k, process_count=2) for k in range(2)]
    for step in range(5):
        assert shares[0][step]["image"].shape == (4, H, W, 3)
        joined = np.concatenate([shares[0][step]["image"], shares[1][step]["image"]])
        np.testing.assert_array_equal(joined, whole[step]["image"])
    # Eval: each example exactly once over both processes, same number of batches.
    parts = [
        eval_all(cfg, "test", global_batch=6, process_index=k, process_count=2) for k in (0, 1)
    ]
    assert len(parts[0]["mask"]) == len(parts[1]["mask"]) == 12  # 10 per process -> 4 x 3
    ids = [image_ids(p["image"][p["mask"] == 1]) for p in parts]
    assert set(ids[0]).isdisjoint(ids[1])
    assert sorted(ids[0] + ids[1]) == list(range(60, 60 + N_TEST))


def test_train_is_deterministic_and_resumes_exactly(idx_dir):
    cfg = idx_cfg(idx_dir, mixup=0.2)
    run_a, run_b = train(cfg, 7, image_size=12), train(cfg, 7, image_size=12)
    other = train(cfg, 1, image_size=12, seed=1)
    for a, b in zip(run_a, run_b, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    assert not np.array_equal(run_a[0]["image"], other[0]["image"])
    resumed = train(cfg, 3, image_size=12, start_step=4)  # crosses the epoch end at step 5
    for a, b in zip(run_a[4:], resumed, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])


def test_mixup_mixes_with_the_rolled_batch(idx_dir):
    plain = train(exact_cfg(idx_dir), 1)[0]
    mixed = train(exact_cfg(idx_dir, mixup=1.0), 1)[0]
    x, partner = plain["image"], np.roll(plain["image"], 1, axis=0)
    # mixed = lam * x + (1 - lam) * partner: solve for the one weight of the batch.
    lam = np.sum((mixed["image"] - partner) * (x - partner)) / np.sum((x - partner) ** 2)
    assert 0 < lam < 1
    np.testing.assert_allclose(mixed["image"], lam * x + (1 - lam) * partner, atol=1e-5)
    y = plain["label"]
    np.testing.assert_allclose(
        mixed["label"], lam * y + (1 - lam) * np.roll(y, 1, axis=0), atol=1e-5
    )


def test_unfolded_mixup_is_folded_mixup_of_the_reversed_batch():
    """big_vision folds mixup's weight to max(lam, 1 - lam); this package does not. For
    lam < 1/2 the package's mixed batch is exactly the folded rule's mixed batch of the
    reversed batch, reversed and rotated by one (a permutation): as a shuffled batch is
    as likely reversed, the two rules give the same distribution of mixed examples (and
    of their labels)."""
    rng = np.random.default_rng(0)
    x = rng.random((6, 4, 4, 3), dtype=np.float32)
    y = np.eye(6, dtype=np.float32)
    below_half = 0
    for step in range(20):
        batch = {"image": x.copy(), "label": y.copy()}
        augment.mixup(batch, seed=1, step=step, alpha=0.5)
        lam = np.float32(augment.generator(1, augment.MIXUP_SALT, step).beta(0.5, 0.5))
        if lam >= 0.5:
            continue
        below_half += 1
        folded = max(lam, np.float32(1) - lam)  # big_vision's weight
        for key, v in (("image", x), ("label", y)):
            r = v[::-1]
            theirs = folded * r + (np.float32(1) - folded) * np.roll(r, 1, axis=0)
            np.testing.assert_allclose(batch[key], np.roll(theirs[::-1], 1, axis=0), atol=1e-6)
    assert 5 <= below_half <= 15  # Beta(a, a) is symmetric: about half the steps


def pil_crop_resize(image: np.ndarray, box, size) -> np.ndarray:
    """PIL itself: crop (y0, x0, h, w), then bilinear resize to size (H, W).  -> uint8"""
    y0, x0, h, w = box
    pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    out = np.asarray(pil.crop((x0, y0, x0 + w, y0 + h)).resize(size[::-1], Image.BILINEAR))
    return out[..., None] if image.shape[-1] == 1 else out


def test_crop_window_follows_the_inception_rule():
    """Windows of area in [min_area, 1] x image and aspect ratio in [3/4, 4/3], inside the
    image, placed by the last uniforms; no window fits -> the whole image."""
    rng = np.random.default_rng(1)
    for _ in range(500):
        u = rng.random(augment.DRAWS)
        y0, x0, ch, cw = augment.crop_window(30, 40, u, 0.1)
        assert 0 <= y0 and y0 + ch <= 30 and 0 <= x0 and x0 + cw <= 40
        area, ratio = ch * cw / 1200, cw / ch
        if (ch, cw) != (30, 40):  # a sampled window (rounding moves area/ratio a little)
            assert 0.1 - 0.02 <= area <= 1.0 and 3 / 4 - 0.1 <= ratio <= 4 / 3 + 0.1
    # u = 0: area 0.1 * 1200 = 120, ratio 3/4 -> width round(sqrt(90)) = 9, height
    # round(sqrt(160)) = 13, at the top left corner.
    assert augment.crop_window(30, 40, np.zeros(augment.DRAWS), 0.1) == (0, 0, 13, 9)
    u = np.zeros(augment.DRAWS)
    u[-3:-1] = 0.999  # placed at the far corner
    assert augment.crop_window(30, 40, u, 0.1) == (30 - 13, 40 - 9, 13, 9)
    # A 1 x 100 image fits no window of ratio <= 4/3: the whole image.
    assert augment.crop_window(1, 100, rng.random(augment.DRAWS), 0.5) == (0, 0, 1, 100)


@pytest.mark.parametrize("method", pixels.METHODS)
def test_train_batch_is_the_crop_resize_flip_of_pil_or_tf(idx_dir, method):
    """One train batch recomputed from the stored images with the batch's own windows and
    flips, by PIL itself (pil_antialias: bit for bit) or tf.image.resize's formula
    (tf_bilinear, float: to 1e-4 of [-1, 1])."""
    cfg = idx_cfg(idx_dir, crop_min_area=0.3, preprocessing=method)
    batch = train(cfg, 1, image_size=(12, 10), seed=5)[0]
    table_images = idx_images(N_TRAIN, 0)[..., None]
    from vit_jax.data import order

    index, slots = order.train_share(
        N_TRAIN, 0, global_batch=8, process_index=0, process_count=1, seed=5
    )
    draws = augment.step_draws(5, 0, 8)[slots]
    for j, (i, u) in enumerate(zip(index, draws, strict=True)):
        window = augment.crop_window(H, W, u, 0.3)
        if method == "pil_antialias":
            expected = pil_crop_resize(table_images[i], window, (12, 10))
        else:
            y0, x0, ch, cw = window
            expected = tf_resize(table_images[i][y0 : y0 + ch, x0 : x0 + cw], (12, 10))
        if u[-1] < 0.5:
            expected = expected[:, ::-1]
        want = (np.repeat(expected, 3, -1) - 127.5) / 127.5
        np.testing.assert_allclose(
            batch["image"][j], want, atol=1e-6 if method == "pil_antialias" else 1e-4
        )
        np.testing.assert_array_equal(batch["label"][j].argmax(), i % 10)


@pytest.mark.skipif(not os.path.isdir(data.DEFAULT_IDX_DIR), reason="no dataset-fashion-mnist")
def test_real_fashion_mnist_sizes():
    cfg = data.default_config()
    assert data.num_examples(cfg, "train") == 60000
    assert data.num_examples(cfg, "test") == 10000
    assert data.num_classes(cfg) == 10


# ---- folder source -----------------------------------------------------------------


def save(path, array: np.ndarray, mode: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array, mode).save(path)


def make_folder(root, extra_test_class: bool = False) -> dict[str, np.ndarray]:
    """train/{cat,dog} with gray, RGBA, RGB PNGs and a JPEG; test/{cat,dog} with PNGs."""
    rng = np.random.default_rng(0)
    images = {
        "train/cat/a_gray.png": rng.integers(0, 256, (H, W), np.uint8),
        "train/cat/b_rgba.png": rng.integers(0, 256, (H, W, 4), np.uint8),
        "train/dog/c_rgb.png": rng.integers(0, 256, (H, W, 3), np.uint8),
        "train/dog/d.jpg": np.full((H, W, 3), 200, np.uint8),
        "test/cat/e.png": rng.integers(0, 256, (H, W, 3), np.uint8),
        "test/dog/f.PNG": rng.integers(0, 256, (H, W), np.uint8),
    }
    if extra_test_class:
        images["test/bird/g.png"] = rng.integers(0, 256, (H, W, 3), np.uint8)
    modes = {2: "L", 3: "RGB", 4: "RGBA"}
    for name, array in images.items():
        save(os.path.join(root, name), array, modes[array.shape[-1] if array.ndim == 3 else 2])
    return images


def folder_cfg(root, **overrides):
    return idx_cfg(str(root), source="folder", **overrides)


def as_rgb(array: np.ndarray) -> np.ndarray:
    """Gray repeated; RGBA without its alpha (as PIL's convert('RGB'), TF, timm, HF)."""
    if array.ndim == 2:
        return np.repeat(array[..., None], 3, -1)
    return array[..., :3]


def test_folder_decodes_gray_rgba_rgb_and_jpeg(tmp_path):
    images = make_folder(tmp_path)
    cfg = folder_cfg(tmp_path)
    assert data.num_classes(cfg) == 2
    assert data.num_examples(cfg, "train") == 4
    for cache in (False, True):
        cfg.cache = cache
        out = eval_all(cfg, "train")
        values = np.rint(out["image"] * 127.5 + 127.5)
        for i, name in enumerate(
            ["train/cat/a_gray.png", "train/cat/b_rgba.png", "train/dog/c_rgb.png"]
        ):
            np.testing.assert_allclose(values[i], as_rgb(images[name]), atol=1)  # PIL rounds
        np.testing.assert_allclose(values[3], 200, atol=3)  # JPEG is lossy
        np.testing.assert_array_equal(out["label"].argmax(1), [0, 0, 1, 1])
    # Training: a JPEG decoded inside its crop window (no cache) equals decode-then-crop.
    runs = []
    for cache in (False, True):
        cfg.cache = cache
        runs.append(train(cfg, 2, global_batch=4, image_size=16))
    for a, b in zip(*runs, strict=True):
        assert a["image"].shape == (4, 16, 16, 3)
        np.testing.assert_array_equal(a["image"], b["image"])


@pytest.mark.parametrize("method", pixels.METHODS)
def test_one_file_gives_the_same_pixels_on_every_path(tmp_path, method):
    """A JPEG through `infer`/the figures (images.load_images), through the evaluation
    pipeline (evaluation, few-shot, `evaluate`; folder source, cached or not) and through
    training without augmentation: the same array, equal to PIL's own decode + resize
    (pil_antialias) or tf.image.resize's formula on TensorFlow's decode (tf_bilinear: the
    integer-fast DCT, which simplejpeg computes; tests/test_pixels.py holds it to TF's)."""
    import simplejpeg

    from vit_jax.data import images

    rng = np.random.default_rng(2)
    smooth = np.linspace(0, 255, 37 * 23 * 3).reshape(37, 23, 3) + rng.normal(0, 20, (37, 23, 3))
    for split in ("train", "test"):
        os.makedirs(tmp_path / split / "only")
        Image.fromarray(np.clip(smooth, 0, 255).astype(np.uint8)).save(
            tmp_path / split / "only" / "x.jpg", quality=90
        )
    path = str(tmp_path / "test" / "only" / "x.jpg")
    with Image.open(path) as f:  # independent: PIL's decode and bilinear resize
        if method == "pil_antialias":
            expected = np.asarray(f.convert("RGB").resize((12, 16), Image.BILINEAR), np.float32)
        else:
            tf_decoded = simplejpeg.decode_jpeg(open(path, "rb").read(), fastdct=True)
            expected = tf_resize(tf_decoded, (16, 12)).astype(np.float32)
    expected = (expected - 127.5) / 127.5
    np.testing.assert_allclose(images.load_images([path], (16, 12), method)[0], expected, atol=1e-5)
    for cache in (False, True):
        cfg = folder_cfg(tmp_path, cache=cache, crop_min_area=1.0, flip=False, preprocessing=method)
        out = eval_all(cfg, "test", global_batch=1, image_size=(16, 12))
        np.testing.assert_allclose(out["image"][0], expected, atol=1e-5)
        # Training without flips, crop_min_area 1: a 37 x 23 image (ratio 0.62) fits no
        # full-area window of ratio in [3/4, 4/3], so the crop is the whole image.
        batch = train(cfg, 1, global_batch=1, image_size=(16, 12))[0]
        np.testing.assert_allclose(batch["image"][0], expected, atol=1e-5)


def test_corrupt_image_is_named_or_skipped_and_counted(tmp_path, caplog):
    make_folder(tmp_path)
    bad = tmp_path / "train" / "dog" / "z_broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    cfg = folder_cfg(tmp_path)
    with pytest.raises(data.CorruptImageError, match="z_broken.jpg"):
        eval_all(cfg, "train", global_batch=2)
    with pytest.raises(data.CorruptImageError, match="z_broken.jpg.*skip_corrupt=True"):
        train(cfg, 3, global_batch=5)
    with caplog.at_level(logging.WARNING):
        cfg = folder_cfg(tmp_path, skip_corrupt=True)
        assert data.num_examples(cfg, "train") == 4
    assert "skipped 1 corrupt image(s) of 5" in caplog.text and "z_broken.jpg" in caplog.text
    out = eval_all(cfg, "train")
    assert out["mask"].sum() == 4


def test_every_bad_file_of_the_failing_batch_is_named(tmp_path):
    """Two bad files in one batch: the error names both (not the first alone, leaving the
    other to a later run) and says that files of later batches may follow."""
    make_folder(tmp_path)
    for name in ("z_broken.jpg", "zz_broken.jpg"):
        (tmp_path / "train" / "dog" / name).write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    cfg = folder_cfg(tmp_path)
    for run in (lambda: train(cfg, 1, global_batch=6), lambda: eval_all(cfg, "train")):
        with pytest.raises(data.CorruptImageError) as e:
            run()
        said = str(e.value)
        assert said.startswith("2 images do not decode: "), said
        assert "z_broken.jpg" in said and "zz_broken.jpg" in said
        assert "others may follow" in said and "skip_corrupt=True" in said
    with pytest.raises(data.CorruptImageError) as e:  # cached: every file decoded first
        data.num_examples(folder_cfg(tmp_path, cache=True), "train")
    said = str(e.value)
    assert said.startswith("2 images do not decode: ") and "zz_broken.jpg" in said, said


def test_folder_class_errors(tmp_path):
    make_folder(tmp_path / "a", extra_test_class=True)
    with pytest.raises(ValueError, match=r"different classes.*only in test: \['bird'\]"):
        data.num_classes(folder_cfg(tmp_path / "a"))
    make_folder(tmp_path / "b")
    os.makedirs(tmp_path / "b" / "train" / "emu")
    os.makedirs(tmp_path / "b" / "test" / "emu")
    (tmp_path / "b" / "train" / "emu" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"train/emu has no images.*notes.txt"):
        data.num_examples(folder_cfg(tmp_path / "b"), "train")
    os.makedirs(tmp_path / "c" / "train")
    os.makedirs(tmp_path / "c" / "test")
    with pytest.raises(ValueError, match="has no class directories"):
        data.num_classes(folder_cfg(tmp_path / "c"))


def test_randaugment_in_the_pipeline_is_seeded_per_example_and_resumes(idx_dir):
    """Each example of a batch gets randaugment with the generator of (seed, step, slot):
    recomputed here from the batch without RandAugment, and the same after a resume."""
    from vit_jax.data import randaugment

    plain = train(exact_cfg(idx_dir), 3, image_size=H)
    cfg = exact_cfg(idx_dir, randaugment=(2, 10))
    augmented = train(cfg, 3, image_size=H)
    for step in range(3):
        stored = np.rint(plain[step]["image"] * 127.5 + 127.5).astype(np.uint8)
        for slot in range(8):
            rng = augment.generator(0, augment.RANDAUG_SALT, step, slot)
            expected = randaugment.randaugment(stored[slot], rng, 2, 10)
            got = np.rint(augmented[step]["image"][slot] * 127.5 + 127.5)
            np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(plain[1]["image"], augmented[1]["image"])
    resumed = train(cfg, 1, image_size=H, start_step=2)[0]
    np.testing.assert_array_equal(resumed["image"], augmented[2]["image"])
