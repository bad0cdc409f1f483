"""One training loop for pretraining and fine-tuning.

They differ only in config: the optimizer (Adam / SGD), `init_from` ('' = from
scratch with the model's own initialisation, or a published .npz loaded with
`weights.load_pretrained`: new zero head, position embeddings resized), the
resolution and the head. The jitted steps and their contract are in `steps.py`;
creating and restoring the state in `state.py`; the non-finite guard in `guard.py`;
the workdir (its files, checkpoints, records, lock; local or gs://) in `vit_jax/workdir/`. This
module reads the config, tells each of those what it needs (`plan_of`, `start_of`), and runs
the loop: data in, steps, evaluations, saves, console lines and TensorBoard scalars out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections

from vit_jax import data
from vit_jax.base import console, store
from vit_jax.configs import check
from vit_jax.evaluation import fewshot as fewshot_lib
from vit_jax.evaluation.batched import over_batches
from vit_jax.models import count_params
from vit_jax.models.vit import VisionTransformer
from vit_jax.parallel import distributed, sharding
from vit_jax.training import optim, planner, preemption, progress, steps
from vit_jax.training.events import EventWriter
from vit_jax.training.guard import FiniteGuard
from vit_jax.training.state import (
    Start,
    TrainState,
    abstract_state,
    build_model,
    export_npz,
    restore_or_create,
)
from vit_jax.weights import numerics
from vit_jax.workdir import lock, record
from vit_jax.workdir.checkpoints import Checkpoints
from vit_jax.workdir.workdir import Plan, Workdir, tree_bytes


@dataclasses.dataclass
class Loop:
    """What the loop works with, built once by `run`."""

    config: ml_collections.ConfigDict
    mesh: jax.sharding.Mesh
    model: VisionTransformer
    train_step: Any  # jitted (state, batch) -> (state, metrics); see steps.py
    eval_step: Any  # jitted (params, batch) -> per-example correct and loss
    saver: Checkpoints  # saves with their integrity records; .manager is Orbax's
    writer: EventWriter | None = None  # TensorBoard scalars, on the lead process
    fewshot: fewshot_lib.FewShotEvaluator | None = None
    stop: progress.StopRequest = dataclasses.field(default_factory=progress.StopRequest)


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
    """Train (pretrain or fine-tune) as `config` says, in `workdir` (a local path or a
    gs:// / s3:// URL); resumes from its newest intact checkpoint. Returns the final
    metrics, also written to workdir/summary.json.

    A workdir that this config already finished (summary.json at total_steps, final.npz,
    the last checkpoint of the same model and optimizer) is left as it is: the run says
    so and returns the stored summary. A run that fails before it wrote anything removes
    the directories it created. The lead process holds the workdir's lock (`workdir/lock.py`)
    while it runs. SIGTERM or Ctrl-C saves the step reached and stops with
    `preemption.Stopped`; a second Ctrl-C stops at once with `Interrupted`, which names
    the step reached and the newest checkpoint, where the same command resumes.

    Raises:
        ConfigError: fields of `config` that cannot make sense, every one named
            (`configs.check`), before anything is written (a ValueError).
        OSError: the workdir is not writable or its disk too small (before training);
            no checkpoint verifies (checkpoints.py); a save or the export failed.
        ValueError: the workdir's checkpoints are of another model or image size.
        FloatingPointError: a non-finite loss, gradient or state (see FiniteGuard).
        WorkdirLocked: another run holds the workdir (an OSError; nothing touched).
        Stopped: SIGTERM or Ctrl-C, the step saved (a KeyboardInterrupt).
        Interrupted: a second Ctrl-C (a KeyboardInterrupt).
    """
    check.check(config)  # every field that cannot make sense, before the workdir is touched
    wd = Workdir.at(workdir)
    plan = plan_of(config)
    done = wd.finished(plan)
    if done is not None:
        if distributed.is_lead():
            print(progress.finished_lines(wd, done), flush=True)
        return done
    created = wd.missing_dirs()
    where = Where(wd)
    try:
        wd.check_writable()  # before the lock, which writes into it
        with lock.held(wd.root, distributed.is_lead()), progress.StopRequest() as stop:
            return _run(config, plan, wd, where, stop)
    except lock.WorkdirLocked:
        raise  # another run's workdir: touch nothing
    except preemption.Stopped:
        wd.remove_empty(created)
        raise
    except KeyboardInterrupt as e:
        wd.remove_empty(created)
        raise Interrupted(where.message()) from e
    except BaseException:
        wd.remove_empty(created)  # only what this run created, and only if empty
        raise


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; str() is the one line that says where it stopped."""


@dataclasses.dataclass
class Where:
    """How far a run got: the last completed step (None before the first)."""

    workdir: Workdir
    step: int | None = None
    saver: Checkpoints | None = None

    def message(self) -> str:
        """'interrupted at step 37. The newest intact checkpoint is step 30 (DIR/30); a
        rerun resumes there' (Checkpoints.newest_intact_sentence, as every stopped run)."""
        if self.saver is not None:
            try:
                self.saver.wait()  # a save in flight: let it complete, it is the newest
            except BaseException:  # noqa: BLE001 (a second Ctrl-C, a failed save)
                pass
            sentence = self.saver.newest_intact_sentence()
        elif self.workdir.checkpoints.exists():
            reader = Checkpoints(self.workdir.checkpoints, read_only=True)
            sentence = reader.newest_intact_sentence()
        else:
            sentence = "There is no intact checkpoint yet; a rerun starts from step 0"
        at = "before the first step" if self.step is None else f"at step {self.step}"
        return f"interrupted {at}. {sentence}"


def plan_of(config: ml_collections.ConfigDict) -> Plan:
    """What the workdir's checks need of `config`: length, saves, export, and the state's
    description for the integrity record (model, optimizer, image size)."""
    # Numerics left unset (taken from init_from, else the original's) are left out, so
    # that a workdir finished before the fields existed still matches its config.
    model = config.model.to_dict()
    for field in ("gelu", "layer_norm_eps"):
        if model.get(field) is None:
            model.pop(field, None)
    state = record.describe(model, config.optimizer.to_dict(), config.image_size)
    return Plan(
        total_steps=config.total_steps,
        checkpoint_every=config.checkpoint_every,
        keep_checkpoints=config.keep_checkpoints,
        export_npz=bool(config.export_npz),
        state=state,
    )


def start_of(config: ml_collections.ConfigDict) -> Start:
    """How `config`'s state begins: seed, image size, and the checkpoint it fine-tunes."""
    return Start(
        seed=config.seed,
        image_size=config.image_size,
        init_from=config.init_from or None,
        reset_head=config.reset_head,
        patch_size=config.model.get("patch_size"),
    )


def _run(
    config: ml_collections.ConfigDict,
    plan: Plan,
    workdir: Workdir,
    where: Where,
    stop: progress.StopRequest,
) -> dict[str, Any]:
    start_time = time.time()
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
    model = build_model(config.model, data.num_classes(config.dataset), config.init_from or None)
    tx, lr_fn = optim.for_config(config)
    start = start_of(config)
    abstract = abstract_state(start, model, tx)
    state_bytes, npz_bytes = tree_bytes(abstract), 4 * count_params(abstract.params)
    workdir.check_free_space(plan, state_bytes, npz_bytes)
    # Everything that runs beside the loop (the saver's threads and Orbax's, the event
    # writer's thread, the input pipeline's threads or processes) is closed when the run
    # ends, however it ends: nothing of one run outlives it into the next.
    with contextlib.ExitStack() as running:
        saver = running.enter_context(
            Checkpoints(workdir.checkpoints, config.keep_checkpoints, plan.state)
        )
        where.saver = saver
        scratch = config.get("from_scratch_if_damaged", False)
        state, shardings = restore_or_create(start, model, tx, mesh, saver, scratch)
        where.step = int(jax.device_get(state.step))
        train_step, eval_step = steps.for_config(config, model, tx, lr_fn, mesh, shardings)
        writer = running.enter_context(EventWriter(workdir.root)) if distributed.is_lead() else None
        loop = Loop(
            config, mesh, model, train_step, eval_step, saver, writer, fewshot_evaluator(config)
        )
        loop.stop = stop  # SIGTERM, Ctrl-C: save and stop between steps (preemption.py)
        batches = running.enter_context(
            data.train_iterator(
                config.dataset,
                global_batch=config.batch_size,
                image_size=config.image_size,
                seed=config.seed,
                start_step=where.step,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
            )
        )
        state, metrics, evals = train_loop(loop, state, batches, where)
        preemption.stop_if_asked(loop, state)  # before the final evaluation and export
        if "accuracy" not in evals:  # resumed after the last step: evaluate it again
            evals.update(evaluate(loop, state.params))
        if config.export_npz:
            computes = numerics.of_model(model)  # a run fine-tuned from timm or HF keeps them
            names = data.class_names(config.dataset)  # infer names the classes with them
            method = config.dataset.preprocessing  # infer and evaluate resize as it trained
            _export(workdir.final_npz, state.params, saver, computes, names, method)
        summary = {
            "model": config.model.name,
            "steps": int(jax.device_get(state.step)),
            "num_params": count_params(state.params),
            "accuracy": evals["accuracy"],
            "eval_loss": evals["loss"],
            "train_loss": metrics.get("loss"),
            "skipped_steps": int(jax.device_get(optim.skipped_steps(state.opt_state))),
            **{k: v for k, v in evals.items() if k.startswith(fewshot_lib.PREFIX)},
            "img_per_sec_per_device": metrics.get("img_per_sec_per_device"),
            "wall_seconds": time.time() - start_time,
        }
        if writer is not None:
            progress.write_summary(workdir.summary, summary)
    return summary


def train_loop(
    loop: Loop, state: TrainState, batches: Iterator[dict], where: Where | None = None
) -> tuple[TrainState, dict, dict]:
    """The steps from the state's own to config.total_steps: (state, metrics, evals);
    evals holds the last test accuracy and loss, and few-shot accuracies if any.
    `batches` yields this process's share of each step's batch from the state's step on;
    `where.step` follows the steps run (for the message of an interrupted run)."""
    config, mesh = loop.config, loop.mesh
    start = int(jax.device_get(state.step))
    cadence = progress.Cadence(
        config.total_steps, config.log_every, config.eval_every, config.checkpoint_every,
        config.fewshot.every or config.eval_every,
    )  # fmt: skip
    speed = progress.Throughput(config.total_steps, config.batch_size, jax.device_count(), start)
    guard = FiniteGuard(loop.saver, config.skip_nonfinite, start,
                        int(jax.device_get(optim.skipped_steps(state.opt_state))))  # fmt: skip
    agree = preemption.Agreement(mesh)
    preemption.stop_if_asked(loop, state, agree)  # a signal during start-up
    _announce(loop, state, start)
    metrics, evals = {}, {}
    for step in range(start + 1, config.total_steps + 1):
        batch = sharding.global_batch(agree.into(next(batches), loop.stop.requested), mesh)
        state, m = loop.train_step(state, batch)
        if where is not None:
            where.step = step
        if step == start + 1:  # compiled: neither the speed nor the ETA counts that step
            jax.block_until_ready(m)
            _compiled(loop, step, speed.compiled(step), state, batch, cadence.due("log", step))
        del batch
        # What follows the step; a stop is the one every process agrees on (lagged).
        due = cadence.after(step, agree.lagged(loop.stop.requested, m), loop.fewshot is not None)
        if due.log or due.save:  # before any save: nothing non-finite is ever written
            metrics = {k: float(v) for k, v in jax.device_get(m).items() if k != "stop"}
            if due.log:  # timed here: the step is done, the checks below are not training
                metrics.update(speed.update(step))
            if due.save and not config.skip_nonfinite:  # skipped steps keep a finite state
                metrics["finite"] = min(metrics["finite"], float(record.all_finite(state)))
            guard.check(metrics, step)
        if due.log:
            progress.write(loop.writer, step, config.total_steps, metrics)
        if due.eval:
            evals.update(evaluate(loop, state.params))
            progress.write(loop.writer, step, config.total_steps, metrics, evals)
        if due.fewshot:
            evals.update(loop.fewshot.run(loop.model, state.params, mesh))
            progress.write_fewshot(loop.writer, step, evals)
        if due.save:
            _save(loop, step, state)
        if due.eval or due.fewshot or due.save:  # the throughput clock counts training steps
            speed.pause(step)
        if due.stopping:
            preemption.stop(loop, step, due.stopping, saved=True)
    loop.saver.wait()
    return state, metrics, evals


def _announce(loop: Loop, state: TrainState, start: int) -> None:
    """'training MODEL (N parameters) for S steps; compiling the first step...'"""
    total = loop.config.total_steps
    if distributed.is_lead() and start < total:
        print(f"training {loop.config.model.name} ({count_params(state.params):,} parameters) "
              f"for {total - start} steps; compiling the first step...", flush=True)  # fmt: skip


def _compiled(
    loop: Loop, step: int, took: float, state: TrainState, batch: dict, logged: bool
) -> None:
    """After the first step: how long it took to compile and run (where no log line says
    it), and what the compiler says of the step (planner.own_plan_line)."""
    if distributed.is_lead() and not logged:
        print(f"step {step}: compiled and ran in {console.duration(took)}", flush=True)
    own = planner.own_plan_line(loop.train_step, state, batch, planner.loop_of(loop.config))
    if distributed.is_lead() and own:
        print(own, flush=True)


def _save(loop: Loop, step: int, state: TrainState) -> None:
    """Starts the save of `step` (Orbax writes it in the background) and says so."""
    loop.saver.save(step, state)
    if distributed.is_lead():
        print(f"step {step}: saving checkpoint {loop.saver.directory}/{step}", flush=True)


def _export(
    path: Any,
    params: Any,
    checkpoints: Checkpoints,
    computes: dict | None = None,
    labels: list[str] | None = None,
    method: str | None = None,
) -> None:
    """export_npz, with the run's one message when the file cannot be written."""
    try:
        export_npz(path, params, computes, labels, method)
    except Exception as e:  # noqa: BLE001 (OSError on a disk; a store raises its own)
        raise OSError(
            f"could not write {path}: {store.explain(e, path)}. Nothing half-written was "
            f"left. {checkpoints.newest_intact_sentence()}: free space there (or restore "
            "access to it) and run the same command again, which writes it without training "
            "again"
        ) from e


def evaluate(loop: Loop, params: Any) -> dict[str, float]:
    """Accuracy and loss over the whole test split (each example exactly once)."""
    config = loop.config
    split = config.dataset.test_split
    n = data.num_examples(config.dataset, split)
    batches = data.eval_iterator(
        config.dataset,
        split,
        global_batch=config.eval_batch_size,
        image_size=config.image_size,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    show = distributed.is_lead() and config.progress_bars
    correct = loss = count = 0.0
    with batches:
        bar = console.bar(batches, -(-n // config.eval_batch_size), f"eval {split}", show)
        for out, _ in over_batches(loop.eval_step, params, bar, loop.mesh):
            correct += float(out["correct"].sum())
            loss += float(out["loss"].sum())
            count += len(out["loss"])
    count = max(count, 1.0)
    return {"accuracy": float(correct) / count, "loss": float(loss) / count}


def fewshot_evaluator(config: ml_collections.ConfigDict) -> fewshot_lib.FewShotEvaluator | None:
    """The FewShotEvaluator of `config.fewshot`, or None when it names no dataset."""
    f = config.fewshot
    names = [n.strip() for n in f.datasets.split(",") if n.strip()]
    if not names:
        return None
    datasets = fewshot_lib.dataset_configs(
        names,
        f.source or None,
        f.data_dir or None,
        f.train_split,
        f.test_split,
        preprocessing=config.dataset.preprocessing,  # the probe sees what training sees
    )
    return fewshot_lib.FewShotEvaluator(
        datasets, f.shots, f.l2, f.seed, config.image_size, f.batch_size
    )
