"""Surviving a kill: SIGKILLed runs resume bit-identically; interrupted saves are never
picked up; non-finite steps are never saved (or are skipped); a small disk fails first."""

import contextlib
import os
import random
import shutil
import time

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import assert_npz_equal, needs_embedded_data
from subprocesses import Run, tiny_flags

from vit_jax.workdir import manager as workdir_lib

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


def complete_steps(workdir):
    names = os.listdir(os.path.join(workdir, "checkpoints"))
    return sorted(int(n) for n in names if n.isdigit())


@pytest.mark.slow
@needs_embedded_data
def test_killed_run_resumes_bit_identically(tmp_path):
    rng = random.Random(0)
    reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
    # Kill mid-run between saves, right after an asynchronous save starts, and late.
    kills = [
        (lambda line: line.startswith("step 6/24"), rng.uniform(0.0, 0.3)),
        (lambda line: line.startswith("step 12: saving checkpoint"), 0.0),
        (lambda line: line.startswith("step 19/24"), rng.uniform(0.0, 0.3)),
    ]
    # The first run compiles; the others (and the reference) load its programs.
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    logs, resumable, leftovers = [], [], []
    with contextlib.ExitStack() as stack:
        for trigger, delay in kills:
            with Run(tiny_flags(killed, **KILL_RUN), devices=4, env=cache) as run:
                if not logs:  # the uninterrupted reference runs alongside
                    run.wait_for(lambda line: line.startswith("step 1/24"), timeout=120)
                    ref = stack.enter_context(Run(tiny_flags(reference, **KILL_RUN), 4, cache))
                run.wait_for(trigger, timeout=120)
                time.sleep(delay)
                run.kill()
            logs.append("\n".join(run.log))
            resumable.append(max(complete_steps(killed), default=None))
            leftovers.append(any("tmp" in n for n in os.listdir(f"{killed}/checkpoints")))
        with Run(tiny_flags(killed, **KILL_RUN), devices=4, env=cache) as run:
            assert run.finish(timeout=120) == 0, run.tail()
            logs.append("\n".join(run.log))
        assert ref.finish(timeout=120) == 0, ref.tail()
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
    print(f"resumed from {resumable}; interrupted saves left behind: {leftovers}")


def test_interrupted_save_is_never_picked_up(tmp_path, capsys):
    manager = workdir_lib.open_manager(str(tmp_path), 3)
    manager.save(4, args=ocp.args.StandardSave({"w": jnp.arange(3.0)}))
    manager.wait_until_finished()
    # What a kill during the save of step 8 leaves: a partial copy under Orbax's tmp name.
    directory = tmp_path / "checkpoints"
    partial = directory / f"8{workdir_lib.TMP_MARK}"
    shutil.copytree(directory / "4", partial)
    for f in partial.rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[:10])
    capsys.readouterr()
    manager = workdir_lib.open_manager(str(tmp_path), 3)
    assert "ignoring incomplete checkpoint(s) 8.orbax-checkpoint-tmp" in capsys.readouterr().out
    assert manager.latest_step() == 4 and manager.all_steps() == [4]
    restored = manager.restore(4, args=ocp.args.StandardRestore({"w": jnp.zeros(3)}))
    np.testing.assert_array_equal(restored["w"], [0.0, 1.0, 2.0])
    manager.wait_until_finished()
    assert sorted(os.listdir(directory)) == ["4"]  # and the leftover is gone
