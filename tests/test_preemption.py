"""Preemption and shared workdirs: Orbax's two commit modes, the workdir lock, save on
SIGTERM/SIGINT (one process and two), and signals at random moments of a run."""

import os
import shutil

from helpers import assert_npz_equal, tiny_config
from test_storage import flip_bytes

from vit_jax.training import train
from vit_jax.workdir import integrity, recovery
from vit_jax.workdir import manager as manager_lib

# 8 steps, a checkpoint every 2 (2 kept), dropout on: what is restored matters.
RUN = {"total_steps": 8, "checkpoint_every": 2, "keep_checkpoints": 2, "eval_every": 0}
RUN.update({"log_every": 4, "model.dropout": 0.1})


def test_commit_file_mode_on_local_disk_records_falls_back_and_keeps_like_rename(
    tmp_path, monkeypatch, capsys
):
    renamed, committed = str(tmp_path / "rename"), str(tmp_path / "file")
    train.run(tiny_config(**RUN), renamed)
    monkeypatch.setenv(manager_lib.MODE_ENV, "file")
    train.run(tiny_config(**RUN), committed)
    assert_npz_equal(f"{committed}/final.npz", f"{renamed}/final.npz")
    for workdir in (renamed, committed):  # retention: 2 kept; Orbax marks both complete
        checkpoints = f"{workdir}/checkpoints"
        assert sorted(os.listdir(checkpoints)) == ["6", "8"], workdir
        for step in ("6", "8"):
            names = os.listdir(f"{checkpoints}/{step}")
            assert {manager_lib.COMMIT_FILE, integrity.RECORD} <= set(names), names
            record = integrity.read_record(f"{checkpoints}/{step}")
            assert record["files"] and all(f.startswith("default/") for f in record["files"])
    checkpoints = f"{committed}/checkpoints"
    # An interrupted in-place save (no marker), a set-aside checkpoint (no marker either,
    # which Orbax's own clean-up would delete) and a damaged newest complete one.
    shutil.copytree(f"{checkpoints}/8", f"{checkpoints}/10")
    os.remove(f"{checkpoints}/10/{manager_lib.COMMIT_FILE}")
    shutil.copytree(f"{checkpoints}/6", f"{checkpoints}/3.damaged")
    os.remove(f"{checkpoints}/3.damaged/{manager_lib.COMMIT_FILE}")
    flip_bytes(f"{checkpoints}/8")
    assert integrity.step_dirs(checkpoints) == [6, 8]
    rows = dict(recovery.verify_workdir(committed))
    assert rows["10"] == "incomplete (an interrupted save; the next run deletes it)"
    assert rows["6"] == "verifies" and rows["8"].startswith("DAMAGED: file default/"), rows
    monkeypatch.setenv(manager_lib.MODE_ENV, "rename")  # the same directory, read as rename:
    assert integrity.step_dirs(checkpoints) == [6, 8, 10]  # a final name is complete there
    monkeypatch.setenv(manager_lib.MODE_ENV, "file")
    capsys.readouterr()
    os.remove(f"{committed}/summary.json")
    train.run(tiny_config(**RUN), committed)  # 8 is damaged: resumes from 6
    out = capsys.readouterr().out
    assert "ignoring incomplete checkpoint(s) 10 (a save was interrupted)" in out, out
    assert f"checkpoint {checkpoints}/8 is damaged" in out and "resuming from step 6 " in out
    assert sorted(os.listdir(checkpoints)) == ["3.damaged", "6", "8", "8.damaged"]
    assert integrity.step_dirs(checkpoints) == [6, 8]
    assert_npz_equal(f"{committed}/final.npz", f"{renamed}/final.npz")
