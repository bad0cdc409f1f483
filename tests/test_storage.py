"""Storage faults: a damaged checkpoint is named, set aside and skipped, a failed save
stops the run with one message, and nothing is lost: every rerun ends with a final.npz
bit-identical to the undamaged run's.

The damage tests run in this process on the 8 emulated devices (data-parallel, and FSDP
over all 8); the full disk runs `python -m vit_jax.main` on one device."""

import os
import re
import shutil
import subprocess
import sys
import threading
import zlib

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import ROOT, assert_npz_equal, needs_embedded_data, python_m, read_scalars, tiny_config
from subprocesses import Run, tiny_flags

from vit_jax.base.console import first_few
from vit_jax.training import outputs, report, stopping, train
from vit_jax.weights.meta import Meta
from vit_jax.workdir import shards, verify
from vit_jax.workdir.checkpoints import COMMIT, WAY_OUT, Checkpoints
from vit_jax.workdir.workdir import run_workdirs

# 20 steps with dropout on, a checkpoint every 5 (5 is deleted: 3 kept).
RUN = {"checkpoint_every": 5, "eval_every": 0, "log_every": 5, "model.dropout": 0.1}


def config(**overrides):
    """The tiny config with RUN and `overrides` ('mesh.fsdp' for config.mesh.fsdp)."""
    return tiny_config(**{**RUN, **overrides})


def checkpoints(workdir, read_only=True):
    return Checkpoints(f"{workdir}/checkpoints", read_only=read_only)


def data_files(step_dir):
    """The files holding array data (Orbax's OCDBT 'd' directories), smallest first."""
    out = []
    for root, _, files in os.walk(step_dir):
        if os.path.basename(root) == "d":
            out += [os.path.join(root, f) for f in files]
    return sorted(out, key=os.path.getsize)


# Each damage returns a pattern for what the checks must say of it.


def flip_bytes(step_dir):
    """64 bytes flipped in the middle of every data file: the sizes hold, so it is the
    restore (its own checks) or the arrays' checksums that find it."""
    for path in data_files(step_dir):
        data = bytearray(open(path, "rb").read())
        middle = len(data) // 2
        data[middle - 32 : middle + 32] = bytes(b ^ 0xFF for b in data[middle - 32 : middle + 32])
        open(path, "wb").write(data)
    return r"it is unreadable \(\w+.*\)|\d+ arrays fail their checksums \(.+\)"


def delete_data_file(step_dir):
    path = data_files(step_dir)[-1]
    os.remove(path)
    return re.escape(f"file {rel(path, step_dir)} is missing")


def truncate(path, step_dir):
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    return re.escape(f"file {rel(path, step_dir)} has {size // 2} bytes, {size} when written")


def truncate_metadata(step_dir):
    return truncate(os.path.join(step_dir, "default", "_METADATA"), step_dir)


def truncate_data_file(step_dir):
    return truncate(data_files(step_dir)[-1], step_dir)


def rel(path, step_dir):
    return os.path.relpath(path, step_dir)


DAMAGES = {
    "flipped bytes": flip_bytes,
    "deleted data file": delete_data_file,
    "truncated _METADATA": truncate_metadata,
    "truncated data file": truncate_data_file,
}


def finished_copy(reference, path):
    """A copy of the finished `reference` workdir without its final export."""
    shutil.copytree(reference, path)
    os.remove(os.path.join(path, "final.npz"))
    return str(path)


def test_array_checksums_catch_other_values_in_any_layout():
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    values = {"a": np.arange(512, dtype=np.float32).reshape(64, 8), "b": np.ones(3, np.int32),
              "c": np.full((2, 2), 0.5, jax.numpy.bfloat16)}  # Adam's mu_dtype  # fmt: skip
    saved = {k: jax.device_put(v, split if k == "a" else None) for k, v in values.items()}
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        found = {"arrays": shards.checksums(saved, pool)}
    assert len(found["arrays"]["a"]["shards"]) == 8
    assert list(found["arrays"]["b"]["shards"]) == ["0:3"]
    assert found["arrays"]["c"]["shards"] == {"0:2,0:2": zlib.crc32(bytes.fromhex("003f" * 4))}
    assert verify.mismatches(saved, found) == []  # the layout that saved it
    one = jax.device_put(values, jax.devices()[0])  # another layout: slices of the whole
    assert verify.mismatches(one, found) == []
    assert verify.mismatches(dict(one, a=one["a"].at[40, 3].set(-1.0)), found) == ["a"]
    other = jax.device_put(values["a"] + 0, split).at[0, 0].set(7.0)
    assert verify.mismatches(dict(saved, a=other), found) == ["a"]


def test_only_committed_checkpoints_count_and_interrupted_ones_are_named(tmp_path, capsys):
    """Orbax's commit file marks a checkpoint complete, on a disk as on a store: a <step>
    without it (a save killed midway) is listed by no one, named and deleted by the next
    run, and never restored."""
    with Checkpoints(tmp_path / "checkpoints", 3) as kept:
        kept.save(4, {"w": jax.numpy.arange(3.0)})
        kept.wait()
    directory = tmp_path / "checkpoints"
    shutil.copytree(directory / "4", directory / "8")  # a kill after the arrays, before
    (directory / "8" / "commit_success.txt").unlink()  # the commit
    (directory / "3.orbax-checkpoint-tmp-123").mkdir()  # an older Orbax's rename-mode temp
    assert checkpoints(tmp_path).steps() == [4]
    assert checkpoints(tmp_path).incomplete() == ["3.orbax-checkpoint-tmp-123", "8"]
    capsys.readouterr()
    with Checkpoints(directory, 3) as reopened:
        out = capsys.readouterr().out
        assert "ignoring incomplete checkpoint(s) 3.orbax-checkpoint-tmp-123, 8 (a save was" in out
        assert sorted(os.listdir(directory)) == ["4"] and reopened.steps() == [4]
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = {"w": jax.ShapeDtypeStruct((3,), np.float32, sharding=device)}
        state, step = verify.restore_newest(reopened, target)
    assert step == 4 and np.array_equal(np.asarray(state["w"]), [0.0, 1.0, 2.0])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Finished undamaged workdirs: data-parallel and FSDP, both on the 8 devices."""
    meshes = {"data": {}, "fsdp": {"mesh.fsdp": 8, "mesh.data": 1}}

    class References(dict):
        def __missing__(self, name):  # trained on first use: the fast tests need one
            workdir = str(tmp_path_factory.mktemp(f"reference_{name}"))
            train.run(config(**meshes[name]), workdir)
            assert checkpoints(workdir).steps() == [10, 15, 20]
            self[name] = (workdir, meshes[name])
            return self[name]

    return References()


@pytest.mark.parametrize(
    "damage,mesh",
    [
        (damage, mesh) if (damage, mesh) == (next(iter(DAMAGES)), "data")
        else pytest.param(damage, mesh, marks=pytest.mark.slow)
        for mesh in ("data", "fsdp")
        for damage in DAMAGES
    ],
)  # fmt: skip
@needs_embedded_data
def test_damaged_newest_checkpoint_is_set_aside_and_the_run_falls_back(
    reference, tmp_path, capsys, damage, mesh
):
    ref, overrides = reference[mesh]
    workdir = finished_copy(ref, tmp_path / "run")
    directory = f"{workdir}/checkpoints"
    said = DAMAGES[damage](f"{directory}/20")
    capsys.readouterr()
    train.run(config(**overrides), workdir)
    out = capsys.readouterr().out
    found = re.search(rf"checkpoint {directory}/20 is damaged: (.*)\. Set aside as (\S+) ", out)
    assert found, out
    assert found[2] == f"{workdir}/damaged/20" and os.path.isdir(found[2])
    assert f"resuming from step 15 (checkpoint {directory}/15)" in out
    assert re.fullmatch(said, found[1]), (damage, found[1])
    assert_npz_equal(f"{workdir}/final.npz", f"{ref}/final.npz")
    assert checkpoints(workdir).steps() == [10, 15, 20]  # 20 written again, with a record
    assert checkpoints(workdir).newest_intact() == 20


@needs_embedded_data
def test_damaged_older_checkpoint_is_reported_but_does_not_stop_the_run(reference, tmp_path):
    ref, _ = reference["data"]
    workdir = finished_copy(ref, tmp_path / "run")
    said = "DAMAGED: " + DAMAGES["truncated data file"](f"{workdir}/checkpoints/10")
    rows = dict(verify.verify(checkpoints(workdir)))
    assert re.fullmatch(said, rows["10"]), rows
    assert rows["15"] == rows["20"] == "verifies"
    train.run(config(), workdir)  # resumes from 20: nothing to train, evaluates, exports
    assert_npz_equal(f"{workdir}/final.npz", f"{ref}/final.npz")
    # The command: a table and exit status 1; the FSDP-written record checks on one device.
    fsdp = finished_copy(reference["fsdp"][0], tmp_path / "fsdp")
    shutil.copytree(f"{workdir}/checkpoints/10", f"{fsdp}/checkpoints/10", dirs_exist_ok=True)
    os.makedirs(f"{fsdp}/damaged/5")  # one set aside by an earlier run: listed, not counted
    done = python_m("vit_jax.checkpoints", "verify", fsdp, env={"JAX_PLATFORMS": "cpu"})
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["checkpoint", "state"]
    state = lines[0].index("state")  # the states start under the header's, not at column 4
    rows = [(line[:state].rstrip(), line[state:]) for line in lines[1:]]
    assert [name for name, _ in rows] == ["damaged/5", "10", "15", "20"], done.stdout
    assert rows[0][1] == "set aside (found damaged by an earlier run)"
    assert re.fullmatch(said, rows[1][1]) and rows[2][1] == rows[3][1] == "verifies"


@needs_embedded_data
def test_verify_a_recipe_workdir_checks_each_run_below_it(reference, tmp_path):
    """`verify workdirs/recipe` (pretrain/, finetune/, scratch/ each a run's workdir):
    every run's checkpoints, named by run, in one aligned table."""
    ref, _ = reference["data"]
    recipe = tmp_path / "recipe"
    for run in ("pretrain", "finetune"):
        finished_copy(ref, recipe / run)
    os.makedirs(recipe / "scratch" / "checkpoints")  # started, nothing saved yet
    (recipe / "recipe.json").write_text("{}")
    said = "DAMAGED: " + delete_data_file(f"{recipe}/finetune/checkpoints/15")
    done = python_m("vit_jax.checkpoints", "verify", f"{recipe}/", env={"JAX_PLATFORMS": "cpu"})
    assert done.returncode == 1, done.stderr  # a damaged checkpoint under its final name
    lines = done.stdout.splitlines()
    names = [line.split()[0] for line in lines]
    assert names == ["checkpoint"] + [
        f"{r}/{s}" for r in ("finetune", "pretrain") for s in (10, 15, 20)
    ] + ["scratch/"]
    state = lines[0].index("state")
    for line in lines[1:]:  # every state starts under the header's, after two spaces
        assert line[state - 2 : state] == "  " and line[state] != " ", done.stdout
    states = {line.split()[0]: line[state:] for line in lines[1:]}
    assert re.fullmatch(said, states["finetune/15"])
    assert {states[f"pretrain/{s}"] for s in (10, 15, 20)} == {"verifies"}
    assert states["scratch/"] == "no checkpoints"
    assert [str(p) for p in run_workdirs(recipe)] == [
        f"{recipe}/{r}" for r in ("finetune", "pretrain", "scratch")
    ]
    assert [str(p) for p in run_workdirs(recipe / "pretrain")] == [f"{recipe}/pretrain"]
    assert run_workdirs(tmp_path / "nothing") == []


def test_verify_a_directory_without_workdirs_says_what_it_expects(tmp_path):
    os.makedirs(tmp_path / "a" / "b")
    for path, what in (
        (tmp_path, "has no checkpoints/ directory"),
        (tmp_path / "c", "does not exist"),
    ):
        done = python_m("vit_jax.checkpoints", "verify", str(path))
        assert done.returncode == 1 and not done.stdout
        assert done.stderr.startswith(f"error: {path} {what}"), done.stderr
        assert "a run's workdir (with checkpoints/) or a directory of them" in done.stderr


@needs_embedded_data
def test_with_no_intact_checkpoint_the_run_stops_unless_asked_to_start_again(
    reference, tmp_path, capsys
):
    ref, _ = reference["data"]
    workdir = finished_copy(ref, tmp_path / "run")
    for step in (10, 15, 20):
        truncate_data_file(f"{workdir}/checkpoints/{step}")
    with pytest.raises(OSError, match="no checkpoint in .* verifies: step 20 .*step 15 .*step 10"):
        train.run(config(), workdir)
    assert sorted(os.listdir(f"{workdir}/damaged")) == ["10", "15", "20"]
    assert os.listdir(f"{workdir}/checkpoints") == []
    capsys.readouterr()
    train.run(config(from_scratch_if_damaged=True), workdir)
    assert "step 1/20" in capsys.readouterr().out
    assert_npz_equal(f"{workdir}/final.npz", f"{ref}/final.npz")


@needs_embedded_data
def test_a_checkpoint_of_another_shape_does_not_fit_and_is_not_set_aside(reference, tmp_path):
    ref, _ = reference["data"]
    workdir = finished_copy(ref, tmp_path / "run")
    with pytest.raises(ValueError, match=r"checkpoints/20 does not fit this run's state .*Ti/4"):
        train.run(config(**{"model.width": 64}), workdir)
    assert checkpoints(workdir).steps() == [10, 15, 20]


@needs_embedded_data
def test_nonfinite_guard_names_only_a_checkpoint_that_verifies(reference, tmp_path):
    ref, _ = reference["data"]
    workdir = finished_copy(ref, tmp_path / "run")
    delete_data_file(f"{workdir}/checkpoints/20")
    guard = stopping.FiniteGuard(checkpoints(workdir, read_only=False), skip=False)
    metrics = {"loss": float("nan"), "grad_norm": 1.0, "finite": 0.0, "skipped": 0}
    with pytest.raises(FloatingPointError, match="newest intact checkpoint is step 15 \\("):
        guard.check(metrics, 21)


@pytest.mark.parametrize("recorded", [True, False], ids=["with_record", "orbax_alone"])
def test_a_checkpoint_that_restores_non_finite_values_is_set_aside(tmp_path, capsys, recorded):
    """Its checksums match (the NaN was saved as it is) or it has no record: restoring it
    finds a NaN, it is set aside and the run falls back to the step before."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    states = {4: {"w": w}, 8: {"w": w.copy()}}
    states[8]["w"][1, 2] = np.nan
    directory = f"{tmp_path}/checkpoints"
    if not recorded:  # Orbax alone writes them
        options = ocp.CheckpointManagerOptions(atomicity_options=COMMIT)
        with ocp.CheckpointManager(directory, options=options) as orbax:
            for step, state in states.items():
                orbax.save(step, args=ocp.args.StandardSave(jax.device_put(state)))
                orbax.wait_until_finished()
    kept = Checkpoints(directory)
    if recorded:
        for step, state in states.items():
            kept.save(step, jax.device_put(state))
            kept.wait()
    assert kept.steps() == [4, 8]
    state = "verifies" if recorded else "unchecked: no integrity record (restores, finite)"
    assert verify.verify(kept) == [("4", state), ("8", "DAMAGED: it restores non-finite values")]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"w": jax.ShapeDtypeStruct((2, 3), np.float32, sharding=device)}
    capsys.readouterr()
    restored, step = verify.restore_newest(kept, target)
    out = capsys.readouterr().out
    assert step == 4 and np.array_equal(np.asarray(restored["w"]), w)
    said = f"checkpoint {directory}/8 is damaged: it restores non-finite values. Set aside as "
    assert said + f"{tmp_path}/damaged/8 (nothing deleted); trying the one before" in out
    assert sorted(os.listdir(directory)) == ["4"] and kept.steps() == [4]
    kept.close()


def test_one_sentence_names_the_newest_intact_checkpoint(tmp_path):
    with Checkpoints(tmp_path / "run" / "checkpoints") as kept:
        none = "There is no intact checkpoint yet; a rerun starts from step 0"
        assert kept.newest_intact_sentence() == none
        for step in (3, 7):
            kept.save(step, {"w": jax.numpy.arange(3.0) + step})
            kept.wait()
        newest = "The newest intact checkpoint is step {0} ({1}/{0}); a rerun resumes there"
        assert kept.newest_intact_sentence() == newest.format(7, kept.directory)
        delete_data_file(f"{kept.directory}/7")  # damaged: the one before is named
        assert kept.newest_intact_sentence() == newest.format(3, kept.directory)


def test_first_few_names_three_and_counts_the_rest():
    assert first_few(["a", "b"]) == "a, b"
    assert first_few(["a", "b", "c"]) == "a, b, c"
    assert first_few(list("abcde"), "; ") == "a; b; c and 2 more"
    assert first_few(list("abcd"), "; ", unit="files") == "a; b; c and 1 more files"


def test_benchmark_prints_the_cost_of_the_record():
    script = os.path.join(ROOT, "benchmarks", "integrity.py")
    done = subprocess.run(
        [sys.executable, script, "--model=testing", "--image_size=32", "--repeats=1"],
        cwd="/",  # the script finds the package itself
        env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    patterns = (
        r"hash +\d+\.\d+ s",
        r"save, plain +\d+\.\d+ s blocking +\d+\.\d+ s whole",
        r"save, record +\d+\.\d+ s blocking +\d+\.\d+ s whole",
        r"record adds +[-+]\d+\.\d+ s blocking",
    )
    for pattern in patterns:
        assert re.search(pattern, out), out


# ---------------------------------------------------------------- runs in subprocesses


CLI_RUN = dict(total_steps=20, checkpoint_every=5, log_every=1, eval_every=0)
CLI_RUN["model.dropout"] = 0.1


@pytest.fixture(scope="module")
def cli_reference(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("cli_reference"))
    with Run(tiny_flags(workdir, **CLI_RUN), devices=1) as run:
        assert run.finish() == 0, run.tail()
    return workdir


@pytest.mark.slow  # two command runs
@needs_embedded_data
def test_killed_before_the_commit_keeps_the_older_checkpoint(cli_reference, tmp_path):
    """What a kill leaves between the arrays and the commit file of step 10 (keep 1: step
    5 is still there, Orbax deletes an older one only after a newer one is complete): the
    rerun names it, deletes it, resumes from 5 and ends bit-identical."""
    reference = f"{tmp_path}/all"
    with Run(tiny_flags(reference, keep_checkpoints=0, **CLI_RUN), devices=1) as run:
        assert run.finish() == 0, run.tail()  # keeps all: 5, 10, 15, 20
    workdir = f"{tmp_path}/run"
    for step in ("5", "10"):
        shutil.copytree(f"{reference}/checkpoints/{step}", f"{workdir}/checkpoints/{step}")
    os.remove(f"{workdir}/checkpoints/10/commit_success.txt")
    with Run(tiny_flags(workdir, keep_checkpoints=1, **CLI_RUN), devices=1) as run:
        assert run.finish() == 0, run.tail()
    log = "\n".join(run.log)
    assert "ignoring incomplete checkpoint(s) 10 (a save was interrupted)" in log
    assert f"resuming from step 5 (checkpoint {workdir}/checkpoints/5)" in log
    assert sorted(os.listdir(f"{workdir}/checkpoints")) == ["20"]  # keep_checkpoints=1
    assert_npz_equal(f"{workdir}/final.npz", f"{cli_reference}/final.npz")


@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MB tmpfs: room for the tiny run's first checkpoints, not for all of them."""
    if not (shutil.which("mount") and shutil.which("umount")):
        pytest.skip("cannot mount a tmpfs here (no mount command)")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mount)])
    if done.returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield str(mount)
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow  # three command runs; the export test below fills a tmpfs in the default set
@needs_embedded_data
def test_disk_full_during_a_save_stops_with_one_message_and_resumes(
    cli_reference, small_disk, tmp_path
):
    workdir = f"{small_disk}/run"
    flags = tiny_flags(workdir, **CLI_RUN)
    with Run(flags, devices=1) as run:
        assert run.finish() == 1, run.tail()
    log = "\n".join(run.log)
    found = re.search(
        r"error: could not save checkpoint step (\d+) in (\S+): No space left on device\. "
        r"Nothing of step \d+ was left behind\. The newest intact checkpoint is step (\d+) "
        r"\((\S+)\); a rerun resumes there: free space there .* run the same command again",
        log,
    )
    assert found, log
    failed, good = int(found[1]), int(found[3])
    assert found[2] == f"{workdir}/checkpoints" and found[4] == f"{workdir}/checkpoints/{good}"
    assert "Traceback" not in log
    assert good == failed - 5, log  # apart: pytest shows a passing `not in` as if it failed
    # The error line and its hint are the run's last output: nothing after them.
    assert run.log[-2].startswith("error: could not save") and run.log[-1].startswith("(for")
    kept = checkpoints(workdir)
    assert kept.steps()[-1] == good and not kept.incomplete()  # nothing of the failed step
    assert kept.newest_intact() == good
    subprocess.run(["mount", "-o", "remount,size=16m", small_disk], check=True)  # space freed
    with Run(flags, devices=1) as run:
        assert run.finish() == 0, run.tail()
    assert f"resuming from step {good} " in "\n".join(run.log)
    assert_npz_equal(f"{workdir}/final.npz", f"{cli_reference}/final.npz")


def test_export_to_a_full_disk_leaves_nothing_half_written(small_disk, tmp_path):
    with Checkpoints(tmp_path / "run" / "checkpoints") as kept:
        kept.save(7, {"w": jax.numpy.arange(3.0)})
        kept.wait()
        params = {"w": jax.device_put(np.zeros((1024, 1024), np.float32))}  # 4 MB: no room
        path = f"{small_disk}/final.npz"
        with pytest.raises(OSError) as error:
            outputs.export_npz(path, params, Meta(), kept)
    assert str(error.value) == (
        f"could not write {path}: No space left on device. Nothing half-written was left. "
        f"The newest intact checkpoint is step 7 ({kept.directory}/7); a rerun resumes there: "
        "free space there (or restore access to it) and run the same command again, which "
        "writes it without training again"
    )
    assert os.listdir(small_disk) == []


class FillsTheDiskAfterTheRecord(Checkpoints):
    """Fills the disk once the record of a save is written: the next write, Orbax's commit
    marker, creates its file and then finds no room (what CI met at a real save)."""

    fill = False

    def _write_record(self) -> None:
        super()._write_record()
        if self.fill:
            fill(self.directory.parent.parent / "filler")


def fill(path) -> None:
    """Writes `path` until its disk is full."""
    filler = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(filler, b"x" * 4096):
            pass
    except OSError:
        pass
    os.close(filler)


def test_a_save_whose_commit_marker_meets_a_full_disk_leaves_nothing(small_disk):
    directory = f"{small_disk}/run/checkpoints"
    with FillsTheDiskAfterTheRecord(directory, keep=3) as kept:
        kept.save(5, {"w": jax.numpy.arange(1000.0)})
        kept.wait()
        kept.fill = True
        kept.save(10, {"w": jax.numpy.arange(1000.0) + 1})
        with pytest.raises(OSError) as error:
            kept.wait()
        # Orbax would list it complete: its marker is there, empty; the failed save is gone.
        assert str(error.value) == (
            f"could not save checkpoint step 10 in {directory}: No space left on device. "
            f"Nothing of step 10 was left behind. The newest intact checkpoint is step 5 "
            f"({directory}/5); a rerun resumes there: {WAY_OUT}"
        )
        assert kept.steps() == [5] and os.listdir(directory) == ["5"]


def test_a_save_on_a_full_disk_leaves_nothing_once_its_other_writes_end(small_disk):
    """The first failed write of a save ends Orbax's wait for it, not its other commit
    threads: they made the step's directory again after the removal, and the message said
    nothing was left (the disk-full run failed so here, under load). The removal waits for them."""
    directory = f"{small_disk}/run/checkpoints"
    state = {f"w{i}": jax.numpy.arange(1000.0) + i for i in range(20)}
    with Checkpoints(directory) as kept:
        kept.save(5, state)
        kept.wait()
        fill(f"{small_disk}/filler")
        with pytest.raises(OSError) as error:
            kept.save(10, state)
            kept.wait()
        assert "Nothing of step 10 was left behind." in str(error.value)
        for thread in threading.enumerate():  # what a late write of the save would do, done
            if type(thread).__name__ == "_SignalingThread":
                threading.Thread.join(thread)
        assert os.listdir(directory) == ["5"]


def test_a_full_disk_fails_the_event_file_on_the_loops_thread_with_the_saves_message(
    small_disk, capfd
):
    """tensorboardX's writer thread, failed by a full disk, printed a traceback and then
    blocked the loop for good (CI saw the traceback). The write fails on the loop's thread
    now; a save that failed in flight is the error, naming what it left."""
    with Checkpoints(f"{small_disk}/run/checkpoints") as kept, pytest.raises(OSError) as error:
        kept.save(5, {"w": jax.numpy.arange(3.0)})
        kept.wait()
        with report.EventWriter(f"{small_disk}/run", kept.rerun_sentence) as writer:
            writer.write_scalars(5, {"loss": 1.0})
            noise = np.random.default_rng(0).standard_normal((1024, 1024), np.float32)
            kept.save(10, {"w": jax.device_put(noise)})  # 4 MB, incompressible: no room
            for step in range(6, 10**6):  # till the disk is full
                writer.write_scalars(step, {"loss": 1.0})
                writer.flush()
    assert re.fullmatch(
        rf"could not save checkpoint step 10 in {small_disk}/run/checkpoints: No space left on "
        rf"device\. Nothing of step 10 was left behind\. The newest intact checkpoint is step 5 "
        rf"\({small_disk}/run/checkpoints/5\); a rerun resumes there: {re.escape(WAY_OUT)}",
        str(error.value),
    ), error.value
    assert "Exception in thread" not in capfd.readouterr().err  # (Orbax's own logs may be)
    assert Checkpoints(f"{small_disk}/run/checkpoints").steps() == [5]
    with pytest.raises(OSError) as error, report.EventWriter(f"{small_disk}/other") as writer:
        for step in range(10**6):  # without checkpoints, its own words
            writer.write_scalars(step, {"loss": 1.0})
    assert str(error.value) == (
        f"could not write TensorBoard events in {small_disk}/other: No space left on device."
    )
    written = read_scalars(f"{small_disk}/other")["loss"]  # to the record cut short
    assert len(written) > 100 and written == [(i, 1.0) for i in range(len(written))]
