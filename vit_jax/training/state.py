"""The training state and its optimizer: built from scratch or from a checkpoint, created
in its sharded layout, restored from the workdir's newest checkpoint that verifies. No
TensorFlow.

Optimizers: pretraining is Adam (b1 0.9, b2 0.999) with decoupled weight decay, scaled
by the learning rate and applied to kernels only; fine-tuning is SGD with momentum 0.9,
no weight decay. Both: optional clipping at a global gradient norm, linear warmup, then
cosine or linear decay (or constant), and optional layer-wise learning-rate decay
(layer_decay.py). With skip_nonfinite, optax.apply_if_finite around
it all skips the steps whose gradients are not finite and counts them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from vit_jax.configs.common import model_fields
from vit_jax.models import get_model, lora
from vit_jax.models.vit import VisionTransformer
from vit_jax.parallel import sharding
from vit_jax.training import layer_decay, report
from vit_jax.weights.load import load_pretrained, read_fields
from vit_jax.weights.read import read_meta
from vit_jax.workdir import verify
from vit_jax.workdir.checkpoints import Checkpoints

OPTIMIZERS = ("adam", "sgd")
DECAYS = ("cosine", "linear", "constant")
MU_DTYPES = ("", "float32", "bfloat16")  # the first moment's dtype ('': the parameters')
MODEL_SIZES = ("width", "depth", "num_heads", "mlp_dim", "patch_size")  # all set: no variant
# apply_if_finite gives in and applies a non-finite update after this many skipped in a
# row; never here (the counter saturates at this value): the loop's guard stops first.
NEVER = int(jnp.iinfo(jnp.int32).max)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # i32[]: completed steps
    params: Any
    opt_state: Any
    rng: jax.Array  # u32[2]: raw key data for dropout, folded with the step
    # With LoRA, `params` holds what trains (adapters, head) and `frozen` the rest of
    # init_from: no gradient, no optimizer state, never saved (init_from is read again).
    frozen: Any = None

    def saved(self) -> TrainState:
        """What a checkpoint holds: all but the frozen base."""
        return self.replace(frozen=None)

    @property
    def model_params(self) -> Any:
        """The model's whole parameter tree (LoRA's adapters unmerged)."""
        return lora.overlay(self.frozen, self.params)


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

    @classmethod
    def of(cls, config: Any) -> Start:
        patch = config.model.get("patch_size")
        return cls(
            config.seed, config.image_size, config.init_from or None, config.reset_head, patch
        )


# ---------------------------------------------------------------------- objective, optimizer


def schedule(cfg: Any, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0 to `cfg.lr` over `cfg.warmup_steps`, then `cfg.decay`
    (one of DECAYS) down to `cfg.end_lr` at `total_steps`."""
    warmup = min(int(cfg.warmup_steps), total_steps)
    rest = max(total_steps - warmup, 1)
    alpha = cfg.end_lr / cfg.lr if cfg.lr else 0  # cosine's: the fraction it ends at
    after = {
        "cosine": lambda: optax.cosine_decay_schedule(cfg.lr, rest, alpha=alpha),
        "linear": lambda: optax.linear_schedule(cfg.lr, cfg.end_lr, rest),
        "constant": lambda: optax.constant_schedule(cfg.lr),
    }[cfg.decay]()
    if not warmup:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warmup), after], [warmup])


def kernels_only(params: Any) -> Any:
    """Weight-decay mask: True for parameters named 'kernel' (not biases, norms, embeddings)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], "key", None) == "kernel", params
    )


def make_optimizer(
    cfg: Any, total_steps: int, *, skip_nonfinite: bool = False
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer of `cfg` (one of OPTIMIZERS) and its learning-rate schedule.

    With `skip_nonfinite`, a step whose gradients are not all finite leaves the
    optimizer state as it was, updates nothing and is counted (`skipped_steps`).
    """
    lr = schedule(cfg, total_steps)
    mu_dtype = jnp.dtype(cfg.mu_dtype) if cfg.mu_dtype else None
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip else []
    decay = [optax.add_decayed_weights(cfg.weight_decay, kernels_only)] if cfg.weight_decay else []
    if cfg.name == "adam":
        parts += [optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, mu_dtype=mu_dtype), *decay]
    else:
        parts += [*decay, optax.trace(decay=cfg.momentum, accumulator_dtype=mu_dtype)]
    parts.append(optax.scale_by_learning_rate(lr))
    if cfg.get("layer_decay"):  # after the learning rate: weight decay is scaled too (timm)
        parts.append(layer_decay.scale_by_layer(cfg.layer_decay))
    tx = optax.chain(*parts)
    if skip_nonfinite:  # finite steps equal the plain chain's to float32 rounding (lax.cond)
        tx = optax.apply_if_finite(tx, max_consecutive_errors=NEVER)
    return tx, lr


def optimizer_of(config: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimizer and schedule of a run config (the loop's and the planner's)."""
    skip = config.get("skip_nonfinite", False)
    return make_optimizer(config.optimizer, config.total_steps, skip_nonfinite=skip)


def skipped_steps(opt_state: Any) -> jax.Array:
    """i32[]: the steps skipped so far for non-finite gradients (0 without skip_nonfinite)."""
    if isinstance(opt_state, optax.ApplyIfFiniteState):
        return opt_state.total_notfinite
    return jnp.zeros((), jnp.int32)


# ---------------------------------------------------------------------- the state


def build_model(
    model: Any,
    num_classes: int | None,
    init_from: str | dict | None = None,
    adapters: Any = None,
    image_size: int | None = None,
) -> VisionTransformer:
    """The model of a config's `model` fields: a name plus any VisionTransformer field,
    with the LoRA adapters of `adapters` (config.lora). What the fields leave unset is
    `init_from`'s, the checkpoint fine-tuned: with a name, what the file records (its
    numerics and the towers' fields its tensors cannot tell: weights/meta.py); an empty
    name is init_from's whole architecture (`weights.load.fields_of`: sizes, registers,
    rotary embeddings, ...; or those fields, as a run records them: workdir.Plan), its
    pooling and position embeddings too unless the fields change them from
    `model_fields`' defaults. A representation layer is the config's
    alone (the paper's fine-tuning drops it). With `image_size` (config.image_size) the
    position tables are made on its grid (posemb_grid), whatever the batches are.

    Raises:
      ValueError: an empty name without init_from or every size (an empty name with every
        size is a model of its own, with init_from's numerics as a name's).
    """
    name = model["name"] or None
    fields = {k: v for k, v in model.items() if k != "name" and v is not None}
    sized = all(k in fields for k in MODEL_SIZES)
    if name is None and not init_from and not sized:
        raise ValueError(
            "config.model.name is empty, which means init_from's architecture, and "
            "init_from is not set: name a variant (e.g. 'B/16'), give every size or set "
            "init_from"
        )
    whole = name is None and not sized and init_from  # the file's whole architecture
    if whole:  # the defaults are unset: the file's pooling and position table
        defaults = model_fields("")
        fields = {k: v for k, v in fields.items() if v != defaults.get(k)}
    fields["lora"] = lora.Lora.of(adapters)
    if fields.get("representation_size") == 0:
        del fields["representation_size"]
    told = {}
    if whole:  # the file's whole architecture, or a run's record of it
        told = init_from if isinstance(init_from, dict) else read_fields(init_from)
        told = {k: v for k, v in told.items() if v is not None and k != "representation_size"}
    elif init_from:
        meta = read_meta(init_from)
        told = {**meta.fields, **meta.numerics}
    for key, value in told.items():
        fields.setdefault(key, tuple(value) if isinstance(value, list) else value)  # JSON's
    built = get_model(name, num_classes=num_classes, **fields)
    if image_size and built.posemb_grid is None:
        return built.clone(posemb_grid=built.grid((image_size, image_size)))
    return built


def planned_model(config: Any, num_classes: int | None, image_size: int | None = None):
    """`build_model` of a run config for the planner, which reads init_from only where the
    model is its architecture (an empty name): a plan needs no file otherwise."""
    sized = all(config.model.get(k) for k in MODEL_SIZES)
    from_file = None if config.model.name or sized else config.get("init_from") or None
    return build_model(config.model, num_classes, from_file, config.get("lora"), image_size)


def new_state(
    start: Start, model: VisionTransformer, tx: optax.GradientTransformation, params: Any = None
) -> TrainState:
    """The TrainState at step 0 (traceable): `params`, or the model's initialisation.
    With LoRA, the adapters are initialised and `params` (the base) is split."""
    if params is None or model.lora:
        x = jnp.zeros((1, start.image_size, start.image_size, model.channels), jnp.float32)
        params = lora.overlay(model.init(jax.random.key(start.seed), x)["params"], params)
    params, frozen = lora.split(params) if model.lora else (params, None)
    rng = jax.random.key_data(jax.random.fold_in(jax.random.key(start.seed), 1))
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), rng, frozen)


def abstract_state(start: Start, model: VisionTransformer, tx: Any) -> TrainState:
    """The TrainState's shapes and dtypes (ShapeDtypeStructs; nothing allocated)."""
    return jax.eval_shape(functools.partial(new_state, start, model, tx))


def create_state(
    start: Start, model: VisionTransformer, tx: optax.GradientTransformation, mesh: Any
) -> tuple[TrainState, Any]:
    """A TrainState at step 0, created in its sharded layout (no device ever holds a
    whole unsharded copy), and its shardings. Fine-tuning reads `start.init_from` (any
    format; a `start.patch_size` other than the file's resamples its patch embedding), and
    says what it changed: 'fine-tuning from PATH: position embeddings ... -> ...; a new
    zero-initialised head for 10 classes'."""
    shardings = sharding.tree_shardings(mesh, abstract_state(start, model, tx))
    make = jax.jit(functools.partial(new_state, start, model, tx), out_shardings=shardings)
    if not start.init_from:
        return make(), shardings
    said: list[str] = []
    params = init_params(start, model, said)
    report.say(f"fine-tuning from {start.init_from}: {'; '.join(said)}")
    return make(sharding.put(params, sharding.tree_shardings(mesh, params))), shardings


def init_params(start: Start, model: VisionTransformer, said: list[str] | None = None) -> Any:
    """`start.init_from`'s parameters for `model`, without LoRA's adapters (host arrays)."""
    plain = model.clone(lora=None)
    size, reset, patch = start.image_size, start.reset_head, start.patch_size
    return load_pretrained(start.init_from, plain, size, reset, patch, said)


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
    (`verify.restore_newest`).

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
    ).saved()
    state, _ = verify.restore_newest(checkpoints, target, from_scratch_if_damaged)
    if state is None:
        return create_state(start, model, tx, mesh)
    if model.lora:  # the frozen base is init_from's, read again
        frozen = lora.split(init_params(start, model))[1]
        state = state.replace(frozen=sharding.put(frozen, shardings.frozen))
    return state, shardings
