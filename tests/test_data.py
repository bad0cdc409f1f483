"""Tests of vit_jax.data: idx, folder and TFDS sources, determinism, resume, sharding."""

from __future__ import annotations

import itertools
import logging
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")
from helpers import write_idx, write_idx_split  # noqa: E402
from PIL import Image  # noqa: E402

from vit_jax import data  # noqa: E402
from vit_jax.data import idx_source, preprocess, splits, subsets  # noqa: E402

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


def test_batched_augmentation_matches_per_example():
    """The in-memory fast path (batched matmuls) equals the per-example TF ops."""
    rng = np.random.default_rng(0)
    seeds = tf.constant(rng.integers(0, 2**31, (16, 2)), tf.int64)
    for shape, size in (((16, 9, 7, 1), (12, 5)), ((16, 20, 20, 3), (32, 32))):
        images = tf.constant(rng.integers(0, 256, shape, np.uint8))
        batched = preprocess.train_batch(images, seeds, size, 0.05, True)
        singles = [preprocess.train_image(images[i], seeds[i], size, 0.05, True) for i in range(16)]
        np.testing.assert_allclose(batched.numpy(), np.stack(singles), atol=1e-5)


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
    return np.repeat(array[..., None], 3, -1) if array.ndim == 2 else array[..., :3]


def test_folder_decodes_gray_rgba_rgb_and_jpeg(tmp_path):
    images = make_folder(tmp_path)
    cfg = folder_cfg(tmp_path)
    assert data.num_classes(cfg) == 2
    assert data.num_examples(cfg, "train") == 4
    for cache in (False, True):
        cfg.cache = cache
        out = eval_all(cfg, "train")
        pixels = np.rint(out["image"] * 127.5 + 127.5)
        for i, name in enumerate(
            ["train/cat/a_gray.png", "train/cat/b_rgba.png", "train/dog/c_rgb.png"]
        ):
            np.testing.assert_array_equal(pixels[i], as_rgb(images[name]))
        np.testing.assert_allclose(pixels[3], 200, atol=3)  # JPEG is lossy
        np.testing.assert_array_equal(out["label"].argmax(1), [0, 0, 1, 1])
    # Training: a JPEG decoded inside its crop window (no cache) equals decode-then-crop.
    runs = []
    for cache in (False, True):
        cfg.cache = cache
        runs.append(train(cfg, 2, global_batch=4, image_size=16))
    for a, b in zip(*runs, strict=True):
        assert a["image"].shape == (4, 16, 16, 3)
        np.testing.assert_array_equal(a["image"], b["image"])


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


# ---- tfds source -------------------------------------------------------------------


def tfds_cfg(name: str, data_dir=None, **overrides):
    return idx_cfg(data_dir, source="tfds", name=name, **overrides)


def test_tfds_mock_cifar10_offline():
    with tfds.testing.mock_data(num_examples=24):
        cfg = tfds_cfg("cifar10", shuffle_buffer=16)
        assert data.num_classes(cfg) == 10
        assert data.num_examples(cfg, "train") == 24
        batch = train(cfg, 1, image_size=16)[0]
        assert batch["image"].shape == (8, 16, 16, 3)
        assert -1 <= batch["image"].min() and batch["image"].max() <= 1
        np.testing.assert_array_equal(batch["label"].sum(1), 1.0)
        labels = np.asarray(
            [int(ex["label"]) for ex in tfds.builder("cifar10").as_dataset(split="test")]
        )
        cfg = tfds_cfg("cifar10", classes=[3, 1, 7])
        keep = np.isin(labels, [3, 1, 7])
        assert data.num_classes(cfg) == 3
        assert data.num_examples(cfg, "test") == keep.sum()
        out = eval_all(cfg, "test", global_batch=8, image_size=32)
        real = out["mask"] == 1
        np.testing.assert_array_equal(
            out["label"][real].argmax(1), [[3, 1, 7].index(c) for c in labels[keep]]
        )


def test_tfds_unknown_name_lists_close_matches():
    with pytest.raises(ValueError, match=r"not a TFDS builder.*'cifar10'"):
        data.num_classes(tfds_cfg("cifar11"))


class TinyShapes(tfds.core.GeneratorBasedBuilder):
    """A prepared-on-the-spot TFDS dataset: image i has all pixels equal to 4 * i."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = {
            "image": tfds.features.Image(shape=(H, W, 3)),
            "label": tfds.features.ClassLabel(num_classes=4),
        }
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 24), "test": self._generate_examples(24, 34)}

    def _generate_examples(self, lo, hi):
        for i in range(lo, hi):
            yield i, {"image": np.full((H, W, 3), 4 * i, np.uint8), "label": i % 4}


@pytest.fixture(scope="module")
def tiny_tfds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("tfds"))
    config = tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP)
    TinyShapes(data_dir=root).download_and_prepare(download_config=config)
    return root


def tfds_ids(images: np.ndarray) -> list[int]:
    return [int(p) // 4 for p in to_pixels(images)[:, 0, 0]]


def test_tfds_not_prepared_says_how(tmp_path):
    """The hint's --data_dir is the root TFDS reads: preparing there makes the same
    config work (a versioned directory would nest as tiny_shapes/1.0.0/tiny_shapes/...)."""
    import re

    from vit_jax.data import tfds_source

    root = str(tmp_path / "tfds")
    cfg = tfds_cfg("tiny_shapes", root)
    with pytest.raises(FileNotFoundError) as raised:
        data.num_examples(cfg, "train")
    message = str(raised.value)
    assert f"not prepared in {root}/tiny_shapes/1.0.0. " in message, message
    found = re.search(r"`tfds build tiny_shapes --data_dir=(\S+)`", message)
    assert found and found[1] == root, message
    assert f"archives in {root}/downloads/manual first" in message
    config = tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP)
    TinyShapes(data_dir=found[1]).download_and_prepare(download_config=config)  # = tfds build
    tfds_source.open_builder.cache_clear()  # a new process: nothing cached from the failure
    tfds_source.split_size.cache_clear()
    assert data.num_examples(cfg, "train") == 24
    # Without a data_dir, the hint names TFDS's default root: where tfds.builder looks.
    default = tfds.builder("tiny_shapes")
    with pytest.raises(FileNotFoundError) as raised:
        data.num_examples(tfds_cfg("tiny_shapes"), "train")
    assert f"not prepared in {default.data_dir}. " in str(raised.value)
    assert f"--data_dir={default.data_dir_root}`" in str(raised.value)
    assert os.path.join(default.data_dir_root, "tiny_shapes", "1.0.0") == str(default.data_dir)


def test_tfds_slices_shares_subsets_and_resume(tiny_tfds):
    cfg = tfds_cfg("tiny_shapes", tiny_tfds, crop_min_area=1.0, flip=False, shuffle_buffer=8)
    assert data.num_examples(cfg, "train[:50%]") == 12
    parts = [eval_all(cfg, "test", process_index=k, process_count=2) for k in (0, 1)]
    ids = [tfds_ids(p["image"][p["mask"] == 1]) for p in parts]
    assert sorted(ids[0] + ids[1]) == list(range(24, 34)) and not set(ids[0]) & set(ids[1])
    cfg.classes = [2, 0]
    out = eval_all(cfg, "test")
    real = out["mask"] == 1
    ids = tfds_ids(out["image"][real])
    assert sorted(ids) == [24, 26, 28, 30, 32]
    expected = [1 - (i % 4) // 2 for i in ids]  # class 2 -> 0, class 0 -> 1
    np.testing.assert_array_equal(out["label"][real].argmax(1), expected)
    share = dict(global_batch=4, process_count=2)
    # 12 train examples of classes 2 and 0, 6 per process: an epoch is 3 steps.
    epoch = [tfds_ids(b["image"]) for k in (0, 1) for b in train(cfg, 3, process_index=k, **share)]
    assert sorted(sum(epoch, [])) == list(range(0, 24, 2))
    full = train(cfg, 6, process_index=1, **share)
    resumed = train(cfg, 2, process_index=1, start_step=4, **share)
    for a, b in zip(full[4:], resumed, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
    cfg.cache = True  # decoded examples in memory: the same stream
    for a, b in zip(full, train(cfg, 6, process_index=1, **share), strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
