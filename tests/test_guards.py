"""Guards: a non-finite step is never saved (or is skipped inside the jitted step); a
disk too small for the run's checkpoints fails before training starts."""

import os
import re
import shutil
from typing import Any

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import (
    assert_trees_equal,
    batch,
    model_and_optimizer,
    needs_embedded_data,
    tiny_config,
    training,
)

from vit_jax.parallel import sharding
from vit_jax.training import state as state_lib
from vit_jax.training import stopping, train
from vit_jax.workdir import checkpoints as checkpoints_lib
from vit_jax.workdir import workdir
from vit_jax.workdir.checkpoints import Checkpoints
from vit_jax.workdir.workdir import Plan

NAN = float("nan")


def restore_all(config, workdir):
    """Every saved step of `workdir` -> its state on host."""
    model, tx, _ = model_and_optimizer(config)
    abstract = state_lib.abstract_state(state_lib.Start.of(config), model, tx)
    target = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(
            a.shape,
            a.dtype,
            sharding=sharding.replicated(sharding.make_mesh(devices=jax.devices()[:1])),
        ),
        abstract,
    )
    manager = Checkpoints(f"{workdir}/checkpoints", read_only=True).manager
    restore = lambda s: manager.restore(s, args=ocp.args.StandardRestore(target))
    return {s: jax.device_get(restore(s)) for s in manager.all_steps()}


@needs_embedded_data
def test_nonfinite_run_stops_and_names_the_last_good_checkpoint(tmp_path):
    # SGD at lr 300 diverges within a few steps; checks at steps 1, 2, 4, 6, ...
    c = tiny_config(
        total_steps=12, checkpoint_every=2, log_every=100, eval_every=0, export_npz=False
    )
    c.optimizer.update(name="sgd", lr=300.0, grad_clip=0.0, warmup_steps=0, decay="constant")
    with pytest.raises(FloatingPointError) as error:
        train.run(c, str(tmp_path))
    found = re.search(
        r"at step (\d+).*newest intact checkpoint is step (\d+) \((\S+)/\d+\)", str(error.value)
    )
    assert found, error.value
    bad, good = int(found[1]), int(found[2])
    assert found[3] == str(tmp_path / "checkpoints") and "skip_nonfinite=True" in str(error.value)
    saved = restore_all(c, str(tmp_path))
    assert max(saved) == good < bad and good >= 2  # nothing at or after the bad step
    for step, state in saved.items():
        assert int(state.step) == step
        for x in jax.tree.leaves(state):
            assert np.isfinite(x).all(), step


def test_skip_nonfinite_keeps_the_state_and_counts_the_step():
    c = tiny_config()
    c.optimizer.warmup_steps = 0
    mesh = sharding.make_mesh()
    state, step, _ = training(c, mesh, skip_nonfinite=True)
    good, bad = batch(64), batch(64)
    bad["image"][5] = np.nan  # one bad example poisons the whole step
    state, m = step(state, sharding.global_batch(good, mesh))
    before = jax.device_get(state)
    assert int(m["skipped"]) == 0 and int(state_lib.skipped_steps(before.opt_state)) == 0
    state, m = step(state, sharding.global_batch(bad, mesh))
    assert float(m["finite"]) == 0.0 and int(m["skipped"]) == 1 and np.isnan(float(m["loss"]))
    after = jax.device_get(state)
    assert (
        int(after.step) == 2 and int(state_lib.skipped_steps(after.opt_state)) == 1
    )  # data move on
    assert int(after.opt_state.notfinite_count) == 1 and not after.opt_state.last_finite
    kept = (
        (before.params, before.opt_state.inner_state),
        (after.params, after.opt_state.inner_state),
    )
    assert_trees_equal(kept[1], kept[0])
    state, m = step(state, sharding.global_batch(good, mesh))
    assert float(m["finite"]) == 1.0 and int(m["skipped"]) == 1
    assert int(state.opt_state.notfinite_count) == 0  # the row is broken
    kernel = jax.device_get(state.params["head"]["kernel"])
    assert np.isfinite(kernel).all() and not np.array_equal(kernel, after.params["head"]["kernel"])


def test_finite_steps_with_skip_nonfinite_match_the_plain_optimizer():
    """To float32 rounding, not bit for bit: apply_if_finite runs the update in lax.cond,
    which XLA compiles apart (the old jnp.where after the update was bit-equal). SGD:
    Adam would blow the rounding noise of gradients that are zero in exact arithmetic
    (the attention keys' bias) up to learning-rate-sized steps."""
    c = tiny_config()
    c.optimizer.update(name="sgd", warmup_steps=0)
    mesh = sharding.make_mesh()
    states = []
    for skip in (False, True):
        state, step, _ = training(c, mesh, skip_nonfinite=skip)
        for seed in range(3):
            state, m = step(state, sharding.global_batch(batch(64, seed=seed), mesh))
        states.append(jax.device_get(state))
        assert int(m["skipped"]) == 0
    plain, skipping = states
    want = jax.tree.leaves((plain.params, plain.opt_state))
    got = jax.tree.leaves((skipping.params, skipping.opt_state.inner_state))
    for x, y in zip(want, got, strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-7)


@flax.struct.dataclass
class TrainStateBeforeApplyIfFinite:
    """vit_jax's TrainState before optax.apply_if_finite: the skipped count beside the
    optimizer state."""

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    skipped: jax.Array


@pytest.mark.parametrize("skip", [False, True])
@needs_embedded_data
def test_a_workdir_saved_before_apply_if_finite_gets_one_line(tmp_path, skip):
    c = tiny_config(export_npz=False, skip_nonfinite=skip)
    model, tx, _ = model_and_optimizer(c)  # the optimizer state then
    new = state_lib.new_state(state_lib.Start.of(c), model, tx)
    old = TrainStateBeforeApplyIfFinite(
        new.step + 3, new.params, new.opt_state, new.rng, jax.numpy.ones((), jax.numpy.int32)
    )
    workdir = str(tmp_path / "run")
    with Checkpoints(f"{workdir}/checkpoints", 3, Plan.of(c).state) as saver:
        saver.save(3, old)
        saver.wait()
    step_dir = os.path.join(workdir, "checkpoints", "3")
    for recorded in (True, False):  # the record's names, then Orbax's metadata
        if not recorded:
            os.remove(os.path.join(step_dir, checkpoints_lib.NAME))
        with pytest.raises(ValueError) as error:
            train.run(c, workdir)
        message = str(error.value)
        assert "\n" not in message
        assert message.startswith(f"checkpoint {step_dir} was written by an older vit_jax")
        assert "optax.apply_if_finite" in message and "another workdir" in message
    assert Checkpoints(f"{workdir}/checkpoints", read_only=True).steps() == [3]  # not set aside


def test_skipping_stops_after_too_many_in_a_row(tmp_path):
    guard = stopping.FiniteGuard(Checkpoints(tmp_path / "checkpoints", 1), skip=True)

    def check(step, skipped):
        metrics = {"loss": NAN, "grad_norm": NAN, "finite": 0.0, "skipped": skipped}
        guard.check(metrics, step)

    for step in range(1, 6):  # steps 1-5 skipped
        check(step, step)
    check(6, 5)  # a good step breaks the row
    for step in range(7, 16):  # 9 in a row: still going
        check(step, step - 1)
    stop = r"steps 7 to 16 all had a non-finite .* There is no intact checkpoint yet; a rerun"
    with pytest.raises(FloatingPointError, match=stop):
        check(16, 15)


@needs_embedded_data
def test_small_disk_fails_before_training(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10_000))
    workdir = str(tmp_path / "run")
    with pytest.raises(OSError) as error:
        train.run(tiny_config(), workdir)
    # Sizes in the unit that reads: the tiny run's checkpoints are kilobytes, not 0.00 GiB.
    found = re.match(
        rf"workdir {workdir} has 9.8 KiB free; this run needs about (\d+\.\d) KiB "
        r"\(checkpoints of (\d+\.\d) KiB each, keep_checkpoints=3, ",
        str(error.value),
    )
    assert found and float(found[1]) > 2 * float(found[2]) > 0, str(error.value)  # 2 saves
    assert not os.path.exists(os.path.join(workdir, "checkpoints"))


def test_disk_needed():
    c = tiny_config(total_steps=100, checkpoint_every=10, keep_checkpoints=3, export_npz=True)
    # 10 saves: 3 kept, a 4th while a new one replaces the oldest; final.npz.
    assert workdir.disk_needed(Plan.of(c), 1000, 10, existing=0) == 4 * 1000 + 10
    assert workdir.disk_needed(Plan.of(c), 1000, 10, existing=3000) == 1000 + 10  # resuming
    c.update(keep_checkpoints=0, export_npz=False)  # keep all ten
    assert workdir.disk_needed(Plan.of(c), 1000, 10, existing=0) == 10_000
    c.update(total_steps=20, keep_checkpoints=3)  # only two saves
    assert workdir.disk_needed(Plan.of(c), 1000, 10, existing=0) == 2000
