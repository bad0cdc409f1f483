"""`python -m vit_jax.evaluate`: top-1/top-5 of a checkpoint equal the training loop's."""

import gzip
import json
import os
import re

import numpy as np
import pytest
from helpers import logits, python_m, random_params, run_command
from PIL import Image

from vit_jax import weights
from vit_jax.configs import fashion_mnist
from vit_jax.data import DEFAULT_IDX_DIR
from vit_jax.evaluation import classify
from vit_jax.models import get_model
from vit_jax.training import train
from vit_jax.weights import convert

SPLIT = "test[:256]"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Fashion-MNIST classifier trained here: (final.npz, the loop's summary)."""
    workdir = tmp_path_factory.mktemp("fm")
    config = fashion_mnist.get_config("tiny")
    config.dataset.test_split = SPLIT
    summary = train.run(config, str(workdir))
    return workdir / "final.npz", summary


@pytest.mark.slow
def test_accuracy_equals_the_training_loops_own(trained):
    path, summary = trained
    model, params, size = weights.load_model(path)
    dataset = {"source": "idx", "name": "fashion_mnist"}
    got = classify.evaluate(model, params, dataset, SPLIT, size, 64, progress=False)
    assert got["examples"] == 256
    assert got["top1"] == summary["accuracy"]
    assert got["top1"] <= got["top5"] <= 1.0


@pytest.mark.slow
def test_command_prints_json_for_any_format(trained, tmp_path):
    path, summary = trained
    timm_file = tmp_path / "m.safetensors"
    convert.convert(path, "timm", timm_file)
    results = []
    for ckpt in (path, timm_file):
        run = python_m(
            "vit_jax.evaluate",
            f"--checkpoint={ckpt}",
            "--dataset=fashion_mnist",
            f"--split={SPLIT}",
            "--labels=" + ",".join(str(i) for i in range(10)),
        )
        assert run.returncode == 0, run.stderr
        assert "top-1" in run.stdout and "evaluate fashion_mnist" in run.stderr  # progress bar
        results.append(json.loads(run.stdout.strip().splitlines()[-1]))
    assert results[0]["top1"] == results[1]["top1"] == summary["accuracy"]
    assert results[0]["image_size"] == [28, 28] and results[0]["examples"] == 256


class _Fixed:
    """A model stand-in whose logits are the batch's 'image' itself."""

    def apply(self, variables, x, train=False):
        return x


def test_label_map_and_top5():
    logits = np.array([[0.0, 9, 8, 7, 6, 5, 1], [9.0, 0, 1, 2, 3, 4, 8]], np.float32)
    batch = {"image": logits, "label": np.eye(3)[[0, 1]], "mask": np.ones(2)}
    # dataset classes 0 and 1 are both head class 1: the second row ranks it last
    got = classify.counts(_Fixed(), None, [batch], label_map=[1, 1, 2])
    assert got == {"examples": 2, "top1": 1, "top5": 1}
    got = classify.counts(_Fixed(), None, [batch], label_map=[5, 0, 2])  # 5: top-5 only
    assert got == {"examples": 2, "top1": 1, "top5": 2}
    from vit_jax.evaluate import parse_labels  # the command's flag parsing

    assert parse_labels("3, 1,2") == [3, 1, 2]
    with pytest.raises(ValueError, match="--labels=cat,dog: expected head class indices"):
        parse_labels("cat,dog")


# ---------------------------------------------------------------- heads trained on a class subset


def read_idx(path: str) -> np.ndarray:
    """An idx file read with gzip and NumPy alone (not vit_jax.data)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def top1_hits(model, params, images, labels, classes) -> tuple[int, int]:
    """(examples, correct) of the head on the images of `classes`, class classes[i] -> i;
    uint8 [N, H, W] or [N, H, W, 3] images scaled to [-1, 1] here, the model applied here."""
    keep = np.isin(labels, classes)
    x = (images[keep].astype(np.float32) - 127.5) / 127.5
    if x.ndim == 3:
        x = np.repeat(x[..., None], 3, axis=-1)
    want = np.asarray([list(classes).index(c) for c in labels[keep]])
    got = np.argmax(logits(model, params, x, train=False), -1)
    return int(keep.sum()), int(np.sum(got == want))


@pytest.fixture(scope="module")
def five_class_head(tmp_path_factory):
    """A 5-class checkpoint for 28 px (the recipe's fine-tuned head has 5 classes)."""
    model = get_model("testing", num_classes=5, patch_size=7)
    params = random_params(model, 28, seed=3)
    path = tmp_path_factory.mktemp("five") / "final.npz"
    weights.save_npz(str(path), params)
    return str(path), model, params


def test_subset_head_on_the_embedded_data_as_a_user_runs_it(five_class_head):
    path, model, params = five_class_head
    if not os.path.exists(f"{DEFAULT_IDX_DIR}/t10k-labels-idx1-ubyte.gz"):
        pytest.skip("the embedded Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    classes = [5, 6, 7, 8, 9]
    run = python_m(
        "vit_jax.evaluate",
        f"--checkpoint={path}",
        "--dataset=fashion_mnist",
        "--split=test[:300]",
        "--classes=5,6,7,8,9",
    )
    assert run.returncode == 0, run.stderr
    line, js = run.stdout.strip().splitlines()[-2:]
    images = read_idx(f"{DEFAULT_IDX_DIR}/t10k-images-idx3-ubyte.gz")[:300]
    labels = read_idx(f"{DEFAULT_IDX_DIR}/t10k-labels-idx1-ubyte.gz")[:300]
    n, hits = top1_hits(model, params, images, labels, classes)
    assert 100 < n < 200  # classes 5-9 of 300 test images
    found = re.search(r"classes 5,6,7,8,9 \((\d+) images\): top-1 ([\d.]+)%", line)
    assert found, line
    assert int(found[1]) == n and found[2] == f"{100 * hits / n:.2f}"
    result = json.loads(js)
    assert result["examples"] == n and result["top1"] == hits / n
    assert result["classes"] == classes
    assert "top5" not in result and "top-5" not in line  # 5 classes: top-5 is always 100%


def test_a_narrow_head_error_names_the_flag(five_class_head, capsys):
    from vit_jax import evaluate as command

    if not os.path.exists(f"{DEFAULT_IDX_DIR}/t10k-labels-idx1-ubyte.gz"):
        pytest.skip("the embedded Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    path, _, _ = five_class_head
    args = [f"--checkpoint={path}", "--dataset=fashion_mnist", "--split=test[:10]"]
    assert run_command(command, *args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: fashion_mnist has 10 classes, the checkpoint's head 5: ")
    assert "pass --classes=ID,... with the 5 dataset class ids the head was trained on" in err
    assert "pretrain/final.npz: --classes=0,1,2,3,4" in err
    assert "finetune/ and scratch/ final.npz: --classes=5,6,7,8,9" in err
    assert run_command(command, *args, "--classes=5,6,x") == 1
    assert "error: --classes=5,6,x: expected distinct dataset class ids" in capsys.readouterr().err


def test_an_image_folder_needs_only_the_evaluated_split(five_class_head, tmp_path, capsys):
    """test/<class>/*.png and no train/: six classes, the head's five in reverse order."""
    from vit_jax import evaluate as command

    path, model, params = five_class_head
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (18, 28, 28, 3), dtype=np.uint8)
    labels = np.arange(18) % 6
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        os.makedirs(tmp_path / "test" / f"c{label}", exist_ok=True)
        Image.fromarray(image).save(tmp_path / "test" / f"c{label}" / f"{i:02d}.png")
    classes = [5, 4, 3, 2, 1]
    n, hits = top1_hits(model, params, images, labels, classes)
    args = [f"--checkpoint={path}", "--dataset=mine", "--source=folder", "--progress=false"]
    assert run_command(command, *args, f"--data_dir={tmp_path}", "--classes=5,4,3,2,1") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert n == result["examples"] == 15 and result["top1"] == hits / n
    assert run_command(command, *args) == 1
    assert "--source=folder needs --data_dir=DIR" in capsys.readouterr().err


def test_a_corrupt_file_in_a_folder_is_named_and_skip_corrupt_leaves_it_out(
    five_class_head, tmp_path, capsys
):
    """The error names the flag that leaves it out, and evaluate has that flag."""
    from vit_jax import evaluate as command

    path, model, params = five_class_head
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (10, 28, 28, 3), dtype=np.uint8)
    labels = np.arange(10) % 5
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        os.makedirs(tmp_path / "test" / f"c{label}", exist_ok=True)
        Image.fromarray(image).save(tmp_path / "test" / f"c{label}" / f"{i:02d}.png")
    (tmp_path / "test" / "c0" / "zz.png").write_bytes(b"\x89PNG not a png")
    args = [f"--checkpoint={path}", "--dataset=mine", "--source=folder", "--progress=false"]
    args += [f"--data_dir={tmp_path}", "--classes=0,1,2,3,4"]
    assert run_command(command, *args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "zz.png" in err and "--skip_corrupt" in err
    assert run_command(command, *args, "--skip_corrupt") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    n, hits = top1_hits(model, params, images, labels, [0, 1, 2, 3, 4])
    assert result["examples"] == n == 10 and result["top1"] == hits / n


def test_the_library_names_arguments_not_flags(five_class_head):
    """classify.evaluate, called as a library: the narrow-head error names the dataset's
    'classes' and the label_map argument; flags are the command's words alone."""
    from vit_jax.evaluation import classify

    if not os.path.exists(f"{DEFAULT_IDX_DIR}/t10k-labels-idx1-ubyte.gz"):
        pytest.skip("the embedded Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    _, model, params = five_class_head
    dataset = {"source": "idx", "name": "fashion_mnist"}
    with pytest.raises(classify.NarrowHead) as error:
        classify.evaluate(model, params, dataset, "test[:10]", 28, progress=False)
    message = str(error.value)
    assert "--" not in message
    assert "pass dataset classes=ID,... with the 5 dataset class ids" in message
    assert "the recipe's pretrain/final.npz: dataset classes=(0, 1, 2, 3, 4)" in message
    assert message.endswith("or label_map with the head class of each dataset class")
