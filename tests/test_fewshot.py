"""Linear few-shot evaluation: the least-squares fit, shot choice, evaluator and command."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import random_params, run_command, write_three_class_idx

from vit_jax.evaluation import linear

# ---------------------------------------------------------------- the least-squares fit


def augmented_normal_equations(x, y, l2, standardize):
    """Independent reference: standardise, append a ones column, and solve
    ([X 1]^T [X 1] + diag(l2, ..., l2, 0)) [W; b] = [X 1]^T Y (bias not regularised)."""
    mean, std = x.mean(0), x.std(0)
    xs = (x - mean) / std if standardize else x - mean
    a = np.concatenate([xs, np.ones((len(x), 1))], axis=1)
    penalty = np.diag(np.r_[np.full(x.shape[1], l2), 0.0])
    wb = np.linalg.solve(a.T @ a + penalty, a.T @ y)
    return lambda t: (
        np.concatenate(
            [((t - mean) / std if standardize else t - mean), np.ones((len(t), 1))], axis=1
        )
        @ wb
    )


@pytest.mark.parametrize("n,d", [(40, 6), (12, 30)])  # primal (n >= D) and dual (n < D)
@pytest.mark.parametrize("standardize", [True, False])
def test_fit_matches_normal_equations(n, d, standardize):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 5, d) + rng.normal(size=d)
    y = linear.targets(rng.integers(0, 4, n), 4)
    test = rng.normal(size=(7, d))
    got = linear.fit(x, y, l2=3.0, standardize=standardize)(test)
    want = augmented_normal_equations(x, y, 3.0, standardize)(test)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_fit_without_l2_is_lstsq_with_a_ones_column():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(50, 5)), linear.targets(rng.integers(0, 3, 50), 3)
    wb = np.linalg.lstsq(np.c_[x, np.ones(50)], y, rcond=None)[0]
    fit = linear.fit(x, y, l2=0.0)
    np.testing.assert_allclose(fit.w, wb[:5], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(fit.b, wb[5], rtol=1e-10, atol=1e-10)


def test_fit_without_l2_interpolates_when_underdetermined():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, 20)), linear.targets(np.arange(6) % 3, 3)
    np.testing.assert_allclose(linear.fit(x, y, l2=0.0, standardize=False)(x), y, atol=1e-9)


def test_targets_are_plus_minus_one():
    np.testing.assert_array_equal(linear.targets([2, 0], 3), [[-1, -1, 1], [1, -1, -1]])
    with pytest.raises(ValueError, match="num_classes is 3"):
        linear.targets([3], 3)
    with pytest.raises(ValueError, match="l2=-1"):
        linear.fit(np.ones((2, 2)), np.ones((2, 1)), l2=-1)


# ---------------------------------------------------------------- accuracy and shots


def clustered(rng, centres, per_class, spread):
    """Features around the class centres [K, D]: ([K * per_class, D], labels)."""
    labels = np.repeat(np.arange(len(centres)), per_class)
    return centres[labels] + spread * rng.normal(size=(len(labels), centres.shape[1])), labels


def test_separable_features_give_full_accuracy():
    rng = np.random.default_rng(3)
    centres = 10 * rng.normal(size=(5, 16))
    train_x, train_y = clustered(rng, centres, 30, spread=0.5)
    perm = rng.permutation(len(train_y))  # a shuffled pool: the choice is per class
    test_x, test_y = clustered(rng, centres, 20, spread=0.5)
    acc = linear.fewshot_accuracy(
        train_x[perm], train_y[perm], test_x, test_y, shots=(1, 5, 25), l2=1.0, seed=0
    )
    assert acc == {1: 1.0, 5: 1.0, 25: 1.0}


def test_random_features_give_chance():
    k, rng = 4, np.random.default_rng(4)
    accs = []
    for seed in range(40):
        train_x, test_x = rng.normal(size=(k * 10, 32)), rng.normal(size=(200, 32))
        train_y, test_y = np.repeat(np.arange(k), 10), rng.integers(0, k, 200)
        accs.append(linear.fewshot_accuracy(train_x, train_y, test_x, test_y, (5,), seed=seed)[5])
    # 40 x 200 independent guesses: std of the mean about sqrt(.25 * .75 / 8000) = 0.005.
    assert abs(np.mean(accs) - 1 / k) < 0.025
    assert 0.1 < min(accs) and max(accs) < 0.4


def test_choose_shots_is_seeded_per_class_and_nested():
    labels = np.repeat(np.arange(3), 20)[np.random.default_rng(5).permutation(60)]
    five = linear.choose_shots(labels, 5, seed=7)
    np.testing.assert_array_equal(five, linear.choose_shots(labels, 5, seed=7))
    assert np.bincount(labels[five]).tolist() == [5, 5, 5]
    assert len(set(five.tolist())) == 15
    assert set(linear.choose_shots(labels, 2, seed=7)) <= set(five)  # 2-shot within 5-shot
    assert set(linear.choose_shots(labels, 5, seed=8)) != set(five)
    # Class 1's picks do not depend on the other classes being there.
    only_1 = np.flatnonzero(labels == 1)
    picks = linear.choose_shots(labels[only_1], 5, seed=7)
    np.testing.assert_array_equal(only_1[picks], five[labels[five] == 1])
    with pytest.raises(ValueError, match="class 0 has 20 training examples, fewer than 25"):
        linear.choose_shots(labels, 25, seed=0)


def test_accuracy_is_deterministic_per_seed():
    rng = np.random.default_rng(6)
    centres = rng.normal(size=(3, 8))
    train_x, train_y = clustered(rng, centres, 20, spread=1.0)  # overlapping classes
    test_x, test_y = clustered(rng, centres, 50, spread=1.0)
    args = (train_x, train_y, test_x, test_y, (1, 2))
    by_seed = [linear.fewshot_accuracy(*args, seed=s) for s in range(6)]
    assert linear.fewshot_accuracy(*args, seed=0) == by_seed[0]
    assert len({tuple(a.values()) for a in by_seed}) > 1  # other seeds pick other shots


# ---------------------------------------------------------------- evaluator and command


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    return write_three_class_idx(str(tmp_path_factory.mktemp("fewshot_idx")))


@pytest.fixture(scope="module")
def testing_checkpoint(tmp_path_factory):
    from vit_jax import weights
    from vit_jax.models import get_model

    model = get_model("testing", num_classes=5)
    params = random_params(model, 32)
    path = str(tmp_path_factory.mktemp("ckpt") / "testing.npz")
    weights.save_npz(path, params)
    return path, model, params


def test_extract_features_drops_padding(idx_dir, testing_checkpoint):
    pytest.importorskip("tensorflow")
    from vit_jax import data
    from vit_jax.evaluation import extract_features
    from vit_jax.models import apply_with_intermediates
    from vit_jax.parallel import sharding

    _, model, params = testing_checkpoint
    cfg = data.default_config()
    cfg.data_dir = idx_dir
    batches = list(
        data.eval_iterator(
            cfg, "test", global_batch=8, image_size=32, process_index=0, process_count=1
        )
    )
    feats, labels = extract_features(model, params, batches)
    assert feats.shape == (12, 32) and labels.tolist() == (np.arange(12) % 3).tolist()
    images = np.concatenate([b["image"] for b in batches])[:12]
    want = apply_with_intermediates(model, params, images)[1]["pre_logits"]
    np.testing.assert_allclose(feats, want, atol=1e-5)
    assert len(batches) == 2 and batches[1]["mask"].sum() == 4  # 4 padding examples
    sharded, labels_8 = extract_features(model, params, batches, mesh=sharding.make_mesh())
    np.testing.assert_allclose(sharded, feats, atol=1e-5)  # batch split over 8 devices
    np.testing.assert_array_equal(labels_8, labels)


@pytest.fixture(scope="module")
def independent(idx_dir, testing_checkpoint):
    """{k: accuracy} computed without the evaluator: pre-logits of every image from
    apply_with_intermediates, then linear.fewshot_accuracy. With 10 training images per
    class, the evaluator's pool of max(shots) = 10 per class is the whole train split."""
    pytest.importorskip("tensorflow")
    from vit_jax import data
    from vit_jax.models import apply_with_intermediates

    _, model, params = testing_checkpoint
    cfg = data.default_config()
    cfg.data_dir = idx_dir

    def split(name):
        it = data.eval_iterator(
            cfg, name, global_batch=64, image_size=32, process_index=0, process_count=1
        )
        batches = list(it)
        b = batches[0]  # one batch holds the whole split
        keep = b["mask"] > 0
        feats = apply_with_intermediates(model, params, b["image"][keep])[1]["pre_logits"]
        return np.asarray(feats), np.argmax(b["label"][keep], -1)

    (train_x, train_y), (test_x, test_y) = split("train"), split("test")
    assert len(train_y) == 30 and len(test_y) == 12
    return linear.fewshot_accuracy(train_x, train_y, test_x, test_y, (1, 10), 1.0, seed=0)


def test_evaluator_matches_an_independent_computation(idx_dir, testing_checkpoint, independent):
    from vit_jax.evaluation import FewShotEvaluator
    from vit_jax.parallel import sharding

    _, model, params = testing_checkpoint
    ev = FewShotEvaluator(
        [{"source": "idx", "name": "bands", "data_dir": idx_dir}],
        shots=(1, 10),
        l2=1.0,
        seed=0,
        image_size=32,
        batch_size=8,
    )
    got = ev.run(model, params)
    assert sorted(got) == ["fewshot/bands_10shot", "fewshot/bands_1shot"]
    assert got == {f"fewshot/bands_{k}shot": acc for k, acc in independent.items()}
    assert independent[1] < independent[10]  # more shots help: the numbers are not constant
    assert ev.run(model, params, mesh=sharding.make_mesh()) == got  # over 8 devices
    with pytest.raises(ValueError, match="batch_size=6 does not split over the mesh's 8"):
        odd = FewShotEvaluator([{"data_dir": idx_dir}], shots=(1,), image_size=32, batch_size=6)
        odd.run(model, params, mesh=sharding.make_mesh())
    with pytest.raises(ValueError, match="unknown field"):
        FewShotEvaluator([{"nmae": "x"}])
    with pytest.raises(ValueError, match="share a name"):
        FewShotEvaluator([{"name": "a"}, {"name": "a"}])


def test_command_prints_the_table(idx_dir, testing_checkpoint, independent, capsys):
    from vit_jax import fewshot
    from vit_jax.evaluation import FewShotEvaluator

    path, model, params = testing_checkpoint
    args = [f"--checkpoint={path}", "--dataset=fashion_mnist", f"--data_dir={idx_dir}"]
    assert run_command(fewshot, *args, "--shots=1,10", "--l2=1") == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert lines[0].startswith(f"linear few-shot accuracy of the model ({path}) at 32x32")
    assert lines[1].split() == ["dataset", "1-shot", "10-shot"]
    name, *cells = lines[2].split()
    assert name == "fashion_mnist"
    ev = FewShotEvaluator(
        [{"source": "idx", "name": "fashion_mnist", "data_dir": idx_dir}],
        shots=(1, 10),
        l2=1.0,
        image_size=32,
        batch_size=64,
    )
    want = ev.run(model, params)  # the head the command drops does not change features
    assert cells == [f"{100 * want[f'fewshot/fashion_mnist_{k}shot']:.2f}%" for k in (1, 10)]
    assert cells == [f"{100 * independent[k]:.2f}%" for k in (1, 10)]
    assert "INFO" not in captured.err and "TPU" not in captured.err  # no library log noise
    assert run_command(fewshot, *args, "--shots=1,five") == 1
    assert "error: --shots=1,five: expected integers" in capsys.readouterr().err


def test_table_columns_align_for_wide_shot_counts():
    from vit_jax.fewshot import format_table

    results = {"fashion_mnist": {10: 0.5, 5000: 1.0}, "x": {10: 0.0625}}  # x: no 5000-shot
    lines = format_table(results).splitlines()
    assert lines[0].split() == ["dataset", "10-shot", "5000-shot"]  # not '10-shot5000-shot'
    assert lines[1].split() == ["fashion_mnist", "50.00%", "100.00%"]
    assert lines[2].split() == ["x", "6.25%", "-"]
    # right-aligned: every cell ends where its header ends; columns two spaces apart or more
    ends = [[m.end() for m in re.finditer(r"\S+", line)][1:] for line in lines]
    assert ends[0] == ends[1] == ends[2]
    assert min(len(gap) for line in lines for gap in re.findall(r"(?<=\S) +(?=\S)", line)) >= 2


def test_metric_names_round_trip_per_dataset():
    from vit_jax.evaluation import by_dataset, metric_name

    flat = {metric_name(d, k): k / 100 + (d == "b") for d in ("a_b", "b") for k in (25, 1, 5)}
    flat.update({"accuracy": 0.5, "fewshot/x": 1.0})  # not few-shot accuracies: ignored
    assert metric_name("fashion_mnist", 5) == "fewshot/fashion_mnist_5shot"
    got = by_dataset(flat)
    assert got == {"a_b": {1: 0.01, 5: 0.05, 25: 0.25}, "b": {1: 1.01, 5: 1.05, 25: 1.25}}
    assert [list(row) for row in got.values()] == [[1, 5, 25], [1, 5, 25]]
