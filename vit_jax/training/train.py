"""One training loop for pretraining and fine-tuning, and the jitted step it runs.

They differ only in config: the optimizer (Adam / SGD), `init_from` ('' = from scratch,
or a checkpoint of any format), the resolution and the head. Read top to bottom: the
step; then `run` builds the model, optimizer and state (state.py), jits the steps and runs
`train_loop`: a batch, `train_step`, then what is due (log, evaluate, few-shot, save, stop).

The jit contract (`jit_steps`):
  train_step(state, batch) -> (state, metrics)
    state    TrainState laid out by `sharding.tree_shardings`: replicated, or each large
             parameter and its optimizer state split over 'fsdp'; created in that layout
             (state.create_state). DONATED: the old state's buffers are reused.
    batch    {'image': f32[B, H, W, 3], 'label': f32[B, K]}, B split over all devices of
             the ('data', 'fsdp') mesh, each process feeding its own block; with several
             processes also 'stop' i32[B], each process's signal (stopping.Agreement).
    metrics  replicated scalars: loss, grad_norm, lr, finite (1 when the loss and the
             gradient norm are finite), skipped (steps skipped for non-finite gradients,
             with config.skip_nonfinite); 'stop', the batch's largest signal, where it has one.
  eval_step(params, batch) -> per-example f32[B] {'correct', 'loss'}, split as the batch.
    `evaluation.batched.over_batches` runs it one batch in flight at a time: independent
    steps with collectives, several in flight, can deadlock XLA's CPU collectives.

A resumed run is bit-identical to an uninterrupted one: the state (step, dropout key,
optimizer state with its skipped count) is all in the checkpoint, the input pipeline is
a pure function of (config, seed, step), and dropout keys are folded with the step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import data
from vit_jax.base import console
from vit_jax.base.outage import OUTAGE, transient
from vit_jax.evaluation import fewshot as fewshot_lib
from vit_jax.evaluation.batched import over_batches
from vit_jax.models import count_params, lora, predict
from vit_jax.parallel import distributed, sharding
from vit_jax.training import check, report, stopping
from vit_jax.training import state as state_lib
from vit_jax.training.state import TrainState
from vit_jax.weights.meta import Meta
from vit_jax.workdir import lock, verify
from vit_jax.workdir.checkpoints import Checkpoints
from vit_jax.workdir.workdir import Plan, Workdir, tree_bytes


def loss_and_grads(
    model,
    params,
    batch: dict,
    rng: jax.Array,
    accum_steps: int,
    loss_name: str = "softmax_xent",
    frozen: Any = None,
):
    """(mean loss, gradients of `params`, not of `frozen`: LoRA's base) over the batch, in
    `accum_steps` micro-batches: micro-batch i takes examples i, i + accum, ..., so each is
    spread over all devices."""

    def loss_fn(p, images, labels, key):
        p = lora.overlay(frozen, p)  # [the adapters and head, over the base]
        logits = model.apply({"params": p}, images, train=True, rngs={"dropout": key})
        return state_lib.LOSSES[loss_name](logits, labels).mean()

    grad_fn = jax.value_and_grad(loss_fn)
    if accum_steps == 1:
        return grad_fn(params, batch["image"], batch["label"], rng)
    micro = jax.tree.map(  # [B, ...] -> [accum, B/accum, ...]
        lambda x: jnp.swapaxes(x.reshape(-1, accum_steps, *x.shape[1:]), 0, 1), batch
    )

    def body(carry, xs):
        i, mb = xs
        loss, grads = grad_fn(params, mb["image"], mb["label"], jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, carry, (loss, grads)), None

    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (loss, grads), _ = jax.lax.scan(body, zeros, (jnp.arange(accum_steps), micro))
    return jax.tree.map(lambda x: x / accum_steps, (loss, grads))


def train_step(
    state: TrainState,
    batch: dict,
    *,
    model,
    tx: optax.GradientTransformation,
    lr_fn: optax.Schedule,
    accum_steps: int = 1,
    loss_name: str = "softmax_xent",
) -> tuple[TrainState, dict]:
    """One optimizer step on one global batch. A finite gradient norm means every
    gradient is finite, and from finite gradients SGD and Adam make finite updates short
    of overflow, so only the loss and the norm are checked here (a pass over the new
    state costs ~3% of a step); the loop checks the whole state before each save."""
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, grads = loss_and_grads(
        model, state.params, batch, rng, accum_steps, loss_name, state.frozen
    )
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": lr_fn(state.step),
        "finite": (jnp.isfinite(loss) & jnp.isfinite(grad_norm)).astype(jnp.float32),
        "skipped": state_lib.skipped_steps(opt_state),
    }
    if "stop" in batch:  # the processes' signals, reduced with the step's own work
        metrics["stop"] = jnp.max(batch["stop"])
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: dict, *, model, loss_name: str = "softmax_xent") -> dict:
    """Each example's correct prediction (1 or 0) and loss (the training loss): [B] each."""
    logits = predict.logits(model, params, batch["image"])  # [B, K]
    correct = jnp.argmax(logits, -1) == jnp.argmax(batch["label"], -1)
    loss = state_lib.LOSSES[loss_name](logits, batch["label"])
    return {"correct": correct.astype(jnp.float32), "loss": loss}


def jit_steps(
    model,
    tx,
    lr_fn,
    mesh: jax.sharding.Mesh,
    state_shardings: Any,
    accum_steps: int = 1,
    loss_name: str = "softmax_xent",
):
    """The jitted train and eval steps (the contract is above): what the loop runs and the
    planner compiles for a TPU topology (`config.accum_steps`, `config.loss`)."""
    batch, rep = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    step = functools.partial(
        train_step, model=model, tx=tx, lr_fn=lr_fn, accum_steps=accum_steps, loss_name=loss_name
    )
    step = jax.jit(
        sharding.on_mesh(mesh, step),
        in_shardings=(state_shardings, batch),
        out_shardings=(state_shardings, rep),
        donate_argnums=0,
    )
    evaluate = functools.partial(eval_step, model=model, loss_name=loss_name)
    params = state_shardings.model_params
    evaluate = jax.jit(
        sharding.on_mesh(mesh, evaluate), in_shardings=(params, batch), out_shardings=batch
    )
    return step, evaluate


@dataclasses.dataclass
class Loop:
    """What the loop works with, filled in by `run` as it builds them."""

    config: ml_collections.ConfigDict
    mesh: Any = None
    model: Any = None
    train_step: Any = None
    eval_step: Any = None
    saver: Checkpoints | None = None  # saves with their integrity records
    writer: report.EventWriter | None = None  # TensorBoard scalars, on the lead process
    fewshot: fewshot_lib.FewShotEvaluator | None = None
    stop: stopping.StopRequest = dataclasses.field(default_factory=stopping.StopRequest)
    step: int | None = None  # the last step done (for the message of an interrupted run)


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> dict[str, Any]:
    """Train as `config` says in `workdir` (a path or a gs:// / s3:// URL), resuming from
    its newest intact checkpoint; returns the final metrics, also in summary.json. A
    workdir this config finished is left as it is; a run that fails before it wrote
    anything removes the directories it created. The lead process holds the workdir's
    lock. SIGTERM or Ctrl-C saves the step reached and raises `stopping.Stopped`; a
    second Ctrl-C raises `stopping.Interrupted`.

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
    wd, plan, window = Workdir.at(workdir), Plan.of(config), config.store.retry_seconds
    with OUTAGE.watching(wd.root, window):  # a store that stops answering: base/outage.py
        if (done := OUTAGE.call(lambda: wd.finished(plan), str(wd.summary))) is not None:
            report.say(report.finished_lines(wd, done))
            return done
        created, loop = OUTAGE.call(wd.missing_dirs, str(wd.root)), Loop(config)
        try:
            OUTAGE.call(wd.check_writable, str(wd.root))  # before the lock, which writes there
            stale = lock.stale_seconds(window)
            with lock.held(wd.root, distributed.is_lead(), stale), loop.stop:
                return _run(loop, plan, wd)
        except lock.WorkdirLocked:
            raise  # another run's workdir: touch nothing
        except BaseException as e:
            if OUTAGE.since is not None and transient(e):  # mid-outage, outside OUTAGE.call
                OUTAGE.stop(
                    f"the store at {wd.root} did not answer: {OUTAGE.cause or e}. Once "
                    "it answers, run the same command (exit status 75)"
                )
            wd.remove_empty(created)  # only what this run created, and only if empty
            if isinstance(e, KeyboardInterrupt) and not isinstance(e, stopping.Stopped):
                saver = loop.saver or (
                    Checkpoints(wd.checkpoints, read_only=True) if wd.checkpoints.exists() else None
                )
                raise stopping.Interrupted(stopping.where_stopped(loop.step, saver)) from e
            raise


def _run(loop: Loop, plan: Plan, wd: Workdir) -> dict[str, Any]:
    config, began = loop.config, time.time()
    loop.mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
    loop.model = state_lib.build_model(
        config.model, data.num_classes(config.dataset), config.init_from or None, config.lora
    )
    tx, lr_fn = state_lib.optimizer_of(config)
    start = state_lib.Start.of(config)
    abstract = state_lib.abstract_state(start, loop.model, tx)
    wd.check_free_space(plan, tree_bytes(abstract.saved()), 4 * count_params(abstract.model_params))
    # Everything that runs beside the loop (the saver's and Orbax's threads, the event
    # writer's, the input pipeline's) ends with the run, however it ends.
    with contextlib.ExitStack() as running:
        loop.saver = running.enter_context(
            OUTAGE.call(
                lambda: Checkpoints(wd.checkpoints, config.keep_checkpoints, plan.state),
                f"opening {wd.checkpoints}",
            )
        )
        scratch = config.get("from_scratch_if_damaged", False)
        state, shardings = OUTAGE.call(
            lambda: state_lib.restore_or_create(
                start, loop.model, tx, loop.mesh, loop.saver, scratch
            ),
            "restoring",
        )
        loop.step = int(jax.device_get(state.step))
        loop.train_step, loop.eval_step = jit_steps(
            loop.model, tx, lr_fn, loop.mesh, shardings, config.accum_steps, config.loss
        )
        if distributed.is_lead():
            writer = report.EventWriter(wd.root, loop.saver.rerun_sentence)
            loop.writer = running.enter_context(writer)
        loop.fewshot = fewshot_lib.evaluator_of(config)
        batches = running.enter_context(
            data.train_iterator(
                config.dataset,
                global_batch=config.batch_size,
                image_size=config.image_size,
                seed=config.seed,
                start_step=loop.step,
            )
        )
        state, metrics, evals = train_loop(loop, state, batches)
        _stop_if_asked(loop, state, stopping.Agreement(loop.mesh))  # before evaluating, export
        if "accuracy" not in evals:  # resumed after the last step: evaluate it again
            evals.update(evaluate(loop, state.model_params))
        merged = state_lib.merged_params(state, loop.model.lora)
        if config.export_npz:  # with the numerics, class names and resize it trained with
            meta = Meta.of_model(
                loop.model, data.class_names(config.dataset), config.dataset.preprocessing
            )
            state_lib.export_npz(wd.final_npz, merged, meta, loop.saver)
        summary = {
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
            "wall_seconds": time.time() - began,
        }
        if loop.writer is not None:
            report.write_summary(wd.summary, summary)
    return summary


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
    speed = report.Throughput(total, config.batch_size, jax.device_count(), start)
    skipped = int(jax.device_get(state_lib.skipped_steps(state.opt_state)))
    guard = stopping.FiniteGuard(loop.saver, config.skip_nonfinite, start, skipped)
    agree = stopping.Agreement(mesh)
    _stop_if_asked(loop, state, agree)  # a signal during start-up
    if start < total:
        report.say(report.starting(config.model.name, state.params, state.frozen, total - start))
    metrics, evals = {}, {}
    for step in range(start + 1, total + 1):
        batch = sharding.global_batch(agree.into(next(batches), loop.stop.requested), mesh)
        state, m = loop.train_step(state, batch)
        loop.step = step
        log = due(step, config.log_every, total) or step == 1
        if step == start + 1:  # compiled: neither the speed nor the ETA counts that step
            jax.block_until_ready(m)
            took = speed.compiled(step)
            if not log:
                report.say(f"step {step}: compiled and ran in {console.duration(took)}")
            looped = report.loop_of(config)
            if line := report.compiled_line(loop.train_step, state, batch, looped, loop.model):
                report.say(line)
        del batch
        # A stop (the signal every process agrees on, lagged) saves now, evaluates nothing.
        stopping_on = agree.lagged(loop.stop.requested, m)
        save = due(step, config.checkpoint_every, total) or bool(stopping_on)
        evaluating = due(step, config.eval_every, total) and not stopping_on
        few = (
            loop.fewshot is not None
            and not stopping_on
            and due(step, config.fewshot.every or config.eval_every, total)
        )
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
    checkpoint = f"{loop.saver.directory}/{step}"
    if not saved and step not in loop.saver.steps():
        checkpoint = None
    raise stopping.stopped(step, signal_name, checkpoint)


def evaluate(loop: Loop, params: Any) -> dict[str, float]:
    """Accuracy and loss over the whole test split (each example exactly once)."""
    config = loop.config
    split = config.dataset.test_split
    n = data.num_examples(config.dataset, split)
    batches = data.eval_iterator(
        config.dataset, split, global_batch=config.eval_batch_size, image_size=config.image_size
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
    return {"accuracy": correct / count, "loss": loss / count}
