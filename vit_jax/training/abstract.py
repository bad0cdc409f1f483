"""The loop's train step with abstract arguments, nothing allocated: what the planner
compiles (planner.py) and what the loop says of its NaFlex lengths (train.py).

  loop_step       the step jitted as the loop jits it, its state and batch as
                  ShapeDtypeStructs with their shardings
  argument_bytes  bytes per device of those arguments
  sequence        the tokens the blocks run on, after the attention kernel's padding
  sequences       the same for each NaFlex length
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.models import attention
from vit_jax.parallel import sharding
from vit_jax.training import state as state_lib
from vit_jax.training.step import jit_steps


def loop_step(
    config: ml_collections.ConfigDict, mesh: Any, num_classes: int, seq_len: int | None = None
):
    """The training loop's jitted step for `config` on `mesh` and its abstract arguments
    (state and batch as ShapeDtypeStructs with their shardings): (step, state, batch). With
    `seq_len` the batch is NaFlex's (models/naflex.py), `seq_len` patches a row; the position
    table is still made for config.image_size (NaFlex resizes it to each image's grid)."""
    model = state_lib.planned_model(config, num_classes, config.image_size)
    tx, lr_fn = state_lib.optimizer_of(config)
    start = state_lib.Start(seed=config.seed, image_size=config.image_size)
    abstract = state_lib.abstract_state(start, model, tx)
    shardings = sharding.tree_shardings(mesh, abstract)
    step, _ = jit_steps(model, tx, lr_fn, mesh, shardings, config.accum_steps, config.loss)
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    b, size, split = config.batch_size, config.image_size, sharding.batch_sharding(mesh)
    at = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=split)
    image = at((b, size, size, model.channels))
    if seq_len:
        row = (b, seq_len)
        image = {"patches": at((*row, model.patch_dim)), "coords": at((*row, 2), jnp.int32)}
        image["valid"] = at(row, jnp.bool_)
    batch = {"image": image, "label": at((b, num_classes))}
    if len({d.process_index for d in mesh.devices.flat}) > 1:  # the processes' stop signals
        batch["stop"] = jax.ShapeDtypeStruct((b,), jnp.int32, sharding=split)
    return step, state, batch


def argument_bytes(state: Any, batch: Any) -> dict[str, int]:
    """Bytes per device of the step's arguments (abstract, with their shardings): the
    parameters, the optimizer state and the batch, under Plan's names for them."""
    held = lambda tree: sharding.bytes_per_device(tree, jax.tree.map(lambda x: x.sharding, tree))
    return dict(
        param_bytes=held(state.model_params),
        optimizer_bytes=held(state.opt_state),
        batch_bytes=held(batch),
    )


def sequence(model: Any, mesh: Any, image_size: int, seq_len: int | None) -> tuple[int, int, str]:
    """(tokens, tokens after the kernel's padding, the attention that runs) of `model`'s
    blocks at `image_size`, or at `seq_len` patches a row, compiled for `mesh`."""

    def on_mesh() -> tuple[int, int, str]:
        tokens = (seq_len or math.prod(model.grid((image_size,) * 2))) + model.num_prefix
        how = attention.choose(model.attention, tokens, model.dtype, model.attention_dropout)
        block = {"splash": attention.BLOCK, "cudnn": 2}.get(how, 1)
        return tokens, -(-tokens // block) * block, how

    return sharding.on_mesh(mesh, on_mesh)()


def sequences(model: Any, mesh: Any, seq_lens: Any) -> dict[int, tuple[int, int, str]]:
    """Each NaFlex length (patches a row) -> its `sequence` on `mesh`."""
    return {n: sequence(model, mesh, 0, n) for n in seq_lens}
