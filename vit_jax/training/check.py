"""One check of a whole run config, before anything is compiled, read or written.

Each section of the config has one table, field -> rule (`base.problems`), whose lists
of choices are those of the code that consumes them; the rules that relate two fields
follow each table. `problems(config)` names every field that cannot make sense from the
config alone (a `Problem` each: the field, its value, what is allowed);
`device_problems` those that do not fit the devices and processes of this run (and an
attention this host's devices cannot run); `data_problems` (check_data.py) those that
need the data and the `init_from` file. `check(config)` runs all three and raises one
`ConfigError` naming every bad field. `train.run` calls it before it touches the
workdir, and `vit_jax.recipe` checks its three parts before the first of them trains.
"""

from __future__ import annotations

import math
from typing import Any

import ml_collections

from vit_jax.base.problems import (
    ConfigError,
    Problem,
    integer,
    is_int,
    is_number,
    number,
    one_of,
    optional,
    raise_if_any,
    table_problems,
)
from vit_jax.data import config as data_config
from vit_jax.data import naflex, splits
from vit_jax.models import DTYPES, GELUS, attention, get_model, variant_config
from vit_jax.models.lora import TARGETS
from vit_jax.models.posemb import KINDS
from vit_jax.training.check_data import data_problems
from vit_jax.training.state import DECAYS, MODEL_SIZES, MU_DTYPES, OPTIMIZERS
from vit_jax.training.step import LOSSES

__all__ = ["ConfigError", "Problem", "check", "data_problems", "device_problems", "problems"]

TRAINABLE_CLASSIFIERS = ("token", "gap")  # 'unpooled' has no logits per image to train on
EVERY = " (0: only after the last step)"
RUN = {
    "seed": integer(0),
    **dict.fromkeys(("total_steps", "batch_size", "eval_batch_size", "accum_steps"), integer(1)),
    **dict.fromkeys(("log_every", "eval_every", "checkpoint_every"), integer(0, EVERY)),
    "keep_checkpoints": integer(0, " (0: keep all)"),
    "loss": one_of(tuple(LOSSES)),
}
MODEL = {
    **dict.fromkeys(MODEL_SIZES, optional(integer(1, " (or None: the variant's)"))),
    "representation_size": optional(integer(0, " (0: no layer)")),
    "classifier": one_of(TRAINABLE_CLASSIFIERS),
    "posemb": one_of(KINDS),
    "dropout": number(0, 1, high_open=True),
    "attention_dropout": number(0, 1, high_open=True),
    "stochastic_depth": number(0, 1, high_open=True),
    "dtype": one_of(tuple(DTYPES)),
    "gelu": optional(one_of(GELUS)),
    "layer_norm_eps": optional(number(0, 1, low_open=True, high_open=True)),
    "head_bias_init": number(),
    "attention": one_of(attention.CHOICES),
}
OPTIMIZER = {
    "name": one_of(OPTIMIZERS),
    "lr": number(0, low_open=True),
    "decay": one_of(DECAYS),
    **dict.fromkeys(("momentum", "b1", "b2"), number(0, 1, high_open=True)),
    "weight_decay": number(0),
    "grad_clip": number(0, note=" (0: no clipping)"),
    "layer_decay": number(0, 1, note=" (0: off)"),
    "mu_dtype": one_of(MU_DTYPES),
}
FEWSHOT = {
    "source": lambda v: None if not v else one_of(data_config.SOURCES)(v),
    **dict.fromkeys(("train_split", "test_split"), splits.spec_rule),
    "shots": lambda v: (
        None
        if isinstance(v, (tuple, list)) and v and all(is_int(k) and k >= 1 for k in v)
        else "expected examples per class >= 1, e.g. (1, 5)"
    ),
    "l2": number(0),
    "seed": integer(0),
    "batch_size": integer(1),
    "every": integer(0, " (0: with each evaluation)"),
}
MESH = {
    "data": lambda v: (
        None if v == -1 or (is_int(v) and v >= 1) else "expected -1 (every device left) or >= 1"
    ),
    "fsdp": integer(1),
}
STORE = {"retry_seconds": number(0, low_open=True)}
LORA = {
    "rank": integer(0, " (0: off)"),
    "alpha": number(0, note=" (0: the rank)"),
    "targets": lambda v: (
        None
        if isinstance(v, str) and v.strip() and all(t.strip() in TARGETS for t in v.split(","))
        else f"expected some of {', '.join(TARGETS)}, comma-separated"
    ),
}
DISTRIBUTED = {
    "num_processes": integer(0, " (0: not set)"),
    "process_id": integer(-1, " (-1: not set)"),
    **dict.fromkeys(("timeout_seconds", "peer_timeout_seconds"), number(0, low_open=True)),
}


def problems(config: ml_collections.ConfigDict) -> list[Problem]:
    """Every field of `config` that cannot make sense, from the config alone."""
    c = config
    out = table_problems(c, RUN)
    if not out and c.batch_size % c.accum_steps:
        why = (
            f"expected a divisor of batch_size ({c.batch_size}): it splits each batch into "
            "that many micro-batches"
        )
        out.append(Problem("accum_steps", c.accum_steps, why))
    sized = all(c.model.get(k) for k in MODEL_SIZES)
    if c.model.name or not c.init_from or sized:  # an empty name is init_from's (build_model)
        out += _model_problems(c.model, c.image_size, c.dataset.naflex.seq_lens)
    out += _optimizer_problems(c.optimizer, c.total_steps)
    out += data_config.problems(c.dataset, "dataset.")
    out += _fewshot_problems(c.fewshot)
    for section, table in (("mesh", MESH), ("distributed", DISTRIBUTED), ("store", STORE)):
        out += table_problems(c[section], table, f"{section}.")
    if not isinstance(c.init_from, str):
        out.append(Problem("init_from", c.init_from, "expected a path ('' trains from scratch)"))
    out += table_problems(c.lora, LORA, "lora.")
    if not out and c.lora.rank and not c.init_from:
        why = "LoRA adapts a trained model: set init_from (or lora.rank=0 to train in full)"
        out.append(Problem("lora.rank", c.lora.rank, why))
    return out


def _model_problems(m: Any, image_size: Any, seq_lens: Any = None) -> list[Problem]:
    out: list[Problem] = []
    try:
        if m.name or not all(m.get(k) for k in MODEL_SIZES):  # every size: a model of its own
            variant_config(m.name)
    except (ValueError, TypeError) as e:
        tower = "; '' takes init_from's whole architecture: set init_from" if not m.name else ""
        out.append(Problem("model.name", m.name, f"{e}{tower}"))
    out += table_problems(m, MODEL, "model.")
    if not is_int(image_size) or image_size < 1:
        out.append(Problem("image_size", image_size, "expected an integer >= 1 (pixels a side)"))
    if out:
        return out
    fields = {k: v for k, v in m.items() if k != "name" and v not in (None, 0)}
    model = get_model(m.name, None, **fields)
    if model.width % model.num_heads:
        why = f"expected a divisor of the width ({model.width}): each head takes width / heads"
        out.append(Problem("model.num_heads", model.num_heads, why))
    if seq_lens is not None and model.resnet_stages is not None:
        why = "a hybrid's ResNet stem takes whole images: NaFlex needs a plain ViT (or None)"
        out.append(Problem("dataset.naflex.seq_lens", seq_lens, why))
    s = model.token_stride
    if image_size % s:
        near = max(s, round(image_size / s) * s)
        stem = " (the stem's downsampling x the patch)" if model.resnet_stages is not None else ""
        why = f"expected a multiple of the model's {s} px per token{stem}, e.g. {near}"
        out.append(Problem("image_size", image_size, why))
    return out


def _optimizer_problems(o: Any, total_steps: Any) -> list[Problem]:
    out = table_problems(o, OPTIMIZER, "optimizer.")
    high = o.lr if is_number(o.lr) and o.lr > 0 else None
    if why := number(0, high, note=" (the learning rate decays to it)")(o.end_lr):
        out.append(Problem("optimizer.end_lr", o.end_lr, why))
    warmup, fix = o.warmup_steps, ""
    why = integer(0)(warmup)
    if is_int(total_steps) and total_steps >= 1 and (why or warmup > total_steps):
        fix = "" if why else f"N with N <= {total_steps} (a shorter run needs a shorter warmup)"
        why = f"expected an integer from 0 to total_steps ({total_steps})"
    if why:
        out.append(Problem("optimizer.warmup_steps", warmup, why, fix))
    return out


def _fewshot_problems(f: Any) -> list[Problem]:
    if not isinstance(f.datasets, str):
        return [Problem("fewshot.datasets", f.datasets, "expected names, comma-separated")]
    out = table_problems(f, FEWSHOT, "fewshot.")
    names = [n.strip() for n in f.datasets.split(",") if n.strip()]
    tfds = f.source == "tfds" or (not f.source and any(n != "fashion_mnist" for n in names))
    if tfds and data_config.remote_tfds(f.data_dir):
        out.append(Problem("fewshot.data_dir", f.data_dir, data_config.REMOTE_TFDS))
    return out


def device_problems(config: ml_collections.ConfigDict, devices: int, processes: int) -> list:
    """The fields that do not fit `devices` devices over `processes` processes."""
    c, out = config, []
    data, fsdp = c.mesh.data, c.mesh.fsdp
    if fsdp and devices % fsdp:
        out.append(Problem("mesh.fsdp", fsdp, f"expected a divisor of the {devices} devices"))
    elif data != -1 and data * fsdp != devices:
        why = f"expected -1 or {devices // fsdp}: data x fsdp ({fsdp}) must be {devices} devices"
        out.append(Problem("mesh.data", data, why))
    per_step, flex = devices * c.accum_steps, c.dataset.naflex
    if flex.seq_lens is not None:  # each step's batch: tokens // length, rounded to a multiple
        lengths = naflex.Lengths.of(flex, c.batch_size, math.lcm(per_step, processes), c.seed)
        if why := lengths.too_few():
            fix = f"N >= {lengths.fewest_tokens}"
            out.append(
                Problem("dataset.naflex.tokens_per_batch", lengths.tokens_per_batch, why, fix)
            )
    elif c.batch_size % per_step or c.batch_size % processes:
        why = (
            f"expected a multiple of {per_step} ({devices} devices x accum_steps "
            f"{c.accum_steps}) and of the {processes} processes"
        )
        out.append(Problem("batch_size", c.batch_size, why))
    batches = [("eval_batch_size", c.eval_batch_size)]
    if c.fewshot.datasets:
        batches.append(("fewshot.batch_size", c.fewshot.batch_size))
    for field, b in batches:
        if b % devices:
            out.append(Problem(field, b, f"expected a multiple of the {devices} devices"))
    m = c.model
    try:  # what this host's devices cannot run (the planner checks a TPU target's)
        attention.choose(m.attention, 0, m.dtype, m.attention_dropout)
    except ValueError as e:
        out.append(Problem("model.attention", m.attention, str(e)))
    return out


def check(
    config: ml_collections.ConfigDict,
    *,
    devices: int | None = None,
    processes: int | None = None,
    init_from_later: bool = False,
    read_data: bool = True,
) -> None:
    """Raises a ConfigError naming every field of `config` that cannot make sense: from
    the config alone, then against the devices and processes (this run's, unless given),
    then against the data (unless `read_data` is False). Nothing is written.

    Raises:
        ConfigError: a ValueError; str() has one line per bad field.
    """
    raise_if_any(problems(config))
    if devices is None or processes is None:
        import jax

        devices, processes = jax.device_count(), jax.process_count()
    raise_if_any(device_problems(config, devices, processes))
    if read_data:
        raise_if_any(data_problems(config, init_from_later))
