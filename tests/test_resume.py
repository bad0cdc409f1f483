"""Surviving a kill: SIGKILLed runs resume bit-identically; interrupted saves are never
picked up; non-finite steps are never saved (or are skipped); a small disk fails first."""

import contextlib
import os
import random
import re
import time

import pytest
from helpers import assert_npz_equal, needs_embedded_data
from subprocesses import Run, tiny_flags

# 4 devices, FSDP over 2 of them (the MLP kernels are split), dropout on: the dropout
# keys, the data order and the sharded state all have to come back exactly.
KILL_RUN = dict(
    total_steps=24,
    checkpoint_every=4,
    keep_checkpoints=2,
    log_every=1,
    eval_every=0,
    **{"mesh.fsdp": 2, "model.width": 64, "model.mlp_dim": 256, "model.dropout": 0.1},
)


def _steps(workdir):
    directory = os.path.join(workdir, "checkpoints")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return {n: os.path.exists(f"{directory}/{n}/commit_success.txt") for n in names if n.isdigit()}


def complete_steps(workdir):
    return sorted(int(n) for n, done in _steps(workdir).items() if done)


def partial_saves(workdir):
    """The checkpoints being written (or left by a kill): a step without Orbax's commit
    file (one mode everywhere: the commit file, as on an object store)."""
    return {n for n, done in _steps(workdir).items() if not done}


def started(line):  # the first step's line: the checkpoint manager is open by then
    return re.match(r"step \d+/24", line) is not None


@pytest.mark.slow
@needs_embedded_data
def test_killed_run_resumes_bit_identically(tmp_path):
    rng = random.Random(0)
    reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
    # SIGKILL mid-run between saves, during an asynchronous save (the moment a new step
    # directory without its commit file appears: the save is under way), and late.
    kills = ["step 6/24", "during a save", "step 19/24"]
    # The first run compiles; the others (and the reference) load its programs.
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    logs, resumable, leftovers, during_save = [], [], [], []
    with contextlib.ExitStack() as stack:
        while kills:
            kill = kills.pop(0)
            before = partial_saves(killed)
            with Run(tiny_flags(killed, **KILL_RUN), devices=4, env=cache) as run:
                if not logs:  # the uninterrupted reference runs alongside
                    run.wait_for(lambda line: line.startswith("step 1/24"))
                    ref = stack.enter_context(Run(tiny_flags(reference, **KILL_RUN), 4, cache))
                if kill == "during a save":
                    run.wait_for(started)
                    run.wait_until(lambda before=before: partial_saves(killed) - before)
                else:
                    run.wait_for(lambda line, kill=kill: line.startswith(kill))
                    time.sleep(rng.uniform(0.0, 0.3))
                run.kill()
            logs.append("\n".join(run.log))
            resumable.append(max(complete_steps(killed), default=None))
            leftovers.append(bool(partial_saves(killed)))
            # What the kill left is what it found: the save's partial directory, newer
            # than every complete checkpoint. A save that completed in the microseconds
            # between the two is no kill during a save: the next run tries again.
            new = {int(n) for n in partial_saves(killed) - before}
            if kill == "during a save":
                during_save.append(bool(new) and min(new) > (resumable[-1] or 0))
                if not during_save[-1] and len(during_save) < 3:
                    kills.insert(0, kill)
        with Run(tiny_flags(killed, **KILL_RUN), devices=4, env=cache) as run:
            assert run.finish() == 0, run.tail()
            logs.append("\n".join(run.log))
        assert ref.finish() == 0, ref.tail()
    assert during_save[-1], during_save  # a kill landed while a save was being written
    # Each restart says where it resumed: the last complete checkpoint, never a partial one.
    for i, step in enumerate(resumable):
        if step is None:  # killed before its first save was complete: starts again
            assert "resuming" not in logs[i + 1] and "step 1/24" in logs[i + 1]
        else:
            assert f"resuming from step {step} " in logs[i + 1], logs[i + 1]
        assert ("ignoring incomplete checkpoint" in logs[i + 1]) == leftovers[i]
    assert any(step is not None for step in resumable)  # some restart really resumed
    assert "step 24/24" in logs[-1] and "step 1/24" not in logs[-1]
    assert_npz_equal(f"{killed}/final.npz", f"{reference}/final.npz")  # bit-identical
    print(f"resumed from {resumable}; interrupted saves left behind: {leftovers}; ", end="")
    print(f"kills during a save: {during_save}")
