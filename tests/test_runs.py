"""Runs as a user meets them: Ctrl-C and the same command again, a finished workdir run
again, a missing or misfit init_from, failed runs' directories, the ETA and progress
lines in a log file."""

import io
import json
import os
import re
import signal
import threading
import time

import pytest
from helpers import initial_params, needs_embedded_data, run_command, snapshot, tiny_config
from subprocesses import Run, tiny_flags

from vit_jax import main, weights
from vit_jax.base import console
from vit_jax.training import report, stopping, train
from vit_jax.training import state as state_lib
from vit_jax.weights import CheckpointError
from vit_jax.workdir import record
from vit_jax.workdir.workdir import Plan, Workdir

# 1 device; saves at 5, 10, 15, 20; a log line every step, so Ctrl-C lands mid-run.
RUN = dict(total_steps=20, checkpoint_every=5, log_every=1, eval_every=20)


@pytest.mark.slow  # four processes, about a minute on 2 cores
@needs_embedded_data
def test_ctrl_c_says_where_then_resumes_and_a_finished_rerun_changes_nothing(tmp_path):
    workdir = str(tmp_path / "run")
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    # Ctrl-C while the first step compiles (a fresh cache: XLA's threads are at work). The
    # interpreter's shutdown used to crash there (SIGSEGV, or a hang) after the line.
    early = str(tmp_path / "early")
    with Run(tiny_flags(early, **RUN), devices=1, env=cache) as run:
        run.wait_for(lambda line: "compiling the first step" in line)
        time.sleep(0.5)
        os.kill(run.proc.pid, signal.SIGINT)
        assert run.finish() == 130, run.tail()
    # The handler is in place once the loop says it compiles: the step in flight ends.
    notice = stopping.StopRequest.NOTICE.decode().strip()
    assert notice in run.log and "Exception ignored" not in "\n".join(run.log), run.tail()
    assert run.log[-1] == (  # the step in flight is saved
        f"stopped at step 1 by SIGINT; checkpoint 1 saved ({early}/checkpoints/1); "
        "rerun the same command to resume"
    )

    with Run(tiny_flags(workdir, **RUN), devices=1, env=cache) as run:
        run.wait_for(lambda line: line.startswith("step 7/20"))
        os.kill(run.proc.pid, signal.SIGINT)
        assert run.finish() == 130, run.tail()
    assert "Traceback" not in "\n".join(run.log) and "KeyboardInterrupt" not in run.log[-1]
    found = re.fullmatch(
        r"stopped at step (\d+) by SIGINT; checkpoint \1 saved \((\S+)\); "
        "rerun the same command to resume",
        run.log[-1],
    )
    assert found, run.tail()
    stopped = newest = int(found[1])  # no step lost
    assert 7 <= stopped < 20 and found[2] == f"{workdir}/checkpoints/{newest}"
    assert os.path.isdir(found[2])

    with Run(tiny_flags(workdir, **RUN), devices=1, env=cache) as run:
        assert run.finish() == 0, run.tail()
    log = "\n".join(run.log)
    assert f"resuming from step {newest} " in log and f"step {newest + 1}/20" in log
    assert "step 20/20" in log and "step 1/20" not in log
    summary = json.load(open(f"{workdir}/summary.json"))
    assert summary["steps"] == 20 and summary["train_loss"] is not None

    # The same command once more: nothing to do, nothing written, the stored results.
    before = snapshot(workdir)
    with Run(tiny_flags(workdir, **RUN), devices=1, env=cache) as run:
        assert run.finish() == 0, run.tail()
    assert snapshot(workdir) == before
    assert run.log[0] == f"{workdir}: finished at step 20 (summary.json); nothing to do"
    accuracy, loss = summary["accuracy"], summary["eval_loss"]
    assert run.log[1] == f"step 20: test accuracy {accuracy:.4f}, loss {loss:.4f}"
    assert not any(line.startswith(("resuming", "training", "step 20/20")) for line in run.log)


def test_interrupted_command_prints_one_line_and_exits_130(capsys):
    class Command:
        __name__ = "vit_jax.fake"

        @staticmethod
        def define_flags():
            pass

        @staticmethod
        def main():
            raise stopping.Interrupted(stopping.where_stopped(37, None))

    assert run_command(Command) == 130
    err = capsys.readouterr().err
    assert err == (
        "interrupted at step 37. There is no intact checkpoint yet; a rerun starts from step 0\n"
    )


def test_finished_means_this_config_ran_to_its_end(tmp_path):

    # What a finished run leaves: summary.json, final.npz, the last checkpoint's record.
    c = tiny_config(total_steps=4)
    step_dir = tmp_path / "checkpoints" / "4"
    step_dir.mkdir(parents=True)
    saved = {"format": record.FORMAT, "step": 4, "arrays": {}, "files": {}}
    (step_dir / record.NAME).write_text(json.dumps(dict(saved, state=Plan.of(c).state)))
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 4, "accuracy": 0.5}))
    (tmp_path / "final.npz").write_bytes(b"")
    finished = lambda config: Workdir.at(tmp_path).finished(Plan.of(config))
    assert finished(c) == {"steps": 4, "accuracy": 0.5}
    assert finished(tiny_config(total_steps=3)) is not None
    assert finished(tiny_config(total_steps=8)) is None  # resumes
    assert finished(tiny_config(total_steps=4, **{"model.width": 64})) is None  # does not fit
    assert finished(tiny_config(total_steps=4, **{"optimizer.lr": 0.1})) is None
    os.remove(tmp_path / "final.npz")  # killed before the export: the run writes it
    assert finished(c) is None
    assert finished(tiny_config(total_steps=4, export_npz=False))
    (tmp_path / "summary.json").write_text("{")  # half-written by some other tool
    assert finished(tiny_config(total_steps=4, export_npz=False)) is None


def test_eta_leaves_out_the_compile_step():
    now = [100.0]
    speed = report.Throughput(1000, batch=64, devices=8, clock=lambda: now[0])
    now[0] += 120.0  # step 1: two minutes of compilation
    assert speed.compiled(1) == 120.0
    assert speed.update(1) == {}  # the log line of step 1: no rate known yet
    now[0] += 9.0  # steps 2-10 at one second each
    m = speed.update(10)
    assert m["eta_seconds"] == pytest.approx(990.0)  # 990 steps left at 1 s, not 13 s
    assert m["img_per_sec_per_device"] == pytest.approx(8.0)
    line = report.console_line(10, 1000, {"loss": 1.0, **m})
    assert line.endswith("| 8 img/s/device | ETA 16m30s")
    assert "ETA" not in report.console_line(1, 1000, {"loss": 1.0})
    # Resumed at step 500: the first step after it compiles again.
    resumed = report.Throughput(1000, 64, 8, start_step=500, clock=lambda: now[0])
    now[0] += 60.0
    assert resumed.compiled(501) == 60.0
    now[0] += 4.0
    assert resumed.update(505)["eta_seconds"] == pytest.approx(495.0)


def test_progress_bar_redraws_on_a_terminal_and_prints_lines_to_a_log():
    now = [0.0]

    def items():
        for i in range(10):
            now[0] += 25.0  # each batch takes 25 s
            yield i

    tty = io.StringIO()
    got = list(console.bar(items(), 10, "eval test", stream=tty, tty=True, clock=lambda: now[0]))
    assert got == list(range(10))
    text = tty.getvalue()
    assert text.count("\r") == 10 and text.endswith("\n") and text.count("\n") == 1
    assert "\reval test [###############               ] 5/10 2m05s" in text

    log = io.StringIO()
    now[0] = 0.0
    list(console.bar(items(), 10, "eval test", stream=log, tty=False, clock=lambda: now[0]))
    assert "\r" not in log.getvalue()
    # A line once a minute has passed (after batches 3, 6 and 9 here), and one at the end.
    assert log.getvalue().splitlines() == [
        "eval test: 3/10 (30%) 1m15s",
        "eval test: 6/10 (60%) 2m30s",
        "eval test: 9/10 (90%) 3m45s",
        "eval test: 10/10 done in 4m10s",
    ]
    quiet = io.StringIO()
    list(console.bar(items(), 10, "eval", enabled=False, stream=quiet, tty=False))
    assert quiet.getvalue() == ""


def test_init_from_of_another_patch_size_names_both_patches(tmp_path):
    wide = tiny_config(**{"model.patch_size": 4, "model.width": 64})
    path = str(tmp_path / "patch4.npz")
    weights.save_npz(
        path, initial_params(state_lib.Start.of(wide), state_lib.build_model(wide.model, 10), 28)
    )
    c = tiny_config(init_from=path)  # patch 7, width 32
    with pytest.raises(CheckpointError) as error:
        initial_params(state_lib.Start.of(c), state_lib.build_model(c.model, 10), 28)
    message = str(error.value)
    assert "the file's patch embedding is for patch 4; it was resampled to the model's patch 7" in (
        message
    )
    assert "The file looks like width 64, depth 2, 2 heads, MLP 64, patch 4:" in message


def test_init_from_of_another_architecture_names_its_keys_before_any_resize(tmp_path):
    """A mean-pooled, deeper file into a class-token model: the keys that do not fit and
    the file's variant, not a position-embedding resize that cannot work (no class row)."""
    deep = tiny_config(**{"model.classifier": "gap", "model.depth": 3})
    path = str(tmp_path / "gap.npz")
    plain = state_lib.build_model(deep.model, 10)
    weights.save_npz(path, initial_params(state_lib.Start.of(deep), plain, 28))
    c = tiny_config(init_from=path)  # token, depth 2
    with pytest.raises(CheckpointError) as error:
        initial_params(state_lib.Start.of(c), state_lib.build_model(c.model, 10), 28)
    message = str(error.value)
    assert "resize" not in message and "key cls is missing (model expects (1, 1, 32))" in message
    assert "key Transformer/encoderblock_2/LayerNorm_0/bias (32,) is not in the model" in message
    assert "The file looks like width 32, depth 3, 2 heads, MLP 64, patch 7:" in message


def test_a_fine_tuning_run_says_what_it_started_from(tmp_path, capsys):
    """Its first line names the file, what was resized and the new head."""
    from vit_jax.parallel import sharding

    source = tiny_config()
    path = str(tmp_path / "pre.npz")
    plain = state_lib.build_model(source.model, 10)
    weights.save_npz(path, initial_params(state_lib.Start.of(source), plain, 28))
    c = tiny_config(init_from=path, image_size=42)  # a 6x6 grid instead of 4x4
    model = state_lib.build_model(c.model, 3)
    tx, _ = state_lib.optimizer_of(c)
    state_lib.create_state(state_lib.Start.of(c), model, tx, sharding.make_mesh(-1, 1))
    assert capsys.readouterr().out.splitlines() == [
        f"fine-tuning from {path}: position embeddings (1, 17, 32) -> (1, 37, 32); a new "
        "zero-initialised head for 3 classes"
    ]


@needs_embedded_data
def test_finetune_preset_without_init_from_names_the_flag(tmp_path, capsys):
    workdir = tmp_path / "new" / "ft"
    args = ["--config=fashion_mnist:finetune", f"--workdir={workdir}"]
    assert run_command(main, *args) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "error: --config.init_from='pretrain/final.npz': no such file or directory: name the "
        "checkpoint to fine-tune"
    )
    assert "preset writes WORKDIR/final.npz" in err and "a Hugging Face model directory" in err
    assert "gs://" in err and "Traceback" not in err and len(err.splitlines()) == 2
    assert not os.path.exists(tmp_path / "new")  # nothing created


@needs_embedded_data
def test_failed_runs_remove_only_the_empty_directories_they_created(tmp_path):
    empty = tmp_path / "no_data"
    empty.mkdir()
    bad_data = {"dataset.data_dir": str(empty)}
    new = tmp_path / "a" / "b" / "run"
    with pytest.raises(ValueError, match="dataset.data_dir=.* has no train-images"):
        train.run(tiny_config(**bad_data), str(new))
    assert sorted(os.listdir(tmp_path)) == ["no_data"]  # a/, a/b/, a/b/run/ gone
    # A checkpoint that does not fit fails after checkpoints/ was made: both go.
    wide = tiny_config(**{"model.width": 64})
    path = str(tmp_path / "wide.npz")
    weights.save_npz(
        path, initial_params(state_lib.Start.of(wide), state_lib.build_model(wide.model, 10), 28)
    )
    with pytest.raises(CheckpointError):
        train.run(tiny_config(init_from=path), str(new))
    assert sorted(os.listdir(tmp_path)) == ["no_data", "wide.npz"]
    # A directory that was there stays, and so does what it holds.
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(ValueError):
        train.run(tiny_config(**bad_data), str(mine))
    assert mine.is_dir() and os.listdir(mine) == []
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ValueError):
        train.run(tiny_config(**bad_data), str(mine / "sub"))
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep"


def test_stop_request_first_ctrl_c_asks_the_second_interrupts(capfd):
    before = signal.getsignal(signal.SIGINT)
    with stopping.StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs at the next bytecode boundary
        assert stop.requested  # no KeyboardInterrupt: the loop decides when
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before
    assert capfd.readouterr().err.strip() == stopping.StopRequest.NOTICE.decode().strip()


@needs_embedded_data
def test_no_thread_of_a_run_outlives_it_on_success_error_or_signal(tmp_path, monkeypatch):
    """Three trainings in one process (as the recipe and the studies run them): one
    finishes, one stops on a non-finite loss, one on SIGTERM. Every thread they start (the
    input pipeline's, the checkpoint hashing pool, Orbax's, the event writer's, the lock's
    heartbeat) is ended when each run returns or raises: none is left after them."""
    before = set(threading.enumerate())
    train.run(tiny_config(total_steps=6, log_every=3, eval_every=3, checkpoint_every=3),
              str(tmp_path / "done"))  # fmt: skip
    assert set(threading.enumerate()) <= before
    diverges = tiny_config(total_steps=12, checkpoint_every=2, log_every=100, eval_every=0)
    diverges.optimizer.update(name="sgd", lr=300.0, grad_clip=0.0, warmup_steps=0)
    with pytest.raises(FloatingPointError):
        train.run(diverges, str(tmp_path / "nan"))
    assert set(threading.enumerate()) <= before

    compiled = report.Throughput.compiled

    def signal_after_the_first_step(self, step):  # SIGTERM arrives while step 2 is prepared
        os.kill(os.getpid(), signal.SIGTERM)
        return compiled(self, step)

    monkeypatch.setattr(report.Throughput, "compiled", signal_after_the_first_step)
    with pytest.raises(stopping.Stopped, match="stopped at step 1 by SIGTERM"):
        train.run(tiny_config(), str(tmp_path / "term"))
    left = set(threading.enumerate()) - before
    assert not left, sorted(t.name for t in left)


@needs_embedded_data
def test_a_relative_workdir_is_the_one_under_the_current_directory(tmp_path, monkeypatch, capsys):
    """`--workdir=workdirs/run`, as the README's main command passes it: the checkpoints,
    the events and final.npz go under the current directory (Orbax itself takes only
    absolute paths), and the run resumes there."""
    monkeypatch.chdir(tmp_path)
    config = tiny_config(total_steps=4, checkpoint_every=2, eval_every=0, log_every=2)
    train.run(config, "workdirs/run")
    out = capsys.readouterr().out
    assert f"step 2: saving checkpoint {tmp_path}/workdirs/run/checkpoints/2" in out, out
    found = sorted(os.listdir(tmp_path / "workdirs" / "run"))
    assert {"checkpoints", "final.npz", "summary.json"} <= set(found), found
    assert sorted(os.listdir(tmp_path / "workdirs" / "run" / "checkpoints")) == ["2", "4"]
    train.run(tiny_config(total_steps=6, checkpoint_every=2, eval_every=0), "workdirs/run")
    assert "resuming from step 4 " in capsys.readouterr().out
