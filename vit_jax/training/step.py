"""The jitted train and eval steps, and the losses they compute.

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
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from vit_jax.models import lora, predict
from vit_jax.parallel import sharding
from vit_jax.training.state import TrainState, skipped_steps


def softmax_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example softmax cross-entropy with (soft) one-hot labels, in float32: [B, K] -> [B]."""
    return optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)


def sigmoid_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example sum over classes of K independent binary cross-entropies (big_vision's
    'sigmoid_xent'; set model.head_bias_init to about -log(K) with it), in float32."""
    return optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), labels).sum(-1)


LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}  # config.loss: [B, K] -> [B]


def loss_and_grads(model, state: TrainState, batch: dict, accum_steps: int, loss_name: str):
    """(mean loss, gradients of `state.params`, not of `state.frozen`: LoRA's base) over the
    batch, in `accum_steps` micro-batches: micro-batch i takes examples i, i + accum, ...,
    so each is spread over all devices. Dropout's key is the state's, folded with its step."""
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    params = state.params

    def loss_fn(p, images, labels, key):
        p = lora.overlay(state.frozen, p)  # [the adapters and head, over the base]
        logits = model.apply({"params": p}, images, train=True, rngs={"dropout": key})
        return LOSSES[loss_name](logits, labels).mean()

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
    tx,
    lr_fn,
    accum_steps: int = 1,
    loss_name: str = "softmax_xent",
) -> tuple[TrainState, dict]:
    """One optimizer step on one global batch. A finite gradient norm means every
    gradient is finite, and from finite gradients SGD and Adam make finite updates short
    of overflow, so only the loss and the norm are checked here (a pass over the new
    state costs ~3% of a step); the loop checks the whole state before each save."""
    loss, grads = loss_and_grads(model, state, batch, accum_steps, loss_name)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": lr_fn(state.step),
        "finite": (jnp.isfinite(loss) & jnp.isfinite(grad_norm)).astype(jnp.float32),
        "skipped": skipped_steps(opt_state),
    }
    if "stop" in batch:  # the processes' signals, reduced with the step's own work
        metrics["stop"] = jnp.max(batch["stop"])
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: dict, *, model, loss_name: str = "softmax_xent") -> dict:
    """Each example's correct prediction (1 or 0) and loss (the training loss): [B] each."""
    logits = predict.logits(model, params, batch["image"])  # [B, K]
    correct = jnp.argmax(logits, -1) == jnp.argmax(batch["label"], -1)
    loss = LOSSES[loss_name](logits, batch["label"])
    return {"correct": correct.astype(jnp.float32), "loss": loss}


def jit_steps(
    model, tx, lr_fn, mesh, state_shardings, accum_steps: int = 1, loss_name: str = "softmax_xent"
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
