"""Two processes on one machine (loopback, JAX's distributed runtime, Gloo collectives
on CPU), 4 emulated devices each, train as one process with all 8 devices does: each
process reads its half of every batch, the state is split over both by FSDP, Orbax
saves and restores from both (each hashing its own shards for the integrity record), and
process 0 exports the gathered parameters."""

import os
import re
import socket
import sys

import jax
import numpy as np
import pytest
from helpers import assert_trees_equal, flat, needs_embedded_data, tiny_config
from subprocesses import Run, tiny_flags

from vit_jax import weights
from vit_jax.configs import common
from vit_jax.parallel import distributed
from vit_jax.training import train
from vit_jax.workdir import checkpoints as checkpoints_lib
from vit_jax.workdir import verify
from vit_jax.workdir.checkpoints import Checkpoints

# FSDP over all 8 devices: the large arrays are split across the two processes. SGD,
# whose updates follow the gradients' float noise linearly (Adam's do not near 0).
RUN = {"mesh.fsdp": 8, "model.width": 64, "model.mlp_dim": 256, "eval_every": 0}
RUN.update({"optimizer.name": "sgd", "optimizer.lr": 0.1, "log_every": 1, "total_steps": 8})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What process 0 says when its coordinator cannot bind the port (gRPC's words; JAX then
# ends the process, by SIGSEGV in jax 0.10).
# How the coordinator says it could not bind its port: JAX 0.10 "Failed to add port" or
# "Address already in use"; JAX 0.12 (Python >= 3.12) "Failed to start RPC server".
BIND_FAILED = re.compile(r"Failed to add port|[Aa]ddress already in use|Failed to start RPC server")


def launch_pair(workdir, cache, attempts: int = 3, places=(None, None), overrides=RUN, processes=2):
    """The processes of one run (`processes`, 2: 0 and 1), once they have joined, the 8
    devices shared among them (4 each for a pair).

    The port comes from free_port, which must close it before the coordinator binds it:
    another program may take it in between (a machine running other tests). Process 0
    then fails to bind: the pair is started again on another port. `places`: each
    process's own working directory (and TMPDIR in it), as on two hosts; None: the
    repository's root. `overrides`: the run's config fields.
    """
    for attempt in range(attempts):
        address = f"127.0.0.1:{free_port()}"
        runs = []
        assert 8 % processes == 0, f"8 devices cannot be shared among {processes}"
        places, devices = tuple(places) + (None,) * (processes - len(places)), 8 // processes
        for i in range(processes):
            flags = tiny_flags(workdir, **overrides)
            flags += [
                f"--config.distributed.coordinator_address={address}",
                f"--config.distributed.num_processes={processes}",
                f"--config.distributed.process_id={i}",
                "--config.distributed.timeout_seconds=60",
            ]
            if places[i] is None:
                runs.append(Run(flags, devices=devices, env=cache))
            else:
                tmp = os.path.join(places[i], "tmp")
                os.makedirs(tmp, exist_ok=True)
                runs.append(Run(flags, devices, {**cache, "TMPDIR": tmp}, cwd=str(places[i])))
        try:
            runs[0].wait_for(lambda line: line.startswith(f"process 0 of {processes}: "))
            return runs
        except RuntimeError:  # process 0 ended before it joined
            for run in runs:
                run.kill()
            if not BIND_FAILED.search(runs[0].tail()) or attempt == attempts - 1:
                raise
            print(f"{address} was taken before the coordinator bound it; another port")
        except BaseException:
            for run in runs:
                run.kill()
            raise
    raise AssertionError("not reached")


def finish_pair(runs):
    try:
        for run in runs:
            assert run.finish() == 0, run.tail()
        return ["\n".join(run.log) for run in runs]
    finally:
        for run in runs:
            run.kill()


def test_a_taken_port_is_retried_on_another(tmp_path, monkeypatch, capsys):
    """The race, forced: the first port free_port gives is held by another listener, so
    process 0 cannot bind it; launch_pair starts the pair again on a free one."""
    pick = free_port
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        given = [taken.getsockname()[1]]
        monkeypatch.setattr(sys.modules[__name__], "free_port", lambda: (given or [pick()]).pop())
        runs = launch_pair(str(tmp_path / "two"), {})
        port = taken.getsockname()[1]
    try:
        assert given == []  # the taken port was tried first
        assert capsys.readouterr().out == (
            f"127.0.0.1:{port} was taken before the coordinator bound it; another port\n"
        )
        assert runs[0].log[-1] == "process 0 of 2: 4 of 8 devices"
    finally:
        for run in runs:
            run.kill()


@pytest.mark.slow
@needs_embedded_data
def test_two_processes_train_like_one(tmp_path):
    workdir = str(tmp_path / "two")
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    first = launch_pair(workdir, cache)
    # Meanwhile, the reference: this process, all 8 devices.
    train.run(tiny_config(**RUN), str(tmp_path / "one"))
    logs = finish_pair(first)
    assert "process 0 of 2: 4 of 8 devices" in logs[0]
    assert "process 1 of 2: 4 of 8 devices" in logs[1]
    assert "step 8/8" in logs[0] and "step 8/8" not in logs[1]  # process 0 logs
    assert sorted(os.listdir(f"{workdir}/checkpoints")) == ["8"]
    # The integrity record merges both processes' checksums (all-gathered at the save): an
    # array FSDP splits over the 8 devices has 8 slices, 4 hashed by each process; read
    # back here, the step verifies.
    record = checkpoints_lib.read_record(
        Checkpoints(f"{workdir}/checkpoints", read_only=True).directory / "8"
    )
    assert record["process_count"] == 2
    split = [name for name, a in record["arrays"].items() if len(a["shards"]) == 8]
    assert any("MlpBlock" in name and name.endswith("kernel") for name in split), record
    assert verify.verify(Checkpoints(f"{workdir}/checkpoints", read_only=True)) == [
        ("8", "verifies")
    ]
    want = flat(weights.load_npz(tmp_path / "one" / "final.npz"))
    got = flat(weights.load_npz(f"{workdir}/final.npz"))
    assert_trees_equal(got, want, atol=1e-6)
    assert np.abs(want["head/kernel"]).max() > 0.01  # moved off its zero initialisation
    # Restarted, both processes restore their shards of step 8 and export it again.
    os.remove(f"{workdir}/final.npz")
    logs = finish_pair(launch_pair(workdir, cache))
    assert "resuming from step 8 " in logs[0] and "step 8: test accuracy" not in logs[0]
    assert_trees_equal(flat(weights.load_npz(f"{workdir}/final.npz")), got)


def test_distributed_settings_are_checked():
    cfg = common.base("testing").distributed
    distributed.initialize(cfg)  # nothing set: one process, nothing happens
    assert not distributed.wanted(cfg) and jax.process_count() == 1
    cfg.num_processes = 2
    with pytest.raises(ValueError, match="set all of coordinator_address"):
        distributed.initialize(cfg)
    cfg.update(coordinator_address="127.0.0.1:1234", process_id=2)
    with pytest.raises(ValueError, match="process_id=2 is not in"):
        distributed.initialize(cfg)


@pytest.mark.slow
def test_sigterm_to_one_process_both_save_the_same_step_and_resume(tmp_path):
    import re
    import signal

    workdir = str(tmp_path / "two")
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    runs = launch_pair(workdir, cache)
    try:
        runs[0].wait_for(lambda line: line.startswith("step 3/8"), timeout=150)
        os.kill(runs[1].proc.pid, signal.SIGTERM)  # process 1 only: it does not log
        statuses = [run.finish(timeout=150) for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert statuses == [143, 143], [run.tail() for run in runs]
    lines = [run.log[-1] for run in runs]
    found = [
        re.fullmatch(r"stopped at step (\d+) by SIGTERM; checkpoint \1 saved .*", x) for x in lines
    ]
    assert all(found) and found[0][1] == found[1][1], lines  # the same step on both
    step = found[0][1]
    kept = Checkpoints(f"{workdir}/checkpoints", read_only=True)
    assert 3 <= int(step) < 8 and kept.steps()[-1] == int(step)
    assert checkpoints_lib.read_record(kept.directory / step)["process_count"] == 2
    logs = finish_pair(launch_pair(workdir, cache))
    assert f"resuming from step {step} " in logs[0] and "step 8/8" in logs[0]
    train.run(tiny_config(**RUN), str(tmp_path / "one"))  # the reference, all 8 devices here
    want = flat(weights.load_npz(tmp_path / "one" / "final.npz"))
    assert_trees_equal(flat(weights.load_npz(f"{workdir}/final.npz")), want, atol=1e-6)
