"""Preemption and shared workdirs: Orbax's two commit modes, the workdir lock, save on
SIGTERM/SIGINT (one process and two), and signals at random moments of a run."""

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from helpers import assert_npz_equal, snapshot, tiny_config
from subprocesses import Run, tiny_flags

from vit_jax.base import store
from vit_jax.training import stopping, train
from vit_jax.workdir import checkpoints as checkpoints_lib
from vit_jax.workdir import lock
from vit_jax.workdir.checkpoints import Checkpoints
from vit_jax.workdir.workdir import Plan

# 8 steps, a checkpoint every 2 (2 kept), dropout on: what is restored matters.
RUN = {"total_steps": 8, "checkpoint_every": 2, "keep_checkpoints": 2, "eval_every": 0}
RUN.update({"log_every": 4, "model.dropout": 0.1})


def test_every_checkpoint_is_committed_with_its_record_and_retention_keeps_two(tmp_path):
    """One commit mode everywhere (Orbax's commit file, which object stores need): each
    kept step has the marker and the integrity record, which lists Orbax's files."""
    workdir = str(tmp_path / "run")
    train.run(tiny_config(**RUN), workdir)
    checkpoints = f"{workdir}/checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["6", "8"]  # keep_checkpoints=2
    for step in ("6", "8"):
        assert {"commit_success.txt", checkpoints_lib.NAME} <= set(
            os.listdir(f"{checkpoints}/{step}")
        )
        found = checkpoints_lib.read_record(store.path(f"{checkpoints}/{step}"))
        assert found["files"] and all(f.startswith("default/") for f in found["files"])
        assert found["step"] == int(step) and found["state"] == Plan.of(tiny_config(**RUN)).state


def test_a_second_run_is_refused_a_stale_lock_taken_over(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    with lock.held(workdir):
        holder = json.load(open(f"{workdir}/{lock.NAME}"))
        assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
    assert os.listdir(workdir) == []  # released
    # Another live run on this host: a process of its own, its lock beating now.
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as other:
        try:
            start = lock._process_start(other.pid)
            live = dict(holder, pid=other.pid, process_start=start, beat_at=time.time())
            with open(f"{workdir}/{lock.NAME}", "w") as f:
                json.dump(live, f)
            before = snapshot(workdir)
            with pytest.raises(lock.WorkdirLocked) as refused:
                train.run(tiny_config(**RUN), workdir)
            assert str(refused.value).startswith(
                f"workdir {workdir} is in use by another run (host {holder['host']} pid "
                f"{other.pid}, started {holder['started']}; lock {workdir}/{lock.NAME}, "
            ), refused.value
            assert str(refused.value).endswith(
                "(a lock whose heartbeat has been silent for 3m30s is taken over)"
            ), refused.value
            assert snapshot(workdir) == before  # touched nothing
        finally:
            other.kill()
    os.remove(f"{workdir}/{lock.NAME}")
    # A lock of a process that is gone (this host), and one whose heartbeat stopped.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    dead = dict(holder, pid=int(gone), started="then")
    far = dict(holder, host="elsewhere", pid=1, started="earlier", beat_at=time.time() - 400)
    for left, why in ((dead, "its process no longer exists"), (far, "its heartbeat stopped")):
        with open(f"{workdir}/{lock.NAME}", "w") as f:
            json.dump(left, f)
        with lock.held(workdir):
            assert json.load(open(f"{workdir}/{lock.NAME}"))["pid"] == os.getpid()
        out = capsys.readouterr().out
        assert f"taking over the lock of {workdir} from {lock.describe(left)}: {why}" in out
    # A live holder elsewhere whose heartbeat is recent is not taken over.
    with open(f"{workdir}/{lock.NAME}", "w") as f:
        json.dump(dict(far, beat_at=time.time()), f)
    with pytest.raises(lock.WorkdirLocked, match="host elsewhere pid 1"):
        lock.acquire(workdir)


def test_a_lock_that_missed_two_beats_is_waited_for_not_refused(tmp_path, capsys, monkeypatch):
    """The lock of a run that gave up on its store (it could not remove it): a requeue on
    another host waits for the heartbeat to go stale and takes it over; one that beats
    again meanwhile is a live run, and refuses."""
    monkeypatch.setattr(lock, "HEARTBEAT_SECONDS", 1.0)  # two missed beats: 2 s
    workdir = tmp_path / "run"
    workdir.mkdir()
    path = workdir / lock.NAME
    far = dict(lock.holder_now(), host="elsewhere", pid=1, started="earlier")
    path.write_text(json.dumps(dict(far, beat_at=time.time() - 3.0)))
    began = time.monotonic()
    lock.acquire(workdir, stale_after=5.0)
    assert 1.5 < time.monotonic() - began < 5.0
    assert json.loads(path.read_text())["pid"] == os.getpid()
    out = capsys.readouterr().out
    assert f"the lock {path} (host elsewhere pid 1, started earlier) missed its heartbeats" in out
    assert f"taking over the lock of {workdir} from host elsewhere" in out
    path.write_text(json.dumps(dict(far, beat_at=time.time() - 3.0)))
    beat = lambda: path.write_text(json.dumps(dict(far, beat_at=time.time())))  # noqa: E731
    threading.Timer(0.5, beat).start()
    with pytest.raises(lock.WorkdirLocked, match="host elsewhere pid 1"):
        lock.acquire(workdir, stale_after=5.0)


def test_stop_request_first_signal_asks_a_second_sigterm_ends_the_process():
    code = (
        "import os, signal, time\n"
        "from vit_jax.training import stopping\n"
        "with stopping.StopRequest() as stop:\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.1)\n"
        "    print(stop.requested, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
        "    print('still here', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -signal.SIGTERM and done.stdout == "SIGTERM\n", done
    assert done.stderr.strip() == stopping.StopRequest.TERM_NOTICE.decode().strip()


def test_agreement_is_the_flag_with_one_process_and_one_step_late_in_the_steps_batch():
    import jax.numpy as jnp

    from vit_jax.parallel import sharding

    mesh = sharding.make_mesh(4, 2)
    one = stopping.Agreement(mesh)
    assert one.lagged("SIGTERM", {}) == "SIGTERM"
    assert one.into({"x": np.zeros(8)}, None).keys() == {"x"}  # one process: nothing added
    agree = stopping.Agreement(mesh, force=True)  # as with several processes
    # Each step's batch carries the flags (one per example) and the step takes their max
    # (train_step's 'stop' metric); the loop reads the step before.
    step = jax.jit(lambda b: {"stop": jnp.max(b["stop"])})
    seen = []
    for requested in (None, "SIGINT", None, None, "SIGTERM"):
        local = agree.into({"x": np.zeros(8, np.float32)}, requested)
        assert local["stop"].dtype == np.int32 and local["stop"].shape == (8,)
        seen.append(agree.lagged(requested, step(sharding.global_batch(local, mesh))))
    assert seen == [None, None, "SIGINT", None, None]
    assert agree.now(None) == "SIGTERM"  # the last step's, not yet read
    assert agree.now("SIGINT") == "SIGINT" and agree.now(None) is None  # its own all-reduce


# 1 device; saves at 5, 10, 15, 20; evaluates at 10 and 20; a log line every step.
SIGNALLED = dict(total_steps=20, checkpoint_every=5, log_every=1, eval_every=10)
STOPPED = r"stopped at step (\d+) by (SIGTERM|SIGINT); checkpoint \1 saved \((\S+)\); rerun the same command to resume"  # noqa: E501
STEP = re.compile(r"step (\d+)/20")
MOMENTS = {  # the line after which the signal is sent (after a random delay)
    "start-up": None,
    "a step": lambda line: line.startswith("step 7/20"),
    "an evaluation": lambda line: line.startswith("step 10/20"),
    "an asynchronous save": lambda line: line.startswith("step 15: saving checkpoint"),
    "the final export": lambda line: line.startswith("step 20: test accuracy"),
}


@pytest.mark.slow  # about a dozen runs of the command
def test_signals_at_random_moments_save_and_every_rerun_ends_bit_identical(tmp_path):
    rng = random.Random(21)
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    reference = str(tmp_path / "reference")
    with Run(tiny_flags(reference, **SIGNALLED), devices=1, env=cache) as run:
        assert run.finish(timeout=180) == 0, run.tail()
    # A second run on a workdir in use is refused and touches nothing; the first goes on.
    shared = str(tmp_path / "shared")
    with Run(tiny_flags(shared, **SIGNALLED), devices=1, env=cache) as first:
        first.wait_for(lambda line: "compiling the first step" in line, timeout=120)
        # Paused, alive, its lock held: on a loaded machine the first could otherwise
        # finish all its steps while the second is still starting up.
        os.killpg(first.proc.pid, signal.SIGSTOP)
        try:
            with Run(tiny_flags(shared, **SIGNALLED), devices=1, env=cache) as second:
                assert second.finish(timeout=120) == 1, second.tail()
        finally:
            os.killpg(first.proc.pid, signal.SIGCONT)
        error = next((line for line in second.log if line.startswith("error:")), "")
        assert error.startswith(
            f"error: workdir {shared} is in use by another run (host {socket.gethostname()} "
            f"pid {first.proc.pid}, started "
        ), second.tail()
        assert first.finish(timeout=180) == 0, first.tail()
    assert_npz_equal(f"{shared}/final.npz", f"{reference}/final.npz")
    assert not os.path.exists(f"{shared}/{lock.NAME}")
    for i, (moment, after) in enumerate([*MOMENTS.items(), ("a step (Ctrl-C)", MOMENTS["a step"])]):
        workdir = str(tmp_path / f"run{i}")
        sig = signal.SIGINT if "Ctrl-C" in moment else signal.SIGTERM
        delay = rng.uniform(0.5, 4.0) if after is None else rng.uniform(0.0, 0.3)
        with Run(tiny_flags(workdir, **SIGNALLED), devices=1, env=cache) as run:
            if after is not None:
                run.wait_for(after, timeout=180)
            time.sleep(delay)
            os.kill(run.proc.pid, sig)
            status = run.finish(timeout=120)
        last = run.log[-1] if run.log else ""
        print(f"{moment} (+{delay:.2f}s): exit {status}; {last}")
        found = re.fullmatch(STOPPED, last)
        if after is None and status in (-signal.SIGTERM, 143) and not found:
            pass  # before the handler (still importing): SIGTERM's default; nothing written
        else:
            assert status == 128 + sig and found, run.tail()
            reached = max(int(m[1]) for m in map(STEP.match, run.log) if m)
            assert int(found[1]) == reached and found[2] == sig.name  # no step lost
            assert found[3] == f"{workdir}/checkpoints/{found[1]}"
            assert Checkpoints(f"{workdir}/checkpoints", read_only=True).newest_intact() == int(
                found[1]
            )
        with Run(tiny_flags(workdir, **SIGNALLED), devices=1, env=cache) as rerun:
            assert rerun.finish(timeout=180) == 0, rerun.tail()
        if found:
            assert f"resuming from step {found[1]} " in "\n".join(rerun.log), rerun.tail()
        assert_npz_equal(f"{workdir}/final.npz", f"{reference}/final.npz")  # bit-identical
