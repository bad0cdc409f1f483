"""One training loop for pretraining and fine-tuning.

They differ only in config: the optimizer (Adam / SGD), `init_from` ('' = from
scratch with the model's own initialisation, or a published .npz loaded with
`checkpoint.load_pretrained`: new zero head, position embeddings resized), the
resolution and the head.

The jit contract (see `compile_steps`):
  train_step(state, batch) -> (state, metrics)
    state    TrainState laid out by `sharding.tree_shardings` (replicated, or split
             over 'fsdp'); DONATED: the old state's buffers are reused.
    batch    {'image': f32[B, H, W, 3], 'label': f32[B, K]}, B split over all devices.
    metrics  replicated scalars: loss, grad_norm, lr.
  eval_step(params, batch) -> replicated sums {'correct', 'loss', 'count'}; batch
    also carries 'mask' f32[B] (0 for padding).
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from clu import metric_writers

from vit_jax import checkpoint, data, optim, progress, sharding
from vit_jax.models import count_params, get_model
from vit_jax.models.vit import VisionTransformer


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # i32[]: completed steps
    params: Any
    opt_state: Any
    rng: jax.Array  # u32[2]: raw key data for dropout, folded with the step


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


def train_step(
    state: TrainState,
    batch: dict,
    *,
    model: VisionTransformer,
    tx: optax.GradientTransformation,
    lr_fn: optax.Schedule,
    accum_steps: int = 1,
) -> tuple[TrainState, dict]:
    """One optimizer step on one global batch."""
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, grads = loss_and_grads(model, state.params, batch, rng, accum_steps)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": lr_fn(state.step)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


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


def initial_params(config: Any, model: VisionTransformer, image_size: int) -> Any:
    """From scratch, or from a published .npz (`config.init_from`) for fine-tuning."""
    if config.init_from:
        return checkpoint.load_pretrained(
            config.init_from, model, image_size, reset_head=config.reset_head
        )
    x = jnp.zeros((1, image_size, image_size, model.channels), jnp.float32)
    return jax.jit(model.init)(jax.random.key(config.seed), x)["params"]


def create_state(
    config: Any, model: VisionTransformer, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh
) -> tuple[TrainState, Any]:
    """A sharded TrainState at step 0, and its shardings."""
    params = initial_params(config, model, config.image_size)

    def make(params):
        rng = jax.random.key_data(jax.random.fold_in(jax.random.key(config.seed), 1))
        return TrainState(
            step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=rng
        )

    abstract = jax.eval_shape(make, params)
    shardings = sharding.tree_shardings(mesh, abstract)
    params = jax.device_put(params, shardings.params)
    state = jax.jit(make, out_shardings=shardings)(params)
    return state, shardings


def compile_steps(
    model: VisionTransformer,
    tx: optax.GradientTransformation,
    lr_fn: Any,
    accum_steps: int,
    mesh: jax.sharding.Mesh,
    state_shardings: Any,
):
    """The jitted train and eval steps (the contract is in the module docstring)."""
    batch = sharding.batch_sharding(mesh)
    rep = sharding.replicated(mesh)
    step = jax.jit(
        functools.partial(train_step, model=model, tx=tx, lr_fn=lr_fn, accum_steps=accum_steps),
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


# ---------------------------------------------------------------- the loop


def check_workdir(workdir: str) -> None:
    """Fail before training, not after hours, when the workdir cannot be written."""
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, ".write_probe")
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
        os.remove(probe)
    except OSError as e:
        raise OSError(
            f"workdir {workdir} is not writable ({e.strerror}): choose another "
            "--workdir or free space there"
        ) from e


def restore_or_create(
    config: Any, model: VisionTransformer, tx: Any, mesh: Any, manager: ocp.CheckpointManager
) -> tuple[TrainState, Any]:
    """The latest complete checkpoint in the workdir if there is one, else a new state."""
    latest = manager.latest_step()
    if latest is None:
        return create_state(config, model, tx, mesh)
    x = jax.ShapeDtypeStruct((1, config.image_size, config.image_size, model.channels), jnp.float32)

    def make(x):
        params = model.init(jax.random.key(0), x)["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            rng=jax.random.key_data(jax.random.key(0)),
        )

    abstract = jax.eval_shape(make, x)
    shardings = sharding.tree_shardings(mesh, abstract)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    state = manager.restore(latest, args=ocp.args.StandardRestore(target))
    print(f"resuming from step {latest} (checkpoint in {manager.directory})", flush=True)
    return state, shardings


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
    show = jax.process_index() == 0 and config.progress_bars
    for local in progress.bar(batches, -(-n // config.eval_batch_size), f"eval {split}", show):
        sums = eval_fn(params, sharding.global_batch(local, mesh))
        total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    total = jax.device_get(total)
    count = max(float(total["count"]), 1.0)
    return {"accuracy": float(total["correct"]) / count, "loss": float(total["loss"]) / count}


def run(config: Any, workdir: str) -> dict[str, Any]:
    """Train (pretrain or fine-tune) as `config` says, in `workdir`; resumes from its
    latest checkpoint. Returns the final metrics, also written to workdir/summary.json."""
    check_workdir(workdir)
    start_time = time.time()
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp)
    _check_batches(config, mesh)
    model = build_model(config, data.num_classes(config.dataset))
    tx, lr_fn = optim.make_optimizer(config.optimizer, config.total_steps)
    manager = ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), "checkpoints"),
        options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True),
    )
    state, shardings = restore_or_create(config, model, tx, mesh, manager)
    train_fn, eval_fn = compile_steps(model, tx, lr_fn, config.accum_steps, mesh, shardings)
    start = int(jax.device_get(state.step))
    batches = data.train_iterator(
        config.dataset,
        global_batch=config.batch_size,
        image_size=config.image_size,
        seed=config.seed,
        start_step=start,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    lead = jax.process_index() == 0
    writer = metric_writers.SummaryWriter(workdir) if lead else None
    cadence = progress.Cadence(
        config.total_steps, config.log_every, config.eval_every, config.checkpoint_every
    )
    speed = progress.Throughput(config.total_steps, config.batch_size, jax.device_count(), start)
    metrics, evals = {}, {}
    if lead and start < config.total_steps:
        print(
            f"training {config.model.name} ({count_params(state.params):,} parameters) for "
            f"{config.total_steps - start} steps; compiling the first step...",
            flush=True,
        )
    for step in range(start + 1, config.total_steps + 1):
        state, m = train_fn(state, sharding.global_batch(next(batches), mesh))
        if cadence.due("log", step) or cadence.due("save", step):
            metrics = {k: float(v) for k, v in jax.device_get(m).items()}
            _check_finite(metrics, step, manager)
        if cadence.due("log", step):
            metrics.update(speed.update(step))
            if lead:
                print(progress.console_line(step, config.total_steps, metrics), flush=True)
                writer.write_scalars(step, {k: v for k, v in metrics.items() if k != "eta_seconds"})
        if cadence.due("eval", step):
            evals = evaluate(eval_fn, state.params, config, mesh)
            if lead:
                print(
                    f"step {step}: test accuracy {evals['accuracy']:.4f}, loss {evals['loss']:.4f}",
                    flush=True,
                )
                writer.write_scalars(step, {f"eval/{k}": v for k, v in evals.items()})
        if cadence.due("save", step):
            manager.save(step, args=ocp.args.StandardSave(state))
        if cadence.due("eval", step) or cadence.due("save", step):
            speed.pause(step)
    manager.wait_until_finished()
    if not evals:  # resumed after the last step: evaluate the final state again
        evals = evaluate(eval_fn, state.params, config, mesh)
    if lead and config.export_npz:
        checkpoint.save_npz(os.path.join(workdir, "final.npz"), jax.device_get(state.params))
    summary = {
        "model": config.model.name,
        "steps": int(jax.device_get(state.step)),
        "num_params": count_params(state.params),
        "accuracy": evals["accuracy"],
        "eval_loss": evals["loss"],
        "train_loss": metrics.get("loss"),
        "img_per_sec_per_device": metrics.get("img_per_sec_per_device"),
        "wall_seconds": time.time() - start_time,
    }
    if lead:
        writer.flush()
        progress.write_summary(workdir, summary)
    return summary


def _check_batches(config: Any, mesh: Any) -> None:
    n = mesh.devices.size
    for name, b in (("batch_size", config.batch_size), ("eval_batch_size", config.eval_batch_size)):
        if b % n:
            raise ValueError(f"config.{name}={b} is not divisible by the {n} devices")
    if config.batch_size % (config.accum_steps * n):
        raise ValueError(
            f"config.batch_size={config.batch_size} must split into "
            f"accum_steps={config.accum_steps} micro-batches over {n} devices"
        )


def _check_finite(metrics: dict[str, float], step: int, manager: Any) -> None:
    """Stop on a non-finite loss or gradient, before anything is saved over good state."""
    if all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm")):
        return
    good = manager.latest_step()
    raise FloatingPointError(
        f"non-finite loss {metrics['loss']} / gradient norm {metrics['grad_norm']} at step "
        f"{step}; nothing was saved. The last good checkpoint is "
        + (f"step {good} in {manager.directory}" if good is not None else "none (no save yet)")
        + ": lower the learning rate or enable gradient clipping, and restart."
    )
