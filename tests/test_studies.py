"""The paper studies (studies/*.py): every cell of each with --quick, and the shared
machinery (records, skipping finished cells, table, comparison with reported figures)."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest
from helpers import needs_embedded_data

from studies import augreg, classifier, common, datasize, lora, naflex, posemb


def table_rows(text: str) -> dict[str, list[str]]:
    """{setting: [cells after it]} of the markdown table lines in `text`."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and cells[0] != "setting":
            rows[cells[0]] = cells[1:]
    return rows


def check_table(text: str, records: list[dict], settings, metrics) -> None:
    """Each setting's row holds its seeds and, per metric, mean ± std of the records."""
    rows = table_rows(text)
    assert set(rows) == set(settings)
    for s in settings:
        mine = [r for r in records if r["setting"] == s]
        assert rows[s][0] == ",".join(str(r["seed"]) for r in mine)
        for i, m in enumerate(metrics):
            scale = 1 if m in common.PLAIN else 100
            mean, std = common.mean_std([scale * r[m] for r in mine])
            shown = re.fullmatch(r"(-?[\d.]+) ± ([\d.]+)", rows[s][1 + i])
            assert shown, rows[s]
            assert float(shown[1]) == pytest.approx(mean, abs=0.006)
            assert float(shown[2]) == pytest.approx(std, abs=0.006)


@pytest.mark.parametrize(
    "study, seeds, metrics",
    [
        pytest.param(posemb, (0,), ("accuracy",), marks=pytest.mark.slow),
        pytest.param(classifier, (0,), ("accuracy",), marks=pytest.mark.slow),
        pytest.param(
            datasize,
            (0,),
            ("accuracy", "finetune_accuracy", "pretrain_accuracy"),
            marks=pytest.mark.slow,
        ),
        pytest.param(augreg, (0,), ("accuracy", "train_accuracy", "gap"), marks=pytest.mark.slow),
        pytest.param(lora, (0,), ("accuracy", "step_ms", "mib"), marks=pytest.mark.slow),
        pytest.param(naflex, (0,), ("accuracy", "squareish", "elongated"), marks=pytest.mark.slow),
    ],
    ids=["posemb", "classifier", "datasize", "augreg", "lora", "naflex"],
)
def test_quick_study_runs_every_cell(study, seeds, metrics, tmp_path, capsys):
    argv = ["--quick", f"--seeds={','.join(map(str, seeds))}", f"--workdir={tmp_path}"]
    study.main(argv)
    out = capsys.readouterr().out
    with open(tmp_path / "results.json") as f:
        records = json.load(f)
    cells = sorted((r["setting"], r["seed"]) for r in records)
    assert cells == sorted((s, seed) for s in study.SETTINGS for seed in seeds)
    for r in records:
        for m in metrics:
            low = -1.0 if m == "gap" else 0.0  # a difference of two accuracies
            high = math.inf if m in common.PLAIN else 1.0
            assert math.isfinite(r[m]) and low <= r[m] <= high, r
        assert r["quick"] and r["wall_seconds"] > 0
    table = (tmp_path / "table.txt").read_text().strip()  # a summary may print other tables
    check_table(table, records, study.SETTINGS, metrics)
    assert table in out
    assert os.path.getsize(tmp_path / f"{study.NAME}.png") > 1000


def fake_cell(calls: list):
    def cell(setting: str, seed: int, workdir: str, quick: bool) -> dict:
        calls.append((setting, seed))
        return {"accuracy": 0.5 + 0.1 * seed + (0.05 if setting == "b" else 0.0)}

    return cell


def test_finished_cells_are_skipped_and_tabled(tmp_path, capsys):
    calls = []
    argv = ["--seeds=0,1,2", f"--workdir={tmp_path}"]
    common.run_study("fake", ("a", "b"), fake_cell(calls), argv)
    assert sorted(calls) == [(s, k) for s in "ab" for k in range(3)]
    rows = table_rows(capsys.readouterr().out)
    assert rows["a"][:2] == ["0,1,2", "60.00 ± 10.00"]
    assert rows["b"][:2] == ["0,1,2", "65.00 ± 10.00"]
    calls.clear()
    records = common.run_study("fake", ("a", "b"), fake_cell(calls), argv)
    assert calls == [] and len(records) == 6  # read back from each cell's record.json


def test_only_reruns_one_cell_and_compares(tmp_path, monkeypatch, capsys):
    reported = [{"setting": "b", "seed": 1, "accuracy": 0.6}]
    (tmp_path / "fake.json").write_text(json.dumps(reported))
    monkeypatch.setattr(common, "REPORTED_DIR", str(tmp_path))
    calls = []
    argv = ["--only=b", "--seeds=1", f"--workdir={tmp_path / 'run'}"]
    common.run_study("fake", ("a", "b"), fake_cell(calls), argv)
    assert calls == [("b", 1)]
    assert "now 65.00%, reported 60.00% (+5.00 points)" in capsys.readouterr().out


def test_only_must_name_a_setting(tmp_path):
    with pytest.raises(SystemExit):
        common.parse_flags(["--only=c", f"--workdir={tmp_path}"], ("a", "b"))


def test_classifier_summary_picks_each_heads_best_lr():
    acc = {"token_lr1e-3": 0.8, "token_lr3e-3": 0.7, "gap_lr1e-3": 0.6, "gap_lr3e-4": 0.82}
    records = [{"setting": s, "seed": 0, "accuracy": a} for s, a in acc.items()]
    assert classifier.best(records) == {"token": "token_lr1e-3", "gap": "gap_lr3e-4"}
    assert "gap at the token's best lr (gap_lr1e-3): 60.00" in classifier.summary(records)


def test_augreg_cells_take_the_augreg_presets():
    from vit_jax.configs import augreg as presets

    for setting in augreg.SETTINGS:
        aug, size = augreg.parse_setting(setting)
        c = augreg.config(setting, seed=2)
        mixup, randaug = presets.SETTINGS[aug]
        assert c.dataset.mixup == mixup and c.dataset.randaugment == randaug
        assert c.model.dropout == c.model.stochastic_depth == (0.0 if aug == "none" else 0.1)
        assert c.dataset.examples_per_class == augreg.SIZES[size]
        assert c.total_steps == augreg.STEPS and c.seed == 2 and c.dataset.classes is None


def test_augreg_none_equivalent_interpolates_in_log_images():
    curve = [(100, 0.4), (1000, 0.6), (10000, 0.7)]
    assert augreg.none_equivalent(0.6, curve) == pytest.approx(1000)
    assert augreg.none_equivalent(0.5, curve) == pytest.approx(math.sqrt(10) * 100)
    assert augreg.none_equivalent(0.65, curve) == pytest.approx(math.sqrt(10) * 1000)
    assert augreg.none_equivalent(0.3, curve) is None  # below the smallest size
    assert augreg.none_equivalent(0.8, curve) is None  # beyond the largest


def test_augreg_summary_pairs_seeds_and_prices_the_gain():
    acc = {"none_100": (0.40, 0.42), "none_1k": (0.60, 0.60), "none_10k": (0.70, 0.70)}
    acc |= {"light1_100": (0.50, 0.54), "medium2_100": (0.30, 0.30), "light1_10k": (0.9, 0.9)}
    records = [
        {"setting": s, "seed": k, "accuracy": a}
        for s, pair in acc.items()
        for k, a in enumerate(pair)
    ]
    lines = augreg.summary(records).splitlines()
    # light1 on 100: +10 and +12 points; its mean 0.52 lies between none's 0.41 and 0.60.
    images = math.exp(math.log(100) + (0.52 - 0.41) / 0.19 * math.log(10))
    assert lines[0] == (
        f"light1 on 100 images: +11.00 ± 1.41 points over none; "
        f"none needs about {images:,.0f} images for it ({images / 100:.1f}x)"
    )
    assert lines[1] == "light1 on 10,000 images: +20.00 ± 0.00 points over none; " + (
        "above none at every size of the grid"
    )
    assert lines[2] == "medium2 on 100 images: -11.00 ± 1.41 points over none; " + (
        "below none at every size of the grid"
    )
    assert len(lines) == 3  # cells without their none pair are left out


@needs_embedded_data
def test_naflex_canvases_hold_one_item_and_crops_are_their_centres(tmp_path):
    from PIL import Image

    naflex.write_data(str(tmp_path), quick=True)
    for split, n in zip(("train", "test"), naflex.QUICK_IMAGES, strict=True):
        files = sorted((tmp_path / "canvas" / split).glob("*/*.png"))
        assert len(files) == n
        shapes = set()
        for f in files:
            canvas = np.asarray(Image.open(f))
            crop = np.asarray(Image.open(tmp_path / "cropped" / split / f.parent.name / f.name))
            h, w = canvas.shape
            assert f.stem.split("_")[1] == naflex.shape_name(h, w) and (h, w) in naflex.SHAPES
            shapes.add((h, w))
            rows, cols = np.nonzero(canvas.any(1))[0], np.nonzero(canvas.any(0))[0]
            assert rows[-1] - rows[0] < 28 and cols[-1] - cols[0] < 28  # one 28x28 item
            s = min(h, w)
            top, left = (h - s) // 2, (w - s) // 2
            np.testing.assert_array_equal(crop, canvas[top : top + s, left : left + s])
        assert shapes == set(naflex.SHAPES)
    assert naflex.write_data(str(tmp_path), quick=True) == str(tmp_path)  # written once


def test_naflex_summary_pairs_seeds_by_canvas():
    def record(setting, seed, acc, square, long):
        shapes = {"28x28": square, "28x84": long}
        budgets = {f"acc_{n}": acc for n in naflex.BUDGETS}
        metrics = dict(accuracy=acc, squareish=square, elongated=long, by_shape=shapes)
        return dict(setting=setting, seed=seed, **metrics, **budgets)

    records = [
        record("naflex_64", 0, 0.60, 0.60, 0.60),
        record("naflex_64", 1, 0.64, 0.58, 0.70),
        record("squash_32", 0, 0.50, 0.62, 0.40),
        record("squash_32", 1, 0.50, 0.60, 0.42),
    ]
    lines = naflex.summary(records).splitlines()
    assert lines[0] == "naflex_64 - squash_32, all canvases: +12.00 ± 2.83 points"
    assert lines[1] == "naflex_64 - squash_32, squareish canvases: -2.00 ± 0.00 points"
    assert lines[2] == "naflex_64 - squash_32, elongated canvases: +24.00 ± 5.66 points"
    assert lines[4] == "| patches (square models' side) | naflex_64 | squash_32 |"
    assert lines[6] == "| 16 (16 px) | 62.00 ± 2.83 | 50.00 ± 0.00 |"
    assert "| 28x84 | 65.0 | 41.0 |" in lines and "| 28x28 | 59.0 | 61.0 |" in lines
    assert "| 56x28 | - | - |" in lines  # no test image of that shape
