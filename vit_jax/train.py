"""One training loop for pretraining and fine-tuning.

They differ only in config: the optimizer (Adam / SGD), `init_from` ('' = from
scratch with the model's own initialisation, or a published .npz loaded with
`checkpoint.load_pretrained`: new zero head, position embeddings resized), the
resolution and the head.

The jit contract (see `compile_steps`):
  train_step(state, batch) -> (state, metrics)
    state    TrainState laid out by `sharding.tree_shardings`: replicated, or with
             each large parameter and its optimizer state split over 'fsdp'. Created
             in that layout (`create_state` jits the initialisation with
             out_shardings), so no device ever holds a whole unsharded copy. DONATED:
             the old state's buffers are reused.
    batch    {'image': f32[B, H, W, 3], 'label': f32[B, K]}, B split over all devices
             of the ('data', 'fsdp') mesh, each process feeding its own block.
    metrics  replicated scalars: loss, grad_norm, lr, finite (1 when the loss and the
             gradient norm are finite), skipped (steps skipped so far for non-finite
             values, with config.skip_nonfinite).
  eval_step(params, batch) -> replicated sums {'correct', 'loss', 'count'}; batch
    also carries 'mask' f32[B] (0 for padding).

A resumed run is bit-identical to an uninterrupted one: the state (step, dropout key,
skipped count) is all in the checkpoint, the input pipeline is a pure function of
(config, seed, step), and dropout keys are folded with the step.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from clu import metric_writers

from vit_jax import checkpoint, data, distributed, optim, progress, sharding
from vit_jax import workdir as workdir_lib
from vit_jax.evaluate import fewshot as fewshot_lib
from vit_jax.models import count_params, get_model
from vit_jax.models.vit import VisionTransformer


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # i32[]: completed steps
    params: Any
    opt_state: Any
    rng: jax.Array  # u32[2]: raw key data for dropout, folded with the step
    skipped: jax.Array  # i32[]: steps skipped for non-finite values (skip_nonfinite)


def build_model(config: Any, num_classes: int) -> VisionTransformer:
    """The model of `config.model`: a name plus any VisionTransformer field."""
    fields = {k: v for k, v in config.model.items() if k != "name" and v is not None}
    if fields.get("representation_size") == 0:
        del fields["representation_size"]
    return get_model(config.model.name, num_classes=num_classes, **fields)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example softmax cross-entropy with (soft) one-hot labels: [B, K] -> [B]."""
    return -jnp.sum(labels * jax.nn.log_softmax(logits.astype(jnp.float32)), axis=-1)


def loss_and_grads(
    model: VisionTransformer, params: Any, batch: dict, rng: jax.Array, accum_steps: int
) -> tuple[jax.Array, Any]:
    """Mean loss and gradients over the batch, in `accum_steps` micro-batches.

    Micro-batch i takes examples i, i+accum, i+2*accum, ... so that each one is
    spread over all devices and the split needs no communication.
    """

    def loss_fn(p, images, labels, key):
        logits = model.apply({"params": p}, images, train=True, rngs={"dropout": key})
        return cross_entropy(logits, labels).mean()

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


@jax.jit
def all_finite(tree: Any) -> jax.Array:
    """bool[]: whether every floating-point value of `tree` is finite."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def train_step(
    state: TrainState,
    batch: dict,
    *,
    model: VisionTransformer,
    tx: optax.GradientTransformation,
    lr_fn: optax.Schedule,
    accum_steps: int = 1,
    skip_nonfinite: bool = False,
) -> tuple[TrainState, dict]:
    """One optimizer step on one global batch.

    A finite gradient norm means every gradient is finite, and from finite gradients
    SGD and Adam make finite updates short of overflow, so the loss and the norm are
    all that is checked here: a pass over the whole new state would cost ~3% of a
    ViT-B/16 step on CPU. The loop checks the whole state before each save. With
    `skip_nonfinite`, a step whose loss or gradient norm is not finite keeps the old
    parameters and optimizer state (its own counts included) and is counted in
    `state.skipped`; the step counter, and with it the data, move on.
    """
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, grads = loss_and_grads(model, state.params, batch, rng, accum_steps)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    skipped = state.skipped
    if skip_nonfinite:
        new, old = (params, opt_state), (state.params, state.opt_state)
        params, opt_state = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        skipped = skipped + (~finite).astype(jnp.int32)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": lr_fn(state.step),
        "finite": finite.astype(jnp.float32),
        "skipped": skipped,
    }
    new_state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, skipped=skipped
    )
    return new_state, metrics


def eval_step(params: Any, batch: dict, *, model: VisionTransformer) -> dict[str, jax.Array]:
    """Sums of correct predictions, loss and real examples (padding masked out)."""
    logits = model.apply({"params": params}, batch["image"], train=False)
    mask = batch["mask"]
    correct = jnp.argmax(logits, -1) == jnp.argmax(batch["label"], -1)
    return {
        "correct": jnp.sum(correct * mask),
        "loss": jnp.sum(cross_entropy(logits, batch["label"]) * mask),
        "count": jnp.sum(mask),
    }


# ---------------------------------------------------------------- the state


def initial_params(config: Any, model: VisionTransformer, image_size: int) -> Any:
    """From scratch, or from a published .npz (`config.init_from`) for fine-tuning."""
    if config.init_from:
        return checkpoint.load_pretrained(
            config.init_from, model, image_size, reset_head=config.reset_head
        )
    x = jnp.zeros((1, image_size, image_size, model.channels), jnp.float32)
    return jax.jit(model.init)(jax.random.key(config.seed), x)["params"]


def new_state(
    config: Any, model: VisionTransformer, tx: optax.GradientTransformation, params: Any = None
) -> TrainState:
    """The TrainState at step 0 (traceable): `params`, or the model's initialisation."""
    if params is None:
        x = jnp.zeros((1, config.image_size, config.image_size, model.channels), jnp.float32)
        params = model.init(jax.random.key(config.seed), x)["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(jax.random.fold_in(jax.random.key(config.seed), 1)),
        skipped=jnp.zeros((), jnp.int32),
    )


def abstract_state(config: Any, model: VisionTransformer, tx: Any) -> TrainState:
    """The TrainState's shapes and dtypes (ShapeDtypeStructs; nothing allocated)."""
    return jax.eval_shape(functools.partial(new_state, config, model, tx))


def create_state(
    config: Any, model: VisionTransformer, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh
) -> tuple[TrainState, Any]:
    """A TrainState at step 0, created in its sharded layout, and its shardings."""
    shardings = sharding.tree_shardings(mesh, abstract_state(config, model, tx))
    make = jax.jit(functools.partial(new_state, config, model, tx), out_shardings=shardings)
    if not config.init_from:
        return make(), shardings
    params = initial_params(config, model, config.image_size)  # host arrays
    return make(sharding.put(params, shardings.params)), shardings


def restore_or_create(
    config: Any, model: VisionTransformer, tx: Any, mesh: Any, manager: ocp.CheckpointManager
) -> tuple[TrainState, Any]:
    """The latest complete checkpoint in the workdir if there is one, laid out for
    `mesh` (whatever mesh wrote it), else a new state."""
    latest = manager.latest_step()
    if latest is None:
        return create_state(config, model, tx, mesh)
    abstract = abstract_state(config, model, tx)
    shardings = sharding.tree_shardings(mesh, abstract)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    state = workdir_lib.restore(manager, latest, target)
    if distributed.is_lead():
        print(f"resuming from step {latest} (checkpoint {manager.directory}/{latest})", flush=True)
    return state, shardings


def compile_steps(
    model: VisionTransformer,
    tx: optax.GradientTransformation,
    lr_fn: Any,
    accum_steps: int,
    mesh: jax.sharding.Mesh,
    state_shardings: Any,
    skip_nonfinite: bool = False,
):
    """The jitted train and eval steps (the contract is in the module docstring)."""
    batch = sharding.batch_sharding(mesh)
    rep = sharding.replicated(mesh)
    step_fn = functools.partial(
        train_step,
        model=model,
        tx=tx,
        lr_fn=lr_fn,
        accum_steps=accum_steps,
        skip_nonfinite=skip_nonfinite,
    )
    step = jax.jit(
        step_fn,
        in_shardings=(state_shardings, batch),
        out_shardings=(state_shardings, rep),
        donate_argnums=0,
    )
    evaluate = jax.jit(
        functools.partial(eval_step, model=model),
        in_shardings=(state_shardings.params, batch),
        out_shardings=rep,
    )
    return step, evaluate


def export_npz(path: str, params: Any) -> None:
    """`params` (sharded, possibly over several processes) -> a published-layout .npz,
    written by process 0. Every process must call it (the arrays are gathered)."""
    host = distributed.to_host(params)
    if distributed.is_lead():
        checkpoint.save_npz(path, host)


# ---------------------------------------------------------------- the loop


def evaluate(eval_fn: Any, params: Any, config: Any, mesh: Any) -> dict[str, float]:
    """Accuracy and loss over the whole test split (each example exactly once)."""
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
    total = None
    show = distributed.is_lead() and config.progress_bars
    for local in progress.bar(batches, -(-n // config.eval_batch_size), f"eval {split}", show):
        sums = eval_fn(params, sharding.global_batch(local, mesh))
        total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    total = jax.device_get(total)
    count = max(float(total["count"]), 1.0)
    return {"accuracy": float(total["correct"]) / count, "loss": float(total["loss"]) / count}


def fewshot_evaluator(config: Any) -> Any:
    """The FewShotEvaluator of `config.fewshot`, or None when it names no dataset."""
    f = config.fewshot
    names = [n.strip() for n in f.datasets.split(",") if n.strip()]
    if not names:
        return None
    from vit_jax.fewshot import dataset_configs

    datasets = dataset_configs(
        names, f.source or None, f.data_dir or None, f.train_split, f.test_split
    )
    return fewshot_lib.FewShotEvaluator(
        datasets, f.shots, f.l2, f.seed, config.image_size, f.batch_size
    )


def run(config: Any, workdir: str) -> dict[str, Any]:
    """Train (pretrain or fine-tune) as `config` says, in `workdir`; resumes from its
    latest checkpoint. Returns the final metrics, also written to workdir/summary.json.

    Raises:
        OSError: the workdir is not writable or its disk too small (before training).
        FloatingPointError: a non-finite loss, gradient or state (see FiniteGuard).
    """
    workdir_lib.check_writable(workdir)
    start_time = time.time()
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
    _check_batches(config, mesh)
    model = build_model(config, data.num_classes(config.dataset))
    tx, lr_fn = optim.make_optimizer(config.optimizer, config.total_steps)
    abstract = abstract_state(config, model, tx)
    state_bytes, npz_bytes = workdir_lib.tree_bytes(abstract), 4 * count_params(abstract.params)
    workdir_lib.check_free_space(workdir, config, state_bytes, npz_bytes)
    manager = workdir_lib.open_manager(workdir, config.keep_checkpoints)
    state, shardings = restore_or_create(config, model, tx, mesh, manager)
    steps = compile_steps(
        model, tx, lr_fn, config.accum_steps, mesh, shardings, config.skip_nonfinite
    )
    writer = metric_writers.SummaryWriter(workdir) if distributed.is_lead() else None
    fewshot = fewshot_evaluator(config)
    state, metrics, evals = _train(config, mesh, state, steps, manager, writer, model, fewshot)
    if "accuracy" not in evals:  # resumed after the last step: evaluate the final state again
        evals.update(evaluate(steps[1], state.params, config, mesh))
    if config.export_npz:
        export_npz(os.path.join(workdir, "final.npz"), state.params)
    summary = {
        "model": config.model.name,
        "steps": int(jax.device_get(state.step)),
        "num_params": count_params(state.params),
        "accuracy": evals["accuracy"],
        "eval_loss": evals["loss"],
        "train_loss": metrics.get("loss"),
        "skipped_steps": int(jax.device_get(state.skipped)),
        **{k: v for k, v in evals.items() if k.startswith(fewshot_lib.PREFIX)},
        "img_per_sec_per_device": metrics.get("img_per_sec_per_device"),
        "wall_seconds": time.time() - start_time,
    }
    if writer is not None:
        writer.flush()
        progress.write_summary(workdir, summary)
    return summary


def _train(
    config, mesh, state, steps, manager, writer, model, fewshot
) -> tuple[TrainState, dict, dict]:
    """The steps from the state's own to config.total_steps: (state, metrics, evals);
    evals holds the last test accuracy and loss, and few-shot accuracies if any."""
    train_fn, eval_fn = steps
    start, lead = int(jax.device_get(state.step)), distributed.is_lead()
    batches = data.train_iterator(
        config.dataset,
        global_batch=config.batch_size,
        image_size=config.image_size,
        seed=config.seed,
        start_step=start,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    cadence = progress.Cadence(
        config.total_steps,
        config.log_every,
        config.eval_every,
        config.checkpoint_every,
        config.fewshot.every or config.eval_every,
    )
    speed = progress.Throughput(config.total_steps, config.batch_size, jax.device_count(), start)
    guard = workdir_lib.FiniteGuard(
        manager, config.skip_nonfinite, start, int(jax.device_get(state.skipped))
    )
    metrics, evals = {}, {}
    if lead and start < config.total_steps:
        print(
            f"training {config.model.name} ({count_params(state.params):,} parameters) for "
            f"{config.total_steps - start} steps; compiling the first step...",
            flush=True,
        )
    for step in range(start + 1, config.total_steps + 1):
        state, m = train_fn(state, sharding.global_batch(next(batches), mesh))
        log, ev, save = (cadence.due(what, step) for what in ("log", "eval", "save"))
        few = fewshot is not None and cadence.due("fewshot", step)
        if log or save:  # before any save: nothing non-finite is ever written
            metrics = {k: float(v) for k, v in jax.device_get(m).items()}
            if save and not config.skip_nonfinite:  # skipped steps keep a finite state
                metrics["finite"] = min(metrics["finite"], float(all_finite(state)))
            guard.check(metrics, step)
        if log:
            metrics.update(speed.update(step))
            _write(writer, step, config.total_steps, metrics)
        if ev:
            evals.update(evaluate(eval_fn, state.params, config, mesh))
            _write(writer, step, config.total_steps, metrics, evals)
        if few:
            evals.update(fewshot.run(model, state.params, mesh))
            _write_fewshot(writer, step, evals)
        if save:
            manager.save(step, args=ocp.args.StandardSave(state))
            if lead:
                print(f"step {step}: saving checkpoint {manager.directory}/{step}", flush=True)
        if ev or few or save:  # the throughput clock counts training steps only
            speed.pause(step)
    manager.wait_until_finished()
    return state, metrics, evals


def _write(writer: Any, step: int, total: int, metrics: dict, evals: dict | None = None) -> None:
    """The console line and TensorBoard scalars of a log step, or of an evaluation."""
    if writer is None:
        return
    if evals is None:
        print(progress.console_line(step, total, metrics), flush=True)
        writer.write_scalars(step, {k: v for k, v in metrics.items() if k != "eta_seconds"})
    else:
        accuracy, loss = evals["accuracy"], evals["loss"]
        print(f"step {step}: test accuracy {accuracy:.4f}, loss {loss:.4f}", flush=True)
        writer.write_scalars(step, {"eval/accuracy": accuracy, "eval/loss": loss})


def _write_fewshot(writer: Any, step: int, evals: dict) -> None:
    """'step 400: few-shot fashion_mnist 1/5/10/25-shot 41.2/63.0/70.1/76.5%'."""
    if writer is None:
        return
    for name, row in fewshot_lib.by_dataset(evals).items():
        shots, accs = "/".join(map(str, row)), "/".join(f"{100 * a:.1f}" for a in row.values())
        print(f"step {step}: few-shot {name} {shots}-shot {accs}%", flush=True)
    writer.write_scalars(step, {k: v for k, v in evals.items() if k.startswith(fewshot_lib.PREFIX)})


def _check_batches(config: Any, mesh: Any) -> None:
    n = mesh.devices.size
    batches = [("batch_size", config.batch_size), ("eval_batch_size", config.eval_batch_size)]
    if config.fewshot.datasets:
        batches.append(("fewshot.batch_size", config.fewshot.batch_size))
    for name, b in batches:
        if b % n:
            raise ValueError(f"config.{name}={b} is not divisible by the {n} devices")
    if config.batch_size % (config.accum_steps * n):
        raise ValueError(
            f"config.batch_size={config.batch_size} must split into "
            f"accum_steps={config.accum_steps} micro-batches over {n} devices"
        )
