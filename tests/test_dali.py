"""dataset.decoder='dali': NVIDIA DALI decodes, crops, resizes, flips and normalises the
batches the host plans (vit_jax/data/dali.py). Here DALI runs its CPU decoder; on the
8 emulated devices, one pipeline per device, as on a GPU host.

What is held: the pixels are the tf_bilinear resize of an accurate-DCT decode (1e-5),
within a few grey levels of the host's tf_bilinear batch (TensorFlow's fast DCT); the
windows, flips, labels, mixup and padding are the host pipeline's; a resumed iterator
yields what the uninterrupted one does; the per-device path gives the same batch and
hands the loop arrays it keeps where they are."""

import gc
import os
import sys
import threading

import numpy as np
import pytest
from helpers import MISSING
from PIL import Image

from vit_jax import data
from vit_jax.data import config as config_lib
from vit_jax.data import pixels

# setup.sh installs DALI where NVIDIA builds it (Linux): there, CI fails if it is missing.
if sys.platform == "linux":
    pytest.importorskip("nvidia.dali", reason=f"{MISSING} nvidia-dali-cuda120 (setup.sh)")
else:
    pytest.skip("NVIDIA DALI is built for Linux only", allow_module_level=True)

SIZE = (40, 56)  # not square: DALI's size order is held too
LEVEL = 2 / 255  # one grey level in [-1, 1] units


def _image(h, w, seed):
    """Smooth random RGB (JPEG-friendly: edges would make the DCTs differ more)."""
    rng = np.random.default_rng(seed)
    small = (rng.random((h // 6 + 2, w // 6 + 2, 3)) * 255).astype(np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))


def _folder(root, n_per_class=5):
    """train/{a,b} and test/{a,b}: JPEGs of odd sizes, a grey one, an EXIF-rotated one
    (orientation 6) and a PNG."""
    k = 0
    for split in ("train", "test"):
        for name in ("a", "b"):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n_per_class):
                k += 1
                image = Image.fromarray(_image(61 + 7 * i, 83 + 5 * k, k))
                if i == 1:
                    image.convert("L").save(d / f"{i}.jpg", quality=92)
                elif i == 2:
                    exif = Image.Exif()
                    exif[0x0112] = 6
                    image.save(d / f"{i}.jpg", quality=92, exif=exif)
                elif i == 3:
                    image.save(d / f"{i}.png")
                else:
                    image.save(d / f"{i}.jpeg", quality=92)
    return root


def _cfg(root, **overrides):
    cfg = data.default_config()
    cfg.source, cfg.data_dir, cfg.threads = "folder", str(root), 2
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def _dali(cfg):
    cfg = cfg.copy_and_resolve_references()
    cfg.decoder = "dali"
    return cfg


def _first(it, n=1):
    with it:
        return [next(it) for _ in range(n)]


def test_eval_pixels_are_tf_bilinear_of_an_accurate_decode(tmp_path):
    cfg = _cfg(_folder(tmp_path))
    kw = dict(global_batch=12, image_size=SIZE, process_index=0, process_count=1)
    (got,) = _first(data.eval_iterator(_dali(cfg), "test", **kw))
    (host,) = _first(data.eval_iterator(cfg, "test", **kw))
    assert got["image"].shape == (12, *SIZE, 3) and got["image"].dtype == np.float32
    np.testing.assert_array_equal(got["mask"], host["mask"])
    np.testing.assert_array_equal(got["label"], host["label"])
    assert np.all(got["image"][10:] == 0.0)  # the padding, as the host's
    # Against pixels.py's own steps with the accurate DCT: the same to float rounding.
    table = data.pipeline.tables.open_table(cfg, "test")
    for j in range(10):
        raw, _ = table.example(j)
        decoded = pixels.decode(raw, "pil_antialias")  # accurate DCT, upright, RGB
        want = pixels.normalize(pixels.resize(decoded, SIZE, "tf_bilinear"))
        np.testing.assert_allclose(got["image"][j], want, atol=1e-5)
    # The host's tf_bilinear (TensorFlow's fast DCT) is a few levels off, under one on average.
    diff = np.abs(got["image"][:10] - host["image"][:10])
    assert diff.max() <= 8 * LEVEL and diff.mean() < LEVEL  # measured: 5.9 and 0.8 levels


def test_train_batches_crop_flip_and_mix_as_the_host(tmp_path):
    cfg = _cfg(_folder(tmp_path), mixup=0.4, label_smoothing=0.1)
    kw = dict(global_batch=8, image_size=SIZE, seed=3, start_step=0)
    got = _first(data.train_iterator(_dali(cfg), process_index=0, process_count=1, **kw), 3)
    host = _first(data.train_iterator(cfg, process_index=0, process_count=1, **kw), 3)
    for g, h in zip(got, host, strict=True):
        np.testing.assert_allclose(g["label"], h["label"], atol=1e-6)
        diff = np.abs(g["image"] - h["image"])
        # The same windows and flips: a misplaced window or flip moves pixels by tens of
        # levels; the two decoders differ by a few.
        assert diff.max() <= 8 * LEVEL and diff.mean() < LEVEL, (diff.max(), diff.mean())
    assert np.abs(got[0]["image"] - got[1]["image"]).mean() > 10 * LEVEL  # steps differ


def test_resume_yields_the_same_batches(tmp_path):
    cfg = _dali(_cfg(_folder(tmp_path), mixup=0.2))
    kw = dict(global_batch=4, image_size=SIZE, seed=5, process_index=0, process_count=1)
    straight = _first(data.train_iterator(cfg, start_step=0, **kw), 4)
    resumed = _first(data.train_iterator(cfg, start_step=2, **kw), 2)
    for a, b in zip(straight[2:], resumed, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])


def test_per_device_pipelines_give_the_same_batch_on_its_devices(tmp_path):
    import jax

    from vit_jax.data import dali
    from vit_jax.data.pipeline import EvalBatch, TrainBatch
    from vit_jax.parallel import sharding

    cfg = _dali(_cfg(_folder(tmp_path), mixup=0.3))
    devices = jax.local_devices()[:4]
    make = TrainBatch(cfg, "train", SIZE, 7, 8, 0, 1)
    plan = lambda s: dali.train_plan(make, s)  # noqa: E731
    with dali.DaliBatches(plan, range(2), SIZE, 8) as it:
        want = [next(it) for _ in range(2)]
    with dali.DaliBatches(plan, range(2), SIZE, 8, devices) as it:
        got = [next(it) for _ in range(2)]
    for g, w in zip(got, want, strict=True):
        assert isinstance(g["image"], jax.Array) and g["image"].sharding.device_set == set(devices)
        np.testing.assert_allclose(np.asarray(g["image"]), w["image"], atol=1e-6)  # mixup too
    # The loop's global batch keeps each device's rows where they are.
    mesh = sharding.make_mesh(devices=devices)
    image = got[0]["image"]
    glob = sharding.global_batch({"image": image, "label": got[0]["label"]}, mesh)
    assert glob["image"].sharding.is_equivalent_to(sharding.batch_sharding(mesh), 4)
    before = {s.device: s.data.unsafe_buffer_pointer() for s in image.addressable_shards}
    after = {s.device: s.data.unsafe_buffer_pointer() for s in glob["image"].addressable_shards}
    assert before == after
    # A mesh that orders the devices otherwise still gets the right rows (copied).
    other_mesh = jax.sharding.Mesh(np.asarray(devices[::-1]).reshape(4, 1), sharding.BATCH_AXES)
    moved = sharding.global_batch({"image": image}, other_mesh)["image"]
    np.testing.assert_array_equal(np.asarray(moved), np.asarray(image))
    # Eval through the devices: padding zeroed there.
    ev = EvalBatch(cfg, "test", SIZE, 0, 10, 8)
    with dali.DaliBatches(lambda k: dali.eval_plan(ev, k), range(2), SIZE, 8, devices) as it:
        second = [next(it) for _ in range(2)][1]
    assert np.all(np.asarray(second["image"])[2:] == 0.0) and second["mask"].sum() == 2


def test_each_eval_example_once_and_the_iterator_ends(tmp_path):
    cfg = _dali(_cfg(_folder(tmp_path)))
    kw = dict(global_batch=3, image_size=SIZE, process_index=0, process_count=1)
    with data.eval_iterator(cfg, "test", **kw) as it:
        batches = list(it)
    assert len(batches) == 4  # 10 examples in batches of 3
    labels = np.concatenate([b["label"][b["mask"] > 0] for b in batches]).argmax(-1)
    np.testing.assert_array_equal(labels, [0] * 5 + [1] * 5)


def _dali_threads() -> int:
    """DALI's own threads (the OS names them '[DALI]...'; Python does not see them)."""
    tasks = os.listdir("/proc/self/task")
    names = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read())
        except FileNotFoundError:  # ended while listed
            pass
    return sum(n.startswith("[DALI]") for n in names)


def test_close_stops_every_thread(tmp_path):
    """No thread outlives close(), or the iterator dropped unclosed: Python's (the plans')
    and DALI's own (its executors, thread pools and input workers, per pipeline)."""
    cfg = _dali(_cfg(_folder(tmp_path)))
    kw = dict(global_batch=4, image_size=SIZE, seed=0, process_index=0, process_count=1)
    before, native = set(threading.enumerate()), _dali_threads()
    it = data.train_iterator(cfg, **kw)
    next(it)
    assert _dali_threads() > native  # DALI runs threads of its own while it works
    it.close()
    it.close()  # idempotent
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert _dali_threads() == native
    it = data.train_iterator(cfg, **kw)
    next(it)
    del it
    gc.collect()
    assert _dali_threads() == native


def test_a_corrupt_file_is_named(tmp_path):
    root = _folder(tmp_path)
    bad = root / "test" / "b" / "0.jpeg"
    bad.write_bytes(bad.read_bytes()[:300])  # a JPEG cut short after its header
    cfg = _dali(_cfg(root))
    kw = dict(global_batch=10, image_size=SIZE, process_index=0, process_count=1)
    with pytest.raises(ValueError, match=r"test/b/0\.jpeg does not decode"):
        _first(data.eval_iterator(cfg, "test", **kw))


def test_config_names_what_dali_does_not_take(tmp_path):
    cfg = _cfg(tmp_path, randaugment=(2, 10), preprocessing="pil_antialias", cache=True)
    cfg.decoder = "dali"
    text = "\n".join(str(p) for p in config_lib.problems(cfg))
    for field in ("dataset.randaugment", "dataset.preprocessing", "dataset.cache"):
        assert field in text
    assert "dataset.decoder=host" in text
    idx = data.default_config()
    idx.decoder = "dali"
    assert [p.field for p in config_lib.problems(idx)] == ["dataset.source"]
    idx.decoder = "nvjpeg"
    assert "dataset.decoder" in str(config_lib.problems(idx)[0])


def test_without_dali_the_error_says_how_to_install(tmp_path, monkeypatch):
    from vit_jax.data import dali

    monkeypatch.setattr(dali, "available", lambda: False)
    cfg = _dali(_cfg(_folder(tmp_path)))
    with pytest.raises(ImportError, match="pip install nvidia-dali-cuda120"):
        data.train_iterator(
            cfg, global_batch=4, image_size=SIZE, seed=0, process_index=0, process_count=1
        )


def test_upright_size_reads_headers_only(tmp_path):
    root = _folder(tmp_path)
    for path in sorted((root / "train").rglob("*.*")):
        raw = path.read_bytes()
        assert pixels.upright_size(raw) == pixels.decode(raw).shape[:2], path
    with pytest.raises(ValueError):
        pixels.upright_size(b"not an image")


def test_a_training_run_on_dali_tracks_the_host_run(tmp_path):
    """The whole loop (training, evaluation, export) on DALI's batches ends where the
    same run on the host's does, up to the decoders' few levels."""
    from helpers import tiny_config

    from vit_jax.training import train

    root = _folder(tmp_path / "images")
    summaries = {}
    for decoder in ("host", "dali"):
        config = tiny_config(total_steps=4, checkpoint_every=4, eval_every=4, log_every=2)
        config.update(batch_size=8, eval_batch_size=8)
        config.dataset.update(source="folder", data_dir=str(root), decoder=decoder)
        config.dataset.update(train_split="train", test_split="test", threads=2)
        summaries[decoder] = train.run(config, str(tmp_path / decoder))
    host, dali = summaries["host"], summaries["dali"]
    assert dali["steps"] == 4
    assert dali["train_loss"] == pytest.approx(host["train_loss"], abs=0.02)
    assert dali["eval_loss"] == pytest.approx(host["eval_loss"], abs=0.02)
