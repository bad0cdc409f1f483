"""DINO's k-NN classifier (vit_jax/evaluation/knn.py) against a NumPy reading of its rule,
and its rows and fields in the fewshot and evaluate commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_command
from test_fewshot import idx_dir, testing_checkpoint  # noqa: F401 (the commands' fixtures)

from vit_jax.evaluation import knn
from vit_jax.evaluation.linear import choose_shots


def dino_knn(train_x, train_y, test_x, k, t=0.07):
    """DINO's knn_classifier (eval_knn.py), one test example at a time: normalise, the k
    largest cosine similarities, one-hot votes weighted by exp(sim / T), summed per class."""
    train_x = train_x / np.linalg.norm(train_x, axis=1, keepdims=True)
    out = []
    for x in test_x / np.linalg.norm(test_x, axis=1, keepdims=True):
        sim = train_x @ x
        nearest = np.argsort(-sim)[:k]
        probs = np.zeros(train_y.max() + 1)
        for i in nearest:
            probs[train_y[i]] += np.exp(sim[i] / t)
        out.append(np.argmax(probs))
    return np.array(out)


@pytest.mark.parametrize("k", [1, 5, 20, 200])
def test_classifier_is_dinos_rule(k):
    rng = np.random.default_rng(k)
    centres = rng.normal(size=(6, 16))
    train_y, test_y = rng.integers(0, 6, 150), rng.integers(0, 6, 70)
    train_x = centres[train_y] + 1.5 * rng.normal(size=(150, 16))
    test_x = 3.0 * (centres[test_y] + 1.5 * rng.normal(size=(70, 16)))  # scale: cosine only
    want = dino_knn(train_x, train_y, test_x, min(k, 150))  # k = 200: all 150 vote
    got = knn.knn_predict(train_x, train_y, test_x, k, chunk=16)  # 5 chunks, the last short
    np.testing.assert_array_equal(got, want)
    assert 0.3 < np.mean(want == test_y) < 1.0  # neither chance (1/6) nor trivial
    assert knn.knn_accuracy(train_x, train_y, test_x, test_y, k) == np.mean(want == test_y)


def test_the_temperature_weights_the_votes():
    """Two neighbours of class 0 at similarity 0.6 outvote one of class 1 at 0.9 by count
    (k=3), unless exp(sim / 0.07) weighs the nearer one more: e^(0.9/0.07) > 2 e^(0.6/0.07)."""
    train = np.array([[0.6, 0.8], [0.6, -0.8], [0.9, np.sqrt(1 - 0.81)]])
    assert knn.knn_predict(train, np.array([0, 0, 1]), np.array([[1.0, 0.0]]), 3).tolist() == [1]
    flat = knn.knn_predict(train, np.array([0, 0, 1]), np.array([[1.0, 0.0]]), 3, 100.0)
    assert flat.tolist() == [0]  # a high temperature: a plain majority


def features(model, params, idx, split):
    """Pre-logits features and labels of a whole split, without the library's evaluators."""
    from vit_jax import data
    from vit_jax.models import apply_with_intermediates

    cfg = data.default_config()
    cfg.data_dir = idx
    kw = dict(global_batch=64, image_size=32, process_index=0, process_count=1)
    b = next(iter(data.eval_iterator(cfg, split, **kw)))  # one batch: the whole split
    keep = b["mask"] > 0
    feats = apply_with_intermediates(model, params, b["image"][keep])[1]["pre_logits"]
    return np.asarray(feats), np.argmax(b["label"][keep], -1)


def test_fewshot_prints_a_knn_row_on_the_same_shots(idx_dir, testing_checkpoint, capsys):  # noqa: F811
    from vit_jax import fewshot

    pytest.importorskip("tensorflow")
    path, model, params = testing_checkpoint
    args = [f"--checkpoint={path}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
    assert run_command(fewshot, *args, "--shots=1,10", "--l2=1", "--knn_k=5") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith("seed 0; *_knn: 5-NN (T=0.07, k at most K * shots)")
    assert [line.split()[0] for line in lines[1:]] == [
        "dataset",
        "fashion_mnist",
        "fashion_mnist_knn",
    ]
    (train_x, train_y), (test_x, test_y) = (
        features(model, params, idx_dir, s) for s in ("train", "test")
    )
    want = []
    for shots in (1, 10):  # 1 shot: 3 examples, so 3 neighbours vote, not 5
        pool = choose_shots(train_y, shots, 0)
        pred = dino_knn(train_x[pool], train_y[pool], test_x, min(5, len(pool)))
        want.append(f"{100 * np.mean(pred == test_y):.2f}%")
    assert lines[3].split()[1:] == want
    assert run_command(fewshot, *args, "--shots=1", "--knn_k=0") == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3  # no k-NN row


def test_evaluate_adds_knn_top1_against_a_train_split(idx_dir, testing_checkpoint, capsys):  # noqa: F811
    from vit_jax import evaluate

    pytest.importorskip("tensorflow")
    path, model, params = testing_checkpoint
    args = [f"--checkpoint={path}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
    args += ["--progress=false", "--knn_train=train", "--knn_k=7"]
    assert run_command(evaluate, *args) == 0
    line, js = capsys.readouterr().out.strip().splitlines()[-2:]
    (train_x, train_y), (test_x, test_y) = (
        features(model, params, idx_dir, s) for s in ("train", "test")
    )
    acc = np.mean(dino_knn(train_x, train_y, test_x, 7) == test_y)
    assert line.endswith(f"; 7-NN top-1 {100 * acc:.2f}% (against train)")
    result = json.loads(js)
    assert (result["knn_top1"], result["knn_k"], result["knn_train"]) == (acc, 7, "train")
    assert result["examples"] == 12
