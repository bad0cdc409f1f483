"""The jitted training and evaluation steps, and their contract. No TensorFlow.

The jit contract (built by `compile_steps`):
  train_step(state, batch) -> (state, metrics)
    state    TrainState laid out by `sharding.tree_shardings`: replicated, or with
             each large parameter and its optimizer state split over 'fsdp'. Created
             in that layout (`create_state` jits the initialisation with
             out_shardings), so no device ever holds a whole unsharded copy. DONATED:
             the old state's buffers are reused.
    batch    {'image': f32[B, H, W, 3], 'label': f32[B, K]}, B split over all devices
             of the ('data', 'fsdp') mesh, each process feeding its own block; with
             several processes also 'stop' i32[B], each process's signal number
             (`preemption.Agreement`).
    metrics  replicated scalars: loss, grad_norm, lr, finite (1 when the loss and the
             gradient norm are finite), skipped (steps skipped so far for non-finite
             gradients, with config.skip_nonfinite: counted in the optimizer state);
             'stop', the largest signal number of the batch, where it has one.
  eval_step(params, batch) -> per-example f32[B] {'correct', 'loss'} (the training
    loss), split as the batch. The loop runs it with `evaluation.batched.over_batches`,
    which drops the padding and fetches each batch's outputs before it sends the next:
    independent steps with collectives, several in flight at once, can deadlock XLA's
    CPU collectives (some devices enter one step's collective, the others another's; XLA
    aborts the process after 40 s: seen with 8 emulated CPU devices on a loaded 2-core
    machine).

A resumed run is bit-identical to an uninterrupted one: the state (step, dropout key,
optimizer state with its skipped count) is all in the checkpoint, the input pipeline is
a pure function of (config, seed, step), and dropout keys are folded with the step.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from vit_jax.models import predict
from vit_jax.models.vit import VisionTransformer
from vit_jax.parallel import sharding
from vit_jax.training import optim
from vit_jax.training.state import TrainState


def softmax_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example softmax cross-entropy with (soft) one-hot labels, in float32: [B, K] -> [B]."""
    return optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)


def sigmoid_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example sum over classes of K independent binary cross-entropies (each class
    its own logistic regression; big_vision's 'sigmoid_xent'), in float32: [B, K] -> [B]."""
    z = logits.astype(jnp.float32)
    return -jnp.sum(labels * jax.nn.log_sigmoid(z) + (1 - labels) * jax.nn.log_sigmoid(-z), -1)


# config.loss -> per-example loss. Accuracy is the argmax either way; with sigmoid_xent
# the head's bias starts at about -log(K) (model.head_bias_init) so that the initial
# probabilities are ~1/K rather than 1/2 for each of K classes.
LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}


def loss_and_grads(
    model: VisionTransformer,
    params: Any,
    batch: dict,
    rng: jax.Array,
    accum_steps: int,
    loss_name: str = "softmax_xent",
) -> tuple[jax.Array, Any]:
    """Mean loss and gradients over the batch, in `accum_steps` micro-batches.

    Micro-batch i takes examples i, i+accum, i+2*accum, ... so that each one is
    spread over all devices and the split needs no communication.
    """

    per_example = LOSSES[loss_name]

    def loss_fn(p, images, labels, key):
        logits = model.apply({"params": p}, images, train=True, rngs={"dropout": key})
        return per_example(logits, labels).mean()

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
    loss_name: str = "softmax_xent",
) -> tuple[TrainState, dict]:
    """One optimizer step on one global batch.

    A finite gradient norm means every gradient is finite, and from finite gradients
    SGD and Adam make finite updates short of overflow, so the loss and the norm are
    all that is checked here: a pass over the whole new state would cost ~3% of a
    ViT-B/16 step on CPU. The loop checks the whole state before each save. With
    config.skip_nonfinite, `tx` is wrapped in optax.apply_if_finite
    (`optim.make_optimizer`): a step with a non-finite gradient (a non-finite loss
    brings one) keeps the old parameters and optimizer state and is counted in it; the
    step counter, and with it the data, move on.
    """
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, grads = loss_and_grads(model, state.params, batch, rng, accum_steps, loss_name)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": lr_fn(state.step),
        "finite": finite.astype(jnp.float32),
        "skipped": optim.skipped_steps(opt_state),
    }
    if "stop" in batch:  # the processes' signals, reduced with the step's own work
        metrics["stop"] = jnp.max(batch["stop"])
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def eval_step(
    params: Any, batch: dict, *, model: VisionTransformer, loss_name: str = "softmax_xent"
) -> dict[str, jax.Array]:
    """Each example's correct prediction (1 or 0) and loss (the training loss): [B] each."""
    logits = predict.logits(model, params, batch["image"])  # [B, K]
    correct = jnp.argmax(logits, -1) == jnp.argmax(batch["label"], -1)
    return {
        "correct": correct.astype(jnp.float32),
        "loss": LOSSES[loss_name](logits, batch["label"]),
    }


def compile_steps(
    model: VisionTransformer,
    tx: optax.GradientTransformation,
    lr_fn: Any,
    accum_steps: int,
    mesh: jax.sharding.Mesh,
    state_shardings: Any,
    loss_name: str = "softmax_xent",
):
    """The jitted train and eval steps (the contract is in the module docstring), both
    with the per-example loss LOSSES[loss_name]."""
    batch = sharding.batch_sharding(mesh)
    rep = sharding.replicated(mesh)
    step_fn = functools.partial(
        train_step,
        model=model,
        tx=tx,
        lr_fn=lr_fn,
        accum_steps=accum_steps,
        loss_name=loss_name,
    )
    step = jax.jit(
        step_fn,
        in_shardings=(state_shardings, batch),
        out_shardings=(state_shardings, rep),
        donate_argnums=0,
    )
    evaluate = jax.jit(
        functools.partial(eval_step, model=model, loss_name=loss_name),
        in_shardings=(state_shardings.params, batch),
        out_shardings=batch,
    )
    return step, evaluate


def for_config(
    config: Any,
    model: VisionTransformer,
    tx: optax.GradientTransformation,
    lr_fn: Any,
    mesh: jax.sharding.Mesh,
    state_shardings: Any,
):
    """The jitted steps of a run config: what the training loop runs and the planner
    (training/planner.py) compiles for a TPU topology."""
    loss_name = config.get("loss", "softmax_xent")
    return compile_steps(model, tx, lr_fn, config.accum_steps, mesh, state_shardings, loss_name)
