"""One training loop for pretraining and fine-tuning.

They differ only in config: the optimizer (Adam / SGD), `init_from` ('' = from scratch,
or a checkpoint of any format), the resolution and the head. Read top to bottom: `run`
opens the workdir and holds its lock; `_start` builds the model, optimizer and state
(state.py) and jits the steps (step.py, where their contract is written); `train_loop`
runs them: a batch, `train_step`, then what is due (log, evaluate, few-shot, save, stop).

A resumed run is bit-identical to an uninterrupted one: the state (step, dropout key,
optimizer state with its skipped count) is all in the checkpoint, the input pipeline is
a pure function of (config, seed, step), and dropout keys are folded with the step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import ml_collections

from vit_jax import data
from vit_jax.base import console
from vit_jax.evaluation import fewshot as fewshot_lib
from vit_jax.evaluation.batched import eval_batches, over_batches
from vit_jax.models import count_params
from vit_jax.parallel import distributed, sharding
from vit_jax.training import abstract, check, compiled, outputs, report, stopping
from vit_jax.training import state as state_lib
from vit_jax.training.state import TrainState
from vit_jax.training.step import jit_steps
from vit_jax.weights.meta import Meta
from vit_jax.weights.read import read_meta
from vit_jax.workdir import lock, verify
from vit_jax.workdir.checkpoints import Checkpoints
from vit_jax.workdir.workdir import Plan, Workdir, tree_bytes


@dataclasses.dataclass(frozen=True)
class Loop:
    """What the loop works with, built whole by `_start`."""

    config: ml_collections.ConfigDict
    mesh: jax.sharding.Mesh
    model: Any
    train_step: Callable  # step.py's contract
    eval_step: Callable
    saver: Checkpoints  # saves with their integrity records
    writer: report.EventWriter | None  # TensorBoard scalars, on the lead process only
    fewshot: fewshot_lib.FewShotEvaluator | None  # None: no few-shot evaluation
    stop: stopping.StopRequest  # the signals, and the step reached


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
    """Train as `config` says in `workdir` (a path or a gs:// / s3:// URL), resuming from
    its newest intact checkpoint; returns the final metrics, also in summary.json. A
    workdir this config finished is left as it is; a run that fails before it wrote
    anything removes the directories it created. The lead process holds the workdir's
    lock. SIGTERM or Ctrl-C saves the step reached and raises `stopping.Stopped`; a
    second Ctrl-C raises `stopping.Interrupted`. A store that stops answering for longer
    than config.store.retry_seconds ends the process with status 75 (base/outage.py), as
    does a lost process of a multi-process run (parallel/distributed.py).

    Raises:
        ConfigError: every field of `config` that cannot make sense, before anything is
            written (training/check.py; a ValueError).
        OSError: an unwritable workdir or too small a disk (before training); no
            checkpoint verifies; a save or the export failed.
        ValueError: the workdir's checkpoints are of another model or image size.
        FloatingPointError: a non-finite loss, gradient or state (stopping.FiniteGuard).
        WorkdirLocked: another run holds the workdir (an OSError; nothing touched).
    """
    check.check(config)  # every field that cannot make sense, before the workdir is touched
    _resolve_pixels(config)
    plan, stop = Plan.of(config), stopping.StopRequest()
    watched = distributed.peers_watched(config.distributed)  # a lost process: exit 75
    with watched, Workdir.open(workdir, config.store.retry_seconds) as wd:
        if (done := wd.finished(plan)) is not None:
            report.say(report.finished_lines(wd, done))
            return done
        created = wd.missing_dirs()
        try:
            wd.check_writable()  # before the lock, which writes there
            stale = lock.stale_seconds(config.store.retry_seconds)
            with lock.held(wd.root, distributed.is_lead(), stale, wd.store), stop:
                return _run(config, plan, wd, stop)
        except BaseException as e:
            _failed(e, wd, created, stop)
            raise


def _resolve_pixels(config: ml_collections.ConfigDict) -> None:
    """dataset.preprocessing '' (unset): the pixels init_from's weights expect (a tower's
    mean, std, resize and crop: weights/meta.py), else the published checkpoints'."""
    if not config.dataset.preprocessing:
        told = read_meta(config.init_from).preprocessing if config.init_from else None
        with config.unlocked():
            config.dataset.preprocessing = told or "tf_bilinear"


def _failed(error: BaseException, wd: Workdir, created: list, stop: stopping.StopRequest) -> None:
    """A failed run leaves no directory it created empty (another run's workdir is not
    touched); a second Ctrl-C is raised as `stopping.Interrupted`, saying where it was."""
    if isinstance(error, lock.WorkdirLocked):
        return
    wd.remove_empty(created)
    if isinstance(error, KeyboardInterrupt) and not isinstance(error, stopping.Stopped):
        if not wd.store.exists(wd.checkpoints):  # the saver closed: its save in flight ended
            raise stopping.Interrupted(stopping.where_stopped(stop.step, None)) from error
        with Checkpoints(wd.checkpoints, read_only=True, via=wd.store) as saver:
            raise stopping.Interrupted(stopping.where_stopped(stop.step, saver)) from error


def _run(config: Any, plan: Plan, wd: Workdir, stop: stopping.StopRequest) -> dict[str, Any]:
    began = time.time()
    # Everything that runs beside the loop (the saver's and Orbax's threads, the event
    # writer's, the input pipeline's) ends with the run, however it ends.
    with contextlib.ExitStack() as running:
        loop, state = _start(config, plan, wd, stop, running)
        batches = data.train_iterator(
            config.dataset,
            global_batch=config.batch_size,
            image_size=config.image_size,
            seed=config.seed,
            start_step=stop.step,
            patch_size=loop.model.patch_size,
            batch_multiple=jax.device_count() * config.accum_steps,
        )
        state, metrics, evals = train_loop(loop, state, running.enter_context(batches))
        _stop_if_asked(loop, state, stopping.Agreement(loop.mesh))  # before evaluating, export
        if "accuracy" not in evals:  # resumed after the last step: evaluate it again
            evals.update(evaluate(loop, state.model_params))
        merged = outputs.merged_params(state, loop.model.lora)
        if config.export_npz:  # with the numerics, class names and resize it trained with
            names, resize = data.class_names(config.dataset), config.dataset.preprocessing
            meta = Meta.of_model(loop.model, names, resize)
            outputs.export_npz(wd.final_npz, merged, meta, loop.saver, wd.store)
        summary = _summary(config, state, merged, metrics, evals, time.time() - began)
        if loop.writer is not None:
            report.write_summary(wd.summary, summary, wd.store)
            npz = f"{wd.final_npz} (the published layout) and " if config.export_npz else ""
            report.say(f"step {summary['steps']}: wrote {npz}{wd.summary}")
    return summary


def _start(
    config: Any, plan: Plan, wd: Workdir, stop: stopping.StopRequest, running: contextlib.ExitStack
) -> tuple[Loop, TrainState]:
    """The loop's parts, and the state it starts from: the workdir's newest checkpoint that
    verifies, or a new one. What runs beside the loop is entered into `running`."""
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
    classes = data.num_classes(config.dataset)
    model = state_lib.build_model(
        config.model, classes, config.init_from or None, config.lora, config.image_size
    )
    tx, lr_fn = state_lib.optimizer_of(config)
    start = state_lib.Start.of(config)
    abstract = state_lib.abstract_state(start, model, tx)
    wd.check_free_space(plan, tree_bytes(abstract.saved()), 4 * count_params(abstract.model_params))
    saver = Checkpoints(wd.checkpoints, config.keep_checkpoints, plan.state, via=wd.store)
    running.enter_context(saver)
    scratch = config.get("from_scratch_if_damaged", False)
    state, shardings = state_lib.restore_or_create(start, model, tx, mesh, saver, scratch)
    stop.step = int(jax.device_get(state.step))
    train_step, eval_step = jit_steps(
        model, tx, lr_fn, mesh, shardings, config.accum_steps, config.loss
    )
    writer = None
    if distributed.is_lead():
        writer = running.enter_context(report.EventWriter(wd.root, saver.rerun_sentence, wd.store))
    fewshot = fewshot_lib.evaluator_of(config)
    return Loop(config, mesh, model, train_step, eval_step, saver, writer, fewshot, stop), state


def _summary(
    config: Any, state: TrainState, merged: Any, metrics: dict, evals: dict, seconds: float
) -> dict[str, Any]:
    """summary.json: what the run trained, how far, and what it reached."""
    return {
        "model": config.model.name,
        "steps": int(jax.device_get(state.step)),
        "num_params": count_params(merged),
        "trained_parameters": count_params(state.params),
        "accuracy": evals["accuracy"],
        "eval_loss": evals["loss"],
        "train_loss": metrics.get("loss"),
        "skipped_steps": int(jax.device_get(state_lib.skipped_steps(state.opt_state))),
        **{k: v for k, v in evals.items() if k.startswith(fewshot_lib.PREFIX)},
        "img_per_sec_per_device": metrics.get("img_per_sec_per_device"),
        "wall_seconds": seconds,
    }


def due(step: int, every: int, total: int) -> bool:
    """Whether an action of period `every` (0: never on a cadence) follows `step`: on its
    multiples, and always after the last step."""
    return step == total or (every > 0 and step % every == 0)


def train_loop(
    loop: Loop, state: TrainState, batches: Iterator[dict]
) -> tuple[TrainState, dict, dict]:
    """The steps from the state's own to config.total_steps: (state, metrics, evals);
    evals holds the last test accuracy and loss, and few-shot accuracies if any.
    `batches` yields this process's share of each step's batch from the state's step on."""
    config, mesh, total = loop.config, loop.mesh, loop.config.total_steps
    start = int(jax.device_get(state.step))
    skipped = int(jax.device_get(state_lib.skipped_steps(state.opt_state)))
    guard = stopping.FiniteGuard(loop.saver, config.skip_nonfinite, start, skipped)
    agree = stopping.Agreement(mesh)
    few_every = config.fewshot.every or config.eval_every
    _stop_if_asked(loop, state, agree)  # a signal during start-up
    speed = _starting(loop, state, getattr(batches, "lengths", None))
    metrics, evals, compiled_for = {}, {}, set()
    for step in range(start + 1, total + 1):
        batch = sharding.global_batch(agree.into(next(batches), loop.stop.requested), mesh)
        state, m = loop.train_step(state, batch)
        loop.stop.step = step
        log = due(step, config.log_every, total) or step == 1
        if (n := compiled.tokens_of(loop.model, batch["image"])) not in compiled_for:
            # compiled (once a length): neither the speed nor the ETA counts that step
            _compiled(loop, speed, step, (state, batch, m), said=log, first=not compiled_for)
            compiled_for.add(n)
        del batch
        # A stop (the signal every process agrees on, lagged) saves now, evaluates nothing.
        stopping_on = agree.lagged(loop.stop.requested, m)
        save = due(step, config.checkpoint_every, total) or bool(stopping_on)
        evaluating = due(step, config.eval_every, total) and not stopping_on
        few = loop.fewshot is not None and not stopping_on and due(step, few_every, total)
        if log or save:  # before any save: nothing non-finite is ever written
            metrics = {k: float(v) for k, v in jax.device_get(m).items() if k != "stop"}
            if log:  # timed here: the step is done, the checks below are not training
                metrics.update(speed.update(step))
            if save and not config.skip_nonfinite:  # skipped steps keep a finite state
                metrics["finite"] = min(metrics["finite"], float(verify.all_finite(state)))
            guard.check(metrics, step)
        if log:
            report.write(loop.writer, step, total, metrics)
        if evaluating:
            evals.update(evaluate(loop, state.model_params))
            report.write(loop.writer, step, total, metrics, evals)
        if few:
            evals.update(loop.fewshot.run(loop.model, state.model_params, mesh))
            report.write_fewshot(loop.writer, step, evals)
        if save:
            loop.saver.save(step, state.saved())
            report.say(f"step {step}: saving checkpoint {loop.saver.directory}/{step}")
        if evaluating or few or save:  # the throughput clock counts training steps
            speed.pause(step)
        if stopping_on:
            _stop(loop, step, stopping_on, saved=True)
    loop.saver.wait()
    return state, metrics, evals


def _starting(loop: Loop, state: TrainState, lengths: Any) -> report.Throughput:
    """Says what the run is about to do (with NaFlex, its lengths: `lengths`, and what
    attention pads each to on the mesh's devices); the throughput clock, started."""
    config, start = loop.config, int(jax.device_get(state.step))
    size = config.batch_size if lengths is None else lengths.batch_at  # NaFlex: by step
    if start < config.total_steps:
        name = config.model.name or report.architecture_of(config.init_from, loop.model)
        report.say(report.starting(name, state.params, state.frozen, config.total_steps - start))
        if lengths is not None:
            each = abstract.sequences(loop.model, loop.mesh, lengths.seq_lens).values()
            padded = [p for _, p, _ in each]
            report.say(report.naflex_line(lengths, padded, loop.model.num_prefix))
    return report.Throughput(config.total_steps, size, jax.device_count(), start)


def _compiled(
    loop: Loop, speed: report.Throughput, step: int, ran: tuple, said: bool, first: bool
) -> None:
    """After the first step of the run, or of a NaFlex length (`ran`: its state, batch and
    metrics): the time it took to compile and run (unless the step's log line says it), and
    after the first, what XLA made of it."""
    state, batch, metrics = ran
    jax.block_until_ready(metrics)
    took = speed.compiled(step)
    if isinstance(x := batch["image"], dict):
        rows, n = x["patches"].shape[:2]
        took = console.duration(took)
        report.say(f"step {step}: compiled for {n} patches a row ({rows} images) in {took}")
    elif not said:
        report.say(f"step {step}: compiled and ran in {console.duration(took)}")
    if not first:
        return
    looped = compiled.loop_of(loop.config)
    if line := compiled.compiled_line(loop.train_step, state, batch, looped, loop.model):
        report.say(line)


def _stop_if_asked(loop: Loop, state: TrainState, agree: stopping.Agreement) -> None:
    """Stops the run when a signal came outside the steps (start-up, the last step's
    evaluation); the step reached is saved already, if any."""
    if name := agree.now(loop.stop.requested):
        _stop(loop, int(jax.device_get(state.step)), name, saved=False)


def _stop(loop: Loop, step: int, signal_name: str, saved: bool) -> None:
    """Waits for the save of `step`, flushes the event file, raises `stopping.Stopped`."""
    loop.saver.wait()
    if loop.writer is not None:
        loop.writer.flush()
    saved = saved or step in loop.saver.steps()
    raise stopping.stopped(step, signal_name, f"{loop.saver.directory}/{step}" if saved else None)


def evaluate(loop: Loop, params: Any) -> dict[str, float]:
    """Accuracy and loss over the whole test split (each example exactly once)."""
    config, size = loop.config, loop.config.eval_batch_size
    split = config.dataset.test_split
    n = data.num_examples(config.dataset, split)
    batches = eval_batches(
        config.dataset, split, size, config.image_size, loop.model.patch_size, loop.mesh
    )
    show = distributed.is_lead() and config.progress_bars
    correct = loss = count = 0.0
    with batches:
        bar = console.bar(batches, -(-n // size), f"eval {split}", show)
        for out, _ in over_batches(loop.eval_step, params, bar, loop.mesh):
            correct += float(out["correct"].sum())
            loss += float(out["loss"].sum())
            count += len(out["loss"])
    count = max(count, 1.0)
    return {"accuracy": correct / count, "loss": loss / count}
