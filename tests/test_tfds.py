"""The TFDS source: datasets prepared as ArrayRecord, read by index without TensorFlow
(test_without_tensorflow.py reads one with TensorFlow blocked). Preparing a dataset
needs TensorFlow, so these tests need it too."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")
from test_data import H, W, eval_all, idx_cfg, to_pixels, train  # noqa: E402

from vit_jax import data  # noqa: E402
from vit_jax.data import tfds_source  # noqa: E402


def tfds_cfg(name: str, data_dir=None, **overrides):
    return idx_cfg(data_dir, source="tfds", name=name, **overrides)


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


def prepare(root: str, file_format: str = "array_record") -> None:
    """What `tfds build tiny_shapes --data_dir=ROOT --file_format=...` does."""
    config = tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP)
    TinyShapes(data_dir=root, file_format=file_format).download_and_prepare(download_config=config)


@pytest.fixture(scope="module")
def tiny_tfds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("tfds"))
    prepare(root)
    return root


def tfds_ids(images: np.ndarray) -> list[int]:
    return [int(p) // 4 for p in to_pixels(images)[:, 0, 0]]


def test_tfds_unknown_name_lists_close_matches():
    with pytest.raises(ValueError, match=r"not a TFDS builder nor a dataset prepared.*'cifar10'"):
        data.num_classes(tfds_cfg("cifar11"))


def test_tfds_not_prepared_says_how(tmp_path):
    """The hint's --data_dir is the root TFDS reads: preparing there makes the same
    config work (a versioned directory would nest as tiny_shapes/1.0.0/tiny_shapes/...)."""
    root = str(tmp_path / "tfds")
    cfg = tfds_cfg("tiny_shapes", root)
    with pytest.raises(FileNotFoundError) as raised:
        data.num_examples(cfg, "train")
    message = str(raised.value)
    assert f"not prepared in {root}/tiny_shapes/1.0.0. " in message, message
    found = re.search(r"`tfds build tiny_shapes --data_dir=(\S+) --file_format=(\S+)`", message)
    assert found and found[1] == root and found[2] == "array_record", message
    assert f"archives in {root}/downloads/manual first" in message
    assert not os.path.exists(os.path.join(root, "tiny_shapes")), "nothing prepared by a read"
    prepare(found[1], found[2])  # = the printed tfds build
    tfds_source.open_builder.cache_clear()  # a new process: nothing cached from the failure
    assert data.num_examples(cfg, "train") == 24
    # Without a data_dir, the hint names TFDS's default root: where tfds.builder looks.
    default = tfds.builder("tiny_shapes")
    with pytest.raises(FileNotFoundError) as raised:
        data.num_examples(tfds_cfg("tiny_shapes"), "train")
    assert f"not prepared in {default.data_dir}. " in str(raised.value)
    assert f"--data_dir={default.data_dir_root} " in str(raised.value)


def test_tfrecord_dataset_names_the_array_record_command(tmp_path):
    root = str(tmp_path / "tfrecord")
    prepare(root, "tfrecord")
    with pytest.raises(ValueError) as raised:
        data.num_examples(tfds_cfg("tiny_shapes", root), "train")
    message = str(raised.value)
    assert "prepared as tfrecord, which has no random access" in message, message
    assert f"`tfds build tiny_shapes --data_dir={root} --file_format=array_record`" in message


def test_tfds_slices_shares_subsets_and_resume(tiny_tfds):
    cfg = tfds_cfg("tiny_shapes", tiny_tfds, crop_min_area=1.0, flip=False)
    assert data.num_examples(cfg, "train[:50%]") == 12
    # Storage order (TFDS shuffles when it prepares), read here by TFDS itself.
    stored = tfds.data_source("tiny_shapes", split="test", data_dir=tiny_tfds)
    order = [int(stored[i]["image"][0, 0, 0]) // 4 for i in range(len(stored))]
    assert sorted(order) == list(range(24, 34))
    parts = [eval_all(cfg, "test", process_index=k, process_count=2) for k in (0, 1)]
    ids = [tfds_ids(p["image"][p["mask"] == 1]) for p in parts]
    assert ids == [order[:5], order[5:]]  # contiguous shares of the storage order
    cfg.classes = [2, 0]
    out = eval_all(cfg, "test")
    real = out["mask"] == 1
    ids = tfds_ids(out["image"][real])
    assert ids == [i for i in order if i % 4 in (0, 2)]
    expected = [1 - (i % 4) // 2 for i in ids]  # class 2 -> 0, class 0 -> 1
    np.testing.assert_array_equal(out["label"][real].argmax(1), expected)
    share = dict(global_batch=4, process_count=2)
    # 12 train examples of classes 2 and 0: an epoch is 3 global steps of 4.
    epoch = [tfds_ids(b["image"]) for k in (0, 1) for b in train(cfg, 3, process_index=k, **share)]
    assert sorted(sum(epoch, [])) == list(range(0, 24, 2))
    full = train(cfg, 6, process_index=1, **share)
    resumed = train(cfg, 2, process_index=1, start_step=4, **share)
    for a, b in zip(full[4:], resumed, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])
    cfg.cache = True  # decoded examples in memory: the same stream
    for a, b in zip(full, train(cfg, 6, process_index=1, **share), strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])


def test_tfds_dataset_trains_and_evaluates_without_tensorflow(tiny_tfds):
    """Prepared here (with TensorFlow), read where TensorFlow cannot be found."""
    from test_without_tensorflow import run_without_tf

    out = run_without_tf(f"""
import sys
from vit_jax import data
cfg = data.default_config()
cfg.update(source="tfds", name="tiny_shapes", data_dir={tiny_tfds!r}, crop_min_area=1.0)
cfg.flip = False
batch = next(data.train_iterator(cfg, global_batch=4, image_size=8, seed=0,
                                 process_index=0, process_count=1))
ev = list(data.eval_iterator(cfg, "test", global_batch=4, image_size=8,
                             process_index=0, process_count=1))
print(sorted(int(round(p * 127.5 + 127.5)) // 4 for p in batch["image"][:, 0, 0, 0]))
print(int(sum(b["mask"].sum() for b in ev)), "tensorflow" in sys.modules)
""")
    first, second = out.splitlines()[-2:]
    assert all(0 <= i < 24 for i in eval(first)) and second == "10 False"


def test_a_tfds_dataset_not_prepared_is_one_line_before_anything_else(tmp_path):
    """A user's first run on a TFDS dataset not prepared: the error line comes first and
    alone (TFDS warns of each version folder it looks in: not shown), nothing created."""
    from helpers import python_m

    workdir, root = tmp_path / "run", tmp_path / "tfds"
    done = python_m(
        "vit_jax.main",
        "--config=finetune:b16,cifar10",
        f"--workdir={workdir}",
        "--config.init_from=",
        f"--config.dataset.data_dir={root}",
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 2, done.stderr
    assert lines[0].startswith(
        f"error: --config.dataset.data_dir='{root}': TFDS dataset 'cifar10' is not prepared"
    )
    assert f"tfds build cifar10 --data_dir={root} --file_format=array_record" in lines[0]
    assert not workdir.exists() and not root.exists()
