"""The training state: built from a config (from scratch or from a checkpoint), created in
its sharded layout, restored from the workdir's latest checkpoint, exported as .npz.
No TensorFlow.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp

from vit_jax import checkpoint, distributed, integrity, recovery, sharding
from vit_jax.models import get_model
from vit_jax.models.vit import VisionTransformer
from vit_jax.steps import TrainState


def build_model(config: Any, num_classes: int) -> VisionTransformer:
    """The model of `config.model`: a name plus any VisionTransformer field."""
    fields = {k: v for k, v in config.model.items() if k != "name" and v is not None}
    if fields.get("representation_size") == 0:
        del fields["representation_size"]
    return get_model(config.model.name, num_classes=num_classes, **fields)


def initial_params(config: Any, model: VisionTransformer, image_size: int) -> Any:
    """From scratch, or from a checkpoint (`config.init_from`, any format) for fine-tuning;
    a `config.model.patch_size` other than the file's resamples its patch embedding."""
    if config.init_from:
        return checkpoint.load_pretrained(
            config.init_from,
            model,
            image_size,
            reset_head=config.reset_head,
            patch_size=config.model.get("patch_size"),
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
    """The newest checkpoint in the workdir that verifies, laid out for `mesh` (whatever
    mesh wrote it), else a new state; damaged ones are named and set aside
    (`recovery.restore_newest`).

    Raises:
        ValueError: a checkpoint of another model, optimizer or image size.
        OSError: checkpoints, none of which verifies (and not
            config.from_scratch_if_damaged).
    """
    if not integrity.step_dirs(str(manager.directory)):
        return create_state(config, model, tx, mesh)
    abstract = abstract_state(config, model, tx)
    shardings = sharding.tree_shardings(mesh, abstract)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    scratch = config.get("from_scratch_if_damaged", False)
    state, step = recovery.restore_newest(manager, target, scratch)
    if state is None:
        return create_state(config, model, tx, mesh)
    if distributed.is_lead():
        print(f"resuming from step {step} (checkpoint {manager.directory}/{step})", flush=True)
    return state, shardings


def export_npz(path: str, params: Any) -> None:
    """`params` (sharded, possibly over several processes) -> a published-layout .npz,
    written by process 0. Every process must call it (the arrays are gathered)."""
    host = distributed.to_host(params)
    if distributed.is_lead():
        checkpoint.save_npz(path, host)
