"""Optimizers and learning-rate schedules from config.

Pretraining: Adam (b1 0.9, b2 0.999) with decoupled weight decay, scaled by the
learning rate and applied to kernels only. Fine-tuning: SGD with momentum 0.9, no
weight decay. Both: optional clipping at a global gradient norm, linear warmup, then
cosine or linear decay (or constant). With skip_nonfinite, optax.apply_if_finite around
it all skips the steps whose gradients are not finite and counts them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def schedule(cfg: Any, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to `cfg.lr` over `cfg.warmup_steps`, then `cfg.decay`
    ('cosine' | 'linear' | 'constant') down to `cfg.end_lr` at `total_steps`."""
    warmup = min(int(cfg.warmup_steps), total_steps)
    rest = max(total_steps - warmup, 1)
    if cfg.decay == "cosine":
        after = optax.cosine_decay_schedule(
            cfg.lr, rest, alpha=cfg.end_lr / cfg.lr if cfg.lr else 0
        )
    elif cfg.decay == "linear":
        after = optax.linear_schedule(cfg.lr, cfg.end_lr, rest)
    elif cfg.decay == "constant":
        after = optax.constant_schedule(cfg.lr)
    else:
        raise ValueError(f"unknown decay {cfg.decay!r}: use 'cosine', 'linear' or 'constant'")
    if not warmup:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warmup), after], [warmup])


def kernels_only(params: Any) -> Any:
    """Weight-decay mask: True for parameters named 'kernel' (not biases, norms, embeddings)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], "key", None) == "kernel", params
    )


# apply_if_finite gives in and applies a non-finite update after this many skipped in a
# row; never here (the counter saturates at this value): FiniteGuard stops the run first.
NEVER = int(jnp.iinfo(jnp.int32).max)


def for_config(config: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer and schedule of a run config (the loop's and the planner's)."""
    return make_optimizer(
        config.optimizer, config.total_steps, skip_nonfinite=config.get("skip_nonfinite", False)
    )


def make_optimizer(
    cfg: Any, total_steps: int, *, skip_nonfinite: bool = False
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer of `cfg` ('adam' | 'sgd') and its learning-rate schedule.

    With `skip_nonfinite`, a step whose gradients are not all finite leaves the
    optimizer state as it was, updates nothing and is counted (`skipped_steps`).
    """
    lr = schedule(cfg, total_steps)
    mu_dtype = jnp.dtype(cfg.mu_dtype) if cfg.mu_dtype else None
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip else []
    if cfg.name == "adam":
        parts.append(optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, mu_dtype=mu_dtype))
        if cfg.weight_decay:
            parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=kernels_only))
    elif cfg.name == "sgd":
        if cfg.weight_decay:
            parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=kernels_only))
        parts.append(optax.trace(decay=cfg.momentum, accumulator_dtype=mu_dtype))
    else:
        raise ValueError(f"unknown optimizer {cfg.name!r}: use 'adam' or 'sgd'")
    parts.append(optax.scale_by_learning_rate(lr))
    tx = optax.chain(*parts)
    if skip_nonfinite:  # finite steps equal the plain chain's to float32 rounding (lax.cond)
        tx = optax.apply_if_finite(tx, max_consecutive_errors=NEVER)
    return tx, lr


def skipped_steps(opt_state: Any) -> jax.Array:
    """i32[]: the steps skipped so far for non-finite gradients (0 without skip_nonfinite)."""
    if isinstance(opt_state, optax.ApplyIfFiniteState):
        return opt_state.total_notfinite
    return jnp.zeros((), jnp.int32)
