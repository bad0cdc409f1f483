"""`python -m vit_jax.evaluate`: top-1/top-5 of a checkpoint equal the training loop's."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vit_jax import checkpoint, train
from vit_jax.configs import fashion_mnist
from vit_jax.evaluate import classify
from vit_jax.formats import convert

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
    model, params, size = checkpoint.load_model(path)
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
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    results = []
    for ckpt in (path, timm_file):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "vit_jax.evaluate",
                f"--checkpoint={ckpt}",
                "--dataset=fashion_mnist",
                f"--split={SPLIT}",
                "--labels=" + ",".join(str(i) for i in range(10)),
            ],
            capture_output=True,
            text=True,
            env=env,
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
    assert classify.read_label_map("3, 1,2") == [3, 1, 2]
    with pytest.raises(ValueError, match="head class indices"):
        classify.read_label_map("cat,dog")
