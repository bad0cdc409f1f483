"""The training state: built from scratch or from a checkpoint, created in its sharded
layout, restored from the workdir's newest checkpoint that verifies, exported as .npz.
It is told what it needs (`Start`, the model's fields), not handed the whole config.
No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from vit_jax.models import get_model
from vit_jax.models.vit import VisionTransformer
from vit_jax.parallel import distributed, sharding
from vit_jax.weights.load import load_pretrained
from vit_jax.weights.npz import save_npz
from vit_jax.weights.read import read_numerics
from vit_jax.workdir.checkpoints import Checkpoints


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # i32[]: completed steps
    params: Any
    opt_state: Any
    rng: jax.Array  # u32[2]: raw key data for dropout, folded with the step


@dataclasses.dataclass(frozen=True)
class Start:
    """How a run's state begins: its seed and image size, and for fine-tuning the
    checkpoint it starts from (any format; None: from scratch), whether that file's head
    is replaced, and the patch size its patch embedding is resampled to (None: the
    file's)."""

    seed: int
    image_size: int
    init_from: str | None = None
    reset_head: bool = True
    patch_size: int | None = None


def build_model(
    model: Any, num_classes: int | None, init_from: str | None = None
) -> VisionTransformer:
    """The model of a config's `model` fields: a name plus any VisionTransformer field.
    The numerics the fields leave unset (gelu, layer_norm_eps: None) are `init_from`'s,
    the checkpoint fine-tuned (what its source computes, see weights/numerics.py)."""
    fields = {k: v for k, v in model.items() if k != "name" and v is not None}
    if fields.get("representation_size") == 0:
        del fields["representation_size"]
    if init_from:
        for key, value in read_numerics(init_from).items():
            fields.setdefault(key, value)
    return get_model(model["name"], num_classes=num_classes, **fields)


def initial_params(start: Start, model: VisionTransformer, image_size: int) -> Any:
    """From scratch, or from a checkpoint (`start.init_from`, any format) for fine-tuning;
    a `start.patch_size` other than the file's resamples its patch embedding."""
    if start.init_from:
        return load_pretrained(
            start.init_from,
            model,
            image_size,
            reset_head=start.reset_head,
            patch_size=start.patch_size,
        )
    x = jnp.zeros((1, image_size, image_size, model.channels), jnp.float32)
    return jax.jit(model.init)(jax.random.key(start.seed), x)["params"]


def new_state(
    start: Start, model: VisionTransformer, tx: optax.GradientTransformation, params: Any = None
) -> TrainState:
    """The TrainState at step 0 (traceable): `params`, or the model's initialisation."""
    if params is None:
        x = jnp.zeros((1, start.image_size, start.image_size, model.channels), jnp.float32)
        params = model.init(jax.random.key(start.seed), x)["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.key_data(jax.random.fold_in(jax.random.key(start.seed), 1)),
    )


def abstract_state(start: Start, model: VisionTransformer, tx: Any) -> TrainState:
    """The TrainState's shapes and dtypes (ShapeDtypeStructs; nothing allocated)."""
    return jax.eval_shape(functools.partial(new_state, start, model, tx))


def create_state(
    start: Start,
    model: VisionTransformer,
    tx: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
) -> tuple[TrainState, Any]:
    """A TrainState at step 0, created in its sharded layout, and its shardings."""
    shardings = sharding.tree_shardings(mesh, abstract_state(start, model, tx))
    make = jax.jit(functools.partial(new_state, start, model, tx), out_shardings=shardings)
    if not start.init_from:
        return make(), shardings
    params = initial_params(start, model, start.image_size)  # host arrays
    return make(sharding.put(params, shardings.params)), shardings


def restore_or_create(
    start: Start,
    model: VisionTransformer,
    tx: Any,
    mesh: Any,
    checkpoints: Checkpoints,
    from_scratch_if_damaged: bool = False,
) -> tuple[TrainState, Any]:
    """The newest checkpoint in the workdir that verifies, laid out for `mesh` (whatever
    mesh wrote it), else a new state; damaged ones are named and set aside
    (`Checkpoints.restore_newest`).

    Raises:
        ValueError: a checkpoint of another model, optimizer or image size.
        OSError: checkpoints, none of which verifies (and not `from_scratch_if_damaged`).
    """
    if not checkpoints.steps():
        return create_state(start, model, tx, mesh)
    abstract = abstract_state(start, model, tx)
    shardings = sharding.tree_shardings(mesh, abstract)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    state, _ = checkpoints.restore_newest(target, from_scratch_if_damaged)
    if state is None:
        return create_state(start, model, tx, mesh)
    return state, shardings


def export_npz(
    path: str,
    params: Any,
    computes: dict | None = None,
    labels: list[str] | None = None,
    method: str | None = None,
) -> None:
    """`params` (sharded, possibly over several processes) -> a published-layout .npz,
    written by process 0, with the model's numerics `computes` (`numerics.of_model`), its
    head's class names `labels` and the preprocessing `method` it was trained with. Every
    process must call it (the arrays are gathered)."""
    host = distributed.to_host(params)
    if distributed.is_lead():
        save_npz(path, host, computes, labels, method)
