"""Storage faults: a damaged checkpoint is named, set aside and skipped, a failed save
stops the run with one message, and nothing is lost: every rerun ends with a final.npz
bit-identical to the undamaged run's.

The damage tests run in this process on the 8 emulated devices (data-parallel, and FSDP
over all 8); the kill and the full disk run `python -m vit_jax.main` on one device."""

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import ROOT, assert_npz_equal, needs_embedded_data, python_m, tiny_config
from subprocesses import Run, tiny_flags

from vit_jax.base.text import first_few
from vit_jax.training import guard as guard_lib
from vit_jax.training import train
from vit_jax.workdir import integrity, recovery, saver
from vit_jax.workdir import manager as workdir_lib

# 20 steps with dropout on, a checkpoint every 5 (5 is deleted: 3 kept).
RUN = {"checkpoint_every": 5, "eval_every": 0, "log_every": 5, "model.dropout": 0.1}


def config(**overrides):
    """The tiny config with RUN and `overrides` ('mesh.fsdp' for config.mesh.fsdp)."""
    return tiny_config(**{**RUN, **overrides})


def data_files(step_dir):
    """The files holding array data (Orbax's OCDBT 'd' directories)."""
    out = []
    for root, _, files in os.walk(step_dir):
        if os.path.basename(root) == "d":
            out += [os.path.join(root, f) for f in files]
    return sorted(out, key=os.path.getsize)


# Each damage returns what the checks must say of it, one line per file, in path order.


def flip_bytes(step_dir):
    for path in data_files(step_dir):  # 64 bytes in the middle of every data file
        data = bytearray(open(path, "rb").read())
        middle = len(data) // 2
        data[middle - 32 : middle + 32] = bytes(b ^ 0xFF for b in data[middle - 32 : middle + 32])
        open(path, "wb").write(data)
    return sorted(f"file {rel(p, step_dir)} fails its checksum" for p in data_files(step_dir))


def delete_data_file(step_dir):
    path = data_files(step_dir)[-1]
    os.remove(path)
    return [f"file {rel(path, step_dir)} is missing"]


def truncate(path, step_dir):
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    return [f"file {rel(path, step_dir)} has {size // 2} bytes, {size} when written"]


def truncate_metadata(step_dir):
    return truncate(os.path.join(step_dir, "default", "_METADATA"), step_dir)


def truncate_data_file(step_dir):
    return truncate(data_files(step_dir)[-1], step_dir)


def rel(path, step_dir):
    return os.path.relpath(path, step_dir)


def said(problems):
    """The one line naming `problems`: the first three, then how many more files."""
    more = f" and {len(problems) - 3} more files" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


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
    values = {"a": np.arange(512, dtype=np.float32).reshape(64, 8), "b": np.ones(3, np.int32)}
    saved = {"a": jax.device_put(values["a"], split), "b": jax.device_put(values["b"])}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        record = {"arrays": integrity.collect(integrity.start_checksums(saved, pool))}
    assert len(record["arrays"]["a"]["shards"]) == 8 and list(record["arrays"]["b"]["shards"]) == [
        "0:3"
    ]
    assert integrity.mismatches(saved, record) == ([], 0)  # the layout that saved it
    one = jax.device_put(values, jax.devices()[0])  # another layout: slices of the whole
    assert integrity.mismatches(one, record) == ([], 0)
    assert integrity.mismatches(dict(one, a=one["a"].at[40, 3].set(-1.0)), record) == (["a"], 0)
    other = jax.device_put(values["a"] + 0, split).at[0, 0].set(7.0)
    assert integrity.mismatches(dict(saved, a=other), record) == (["a"], 0)


def test_step_dirs_lists_only_finished_checkpoints(tmp_path):
    names = ["10", "15", "20", "12.damaged", "12.damaged.2", saver.PENDING]
    names += [f"7{workdir_lib.TMP_MARK}-1234", f"8{workdir_lib.TMP_MARK}"]
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / "3").write_text("a file, not a checkpoint")
    assert integrity.step_dirs(str(tmp_path)) == [10, 15, 20]
    assert integrity.step_dirs(str(tmp_path / "absent")) == []


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Finished undamaged workdirs: data-parallel and FSDP, both on the 8 devices."""
    meshes = {"data": {}, "fsdp": {"mesh.fsdp": 8, "mesh.data": 1}}

    class References(dict):
        def __missing__(self, name):  # trained on first use: the fast tests need one
            workdir = str(tmp_path_factory.mktemp(f"reference_{name}"))
            train.run(config(**meshes[name]), workdir)
            assert integrity.step_dirs(f"{workdir}/checkpoints") == [10, 15, 20]
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
    checkpoints = f"{workdir}/checkpoints"
    problems = DAMAGES[damage](f"{checkpoints}/20")
    capsys.readouterr()
    train.run(config(**overrides), workdir)
    out = capsys.readouterr().out
    found = re.search(rf"checkpoint {checkpoints}/20 is damaged: (.*)\. Set aside as (\S+) ", out)
    assert found, out
    assert found[2] == f"{checkpoints}/20.damaged" and os.path.isdir(found[2])
    assert f"resuming from step 15 (checkpoint {checkpoints}/15)" in out
    print(f"{damage}: {found[1]}")
    assert found[1] == said(problems)
    assert_npz_equal(f"{workdir}/final.npz", f"{ref}/final.npz")
    assert integrity.step_dirs(checkpoints) == [10, 15, 20]  # 20 written again, with a record
    assert not integrity.quick_check(f"{checkpoints}/20")


@needs_embedded_data
def test_damaged_older_checkpoint_is_reported_but_does_not_stop_the_run(reference, tmp_path):
    ref, _ = reference["data"]
    workdir = finished_copy(ref, tmp_path / "run")
    damaged = "DAMAGED: " + said(flip_bytes(f"{workdir}/checkpoints/10"))
    rows = dict(recovery.verify_workdir(workdir))
    assert rows["10"] == damaged, rows
    assert rows["15"] == rows["20"] == "verifies"
    train.run(config(), workdir)  # resumes from 20: nothing to train, evaluates, exports
    assert_npz_equal(f"{workdir}/final.npz", f"{ref}/final.npz")
    # The command: a table and exit status 1; the FSDP-written record checks on one device.
    fsdp = finished_copy(reference["fsdp"][0], tmp_path / "fsdp")
    shutil.copytree(f"{workdir}/checkpoints/10", f"{fsdp}/checkpoints/10", dirs_exist_ok=True)
    done = python_m("vit_jax.checkpoints", "verify", fsdp, env={"JAX_PLATFORMS": "cpu"})
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["checkpoint", "state"]
    state = lines[0].index("state")  # the states start under the header's, not at column 4
    assert [(line[:state].rstrip(), line[state:]) for line in lines[1:]] == [
        ("10", damaged), ("15", "verifies"), ("20", "verifies")
    ], done.stdout  # fmt: skip
    assert [line[state - 2 : state + 1] for line in lines[1:]] == ["  D", "  v", "  v"]


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
    damaged = "DAMAGED: " + said(flip_bytes(f"{recipe}/finetune/checkpoints/15"))
    done = python_m("vit_jax.checkpoints", "verify", f"{recipe}/", env={"JAX_PLATFORMS": "cpu"})
    assert done.returncode == 1, done.stderr  # a damaged checkpoint under its final name
    lines = done.stdout.splitlines()
    names = [line.split()[0] for line in lines]
    assert names == ["checkpoint"] + [
        f"{r}/{s}" for r in ("finetune", "pretrain") for s in (10, 15, 20)
    ] + ["scratch/"]
    state = lines[0].index("state")
    assert lines[0][state - 2 : state] == "  "
    for line in lines[1:]:  # every state starts under the header's, after two spaces
        assert line[state - 2 : state] == "  " and line[state] != " ", done.stdout
    states = {line.split()[0]: line[state:] for line in lines[1:]}
    assert states["finetune/15"] == damaged
    assert {states[f"pretrain/{s}"] for s in (10, 15, 20)} == {"verifies"}
    assert states["finetune/10"] == states["finetune/20"] == "verifies"
    assert states["scratch/"] == "no checkpoints"
    # One run's workdir is listed as before.
    rows = recovery.verify_workdir(f"{recipe}/pretrain")
    assert [name for name, _ in rows] == ["10", "15", "20"]
    assert recovery.run_workdirs(str(recipe)) == [
        f"{recipe}/{r}" for r in ("finetune", "pretrain", "scratch")
    ]
    assert recovery.run_workdirs(f"{recipe}/pretrain") == [f"{recipe}/pretrain"]
    assert recovery.run_workdirs(str(tmp_path / "nothing")) == []


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
    assert sorted(os.listdir(f"{workdir}/checkpoints")) == [
        "10.damaged", "15.damaged", "20.damaged"
    ]  # fmt: skip
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
    assert integrity.step_dirs(f"{workdir}/checkpoints") == [10, 15, 20]


@needs_embedded_data
def test_nonfinite_guard_names_only_a_checkpoint_that_verifies(reference, tmp_path):
    ref, _ = reference["data"]
    workdir = finished_copy(ref, tmp_path / "run")
    delete_data_file(f"{workdir}/checkpoints/20")
    guard = guard_lib.FiniteGuard(workdir_lib.open_manager(workdir, 3), skip=False)
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
    if recorded:
        kept = saver.Saver(str(tmp_path), 0, {})
        for step, state in states.items():
            kept.save(step, jax.device_put(state))
            kept.wait()
        manager = kept.manager
    else:
        manager = workdir_lib.open_manager(str(tmp_path), 0)
        for step, state in states.items():
            manager.save(step, args=ocp.args.StandardSave(jax.device_put(state)))
            manager.wait_until_finished()
    directory = f"{tmp_path}/checkpoints"
    assert integrity.step_dirs(directory) == [4, 8]
    assert (integrity.read_record(f"{directory}/8") is not None) == recorded
    state = "verifies" if recorded else "unchecked: no integrity record (restores, finite)"
    assert recovery.verify_workdir(str(tmp_path)) == [
        ("4", state), ("8", "DAMAGED: it restores non-finite values")
    ]  # fmt: skip
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"w": jax.ShapeDtypeStruct((2, 3), np.float32, sharding=device)}
    capsys.readouterr()
    restored, step = recovery.restore_newest(manager, target)
    out = capsys.readouterr().out
    assert step == 4 and np.array_equal(np.asarray(restored["w"]), w)
    said = f"checkpoint {directory}/8 is damaged: it restores non-finite values. Set aside as "
    assert said + f"{directory}/8.damaged (nothing deleted); trying the one before" in out
    assert sorted(os.listdir(directory)) == ["4", "8.damaged"]
    assert manager.all_steps() == [4]


def test_one_sentence_names_the_newest_intact_checkpoint(tmp_path):
    kept = saver.Saver(str(tmp_path / "run"), 0, {})
    none = "There is no intact checkpoint yet; a rerun starts from step 0"
    assert integrity.newest_intact_sentence(kept.directory) == none
    for step in (3, 7):
        kept.save(step, {"w": jax.numpy.arange(3.0) + step})
        kept.wait()
    newest = "The newest intact checkpoint is step {0} ({1}/{0}); a rerun resumes there"
    assert integrity.newest_intact_sentence(kept.directory) == newest.format(7, kept.directory)
    delete_data_file(f"{kept.directory}/7")  # damaged: the one before is named
    assert integrity.newest_intact_sentence(kept.directory) == newest.format(3, kept.directory)


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


@needs_embedded_data
def test_killed_before_the_record_keeps_the_older_checkpoint(cli_reference, tmp_path):
    workdir = str(tmp_path / "run")
    flags = tiny_flags(workdir, keep_checkpoints=1, **CLI_RUN)
    with Run(flags, devices=1, env={saver.HOLD_ENV: "10"}) as run:
        run.wait_for(lambda line: "step 10: holding before its integrity record" in line, 300)
        run.kill()
    names = sorted(os.listdir(f"{workdir}/checkpoints"))
    assert names == ["10.orbax-checkpoint-tmp", "5"], names  # 5 not yet deleted
    assert not integrity.quick_check(f"{workdir}/checkpoints/5")
    with Run(flags, devices=1) as run:
        assert run.finish() == 0, run.tail()
    log = "\n".join(run.log)
    assert "ignoring incomplete checkpoint(s) 10.orbax-checkpoint-tmp" in log
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
    assert "Traceback" not in log and good == failed - 5
    assert integrity.step_dirs(found[2])[-1] == good  # nothing of the failed step
    assert not [n for n in os.listdir(found[2]) if not n.isdigit()]
    assert not integrity.quick_check(found[4])
    subprocess.run(["mount", "-o", "remount,size=16m", small_disk], check=True)  # space freed
    with Run(flags, devices=1) as run:
        assert run.finish() == 0, run.tail()
    assert f"resuming from step {good} " in "\n".join(run.log)
    assert_npz_equal(f"{workdir}/final.npz", f"{cli_reference}/final.npz")


def test_export_to_a_full_disk_leaves_nothing_half_written(small_disk, tmp_path):
    kept = saver.Saver(str(tmp_path / "run"), 0, {})
    kept.save(7, {"w": jax.numpy.arange(3.0)})
    kept.wait()
    params = {"w": jax.device_put(np.zeros((1024, 1024), np.float32))}  # 4 MB: does not fit
    path = f"{small_disk}/final.npz"
    with pytest.raises(OSError) as error:
        train._export(path, params, kept.directory)
    assert str(error.value) == (
        f"could not write {path}: No space left on device. Nothing half-written was left. "
        f"The newest intact checkpoint is step 7 ({kept.directory}/7); a rerun resumes there: "
        "free space there (or restore access to it) and run the same command again, which "
        "writes it without training again"
    )
    assert os.listdir(small_disk) == []
