"""The paper studies (studies/*.py): every cell of each with --quick, and the shared
machinery (records, skipping finished cells, table, comparison with reported figures)."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from studies import classifier, common, datasize, posemb


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
            mean, std = common.mean_std([100 * r[m] for r in mine])
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
    ],
    ids=["posemb", "classifier", "datasize"],
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
            assert math.isfinite(r[m]) and 0.0 <= r[m] <= 1.0, r
        assert r["quick"] and r["wall_seconds"] > 0
    check_table(out, records, study.SETTINGS, metrics)
    assert (tmp_path / "table.txt").read_text().strip() in out
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
