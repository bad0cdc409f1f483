"""Plan a TPU run from any host: does it fit, how fast, how many core-days.

    python -m vit_jax.plan --config=pretrain:l16,imagenet21k --topology=v3-8 \\
        [--config.batch_size=1024 --config.model.remat=True ...] [--json] [--fit] [--compare]

Compiles the run's own train step (vit_jax/training/planner.py: the loop's step, model,
optimizer, loss, mesh and remat) for the topology with abstract arrays, and prints the
bytes each device holds against its HBM, the FLOPs of a step, the compiler's step-time
estimate (XLA's optimal_seconds: a lower bound, not a promise), images/s, the
utilisation that estimate implies, and the TPU-core-days of config.total_steps.
--fit searches the largest global batch that fits, with and without remat, data
parallel and fully sharded (FSDP over every device); --compare sets the estimate beside
the paper's Table 2 pretraining compute. --seq_len=N plans NaFlex batches of N patches a
row (+ the class token) instead of images, and says what the attention kernel pads the
sequence to (splash: a multiple of 128); a config with dataset.naflex plans its longest
length (or --seq_len's) at the batch the loop gives it (tokens_per_batch // length).
Needs libtpu: pip install "jax[tpu]" (or the [plan] extra).
Topologies: v3-8 ... v3-512, v4-8 ... v4-128, v5p-8 ..., v5e-1 ... v5e-256, v6e-..., or a
chip grid like v5e:4x4.
"""

from __future__ import annotations

import copy
import json

import ml_collections
from absl import flags
from ml_collections import config_flags

from vit_jax import cli, configs
from vit_jax.base import console, problems
from vit_jax.data import naflex
from vit_jax.parallel import sharding
from vit_jax.training import abstract, check, planner
from vit_jax.training import state as state_lib


def define_flags() -> None:
    config_flags.DEFINE_config_file(
        "config",
        None,
        "a preset NAME:ARG or config file PATH.py:ARG, as vit_jax.main takes",
        lock_config=True,
    )
    flags.DEFINE_string("topology", None, "TPU topology: v3-8, v4-8, v5e-16, v5p-8, v5e:4x4, ...")
    flags.DEFINE_integer("num_classes", None, "head width where the dataset is not a preset's")
    flags.DEFINE_bool("json", False, "print one JSON object (--fit, --compare: one per line)")
    flags.DEFINE_bool("fit", False, "the largest batch that fits, per remat and sharding")
    flags.DEFINE_bool("compare", False, "the paper's Table 2 compute against the estimate")
    flags.DEFINE_integer(
        "seq_len", None, "NaFlex: patches a row, instead of square images", lower_bound=1
    )
    flags.mark_flags_as_required(["config", "topology"])


def table(p) -> str:
    """The plan as aligned lines: bytes per device by kind, then speed and cost."""
    rows = {
        "topology": f"{p.topology}: {p.devices} x {p.device_kind}, mesh {p.mesh} "
        f"(compiled here in {p.compile_seconds:.0f} s)",
        "batch": f"{p.batch_size} global, {p.batch_size // p.devices} per device"
        f"{', remat' if p.remat else ''}",
        "sequence": sequence_row(p),
        "parameters": console.size(p.param_bytes),
        "optimizer state": console.size(p.optimizer_bytes),
        "input batch": console.size(p.batch_bytes),
        "temporaries": console.size(p.temp_bytes),
        "total per device": f"{console.size(p.total_bytes)} of {console.size(p.hbm_bytes)} HBM: "
        f"{'fits' if p.fits else 'does NOT fit'}",
        **speed_rows(p),
    }
    width = max(map(len, rows))
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows.items())


def sequence_row(p) -> str:
    """The blocks' tokens (NaFlex: its patches and the class token), and the kernel's pad."""
    cls = " + class token" if p.tokens > p.seq_len else ""
    out = f"{p.tokens} tokens" + (f" (NaFlex: {p.seq_len} patches{cls})" if p.seq_len else "")
    pad = p.kernel_tokens > p.tokens
    return out + (f"; the attention kernel pads them to {p.kernel_tokens}" if pad else "")


def speed_rows(p) -> dict[str, str]:
    """The table's rows of FLOPs, step time, images/s and cost, or why the compiler gave
    none: the step did not compile, its loop hides them, or its cost model said nothing."""
    fused = f", {p.kernel_flops:.3g} of them the attention kernel's" if p.kernel_flops else ""
    if not p.compiled:
        return {"step time": "not compiled: XLA refused the step, out of memory"}
    if p.loop:  # compiled.loop_of
        return {
            "FLOPs, step time": f"no estimate: XLA counts the {p.loop} loop's body once; "
            f"plan with --config.{p.loop}={LOOPLESS[p.loop]} for them"
        }
    flops = {"FLOPs per step": f"{p.flops:.3g} per device{fused}"}
    if p.step_seconds <= 0:  # the cost model gave no usable time (planner.compiled_figures)
        return {
            **flops,
            "step time": "no estimate: the compiler's cost model gave none for this step",
        }
    per_device = p.images_per_second / p.devices
    return {
        **flops,
        "step time": f"{1000 * p.step_seconds:.1f} ms (compiler estimate, a lower bound"
        f"{'; the kernel at peak FLOP/s' if p.kernel_flops else ''})",
        "images/s": f"{p.images_per_second:,.0f} ({per_device:,.0f} per device)",
        "utilisation": f"{100 * p.utilisation:.0f}% of peak bf16 FLOP/s at that time",
        "total": f"{p.total_steps:,} steps: {p.total_steps * p.step_seconds / 3600:,.1f} h, "
        f"{p.core_days:,.2f} TPU-core-days",
    }


LOOPLESS = {"model.scan": "False", "accum_steps": "1"}  # the settings without the loop


def advice(p) -> str:
    """What to change when a plan does not fit: the bytes over, and the levers."""
    levers = []
    if not p.remat:
        levers.append("--config.model.remat=True (recomputes activations: less temporaries)")
    if p.mesh.get("fsdp", 1) == 1 and p.devices > 1:
        levers.append(f"--config.mesh.fsdp={p.devices} (shards parameters and Adam's state)")
    levers.append("a smaller --config.batch_size, or --config.accum_steps=2 (same batch)")
    search = "" if getattr(p, "seq_len", None) else " (--fit searches)"
    over = console.size(p.total_bytes - p.hbm_bytes)
    return f"{over} over the device's HBM; try {'; '.join(levers)}{search}"


# The paper's Table 2 (TPUv3-core-days) and the runs behind it (Sections 4.1-4.2, B.1).
TABLE2 = [
    ("ViT-L/16 on ImageNet-21k", "l16", "imagenet21k", 14_197_122, 90, 21843, 230),
    ("ViT-L/16 on JFT-300M", "l16", "imagenet21k", 303_000_000, 7, 18291, 680),
    ("ViT-H/14 on JFT-300M", "h14", "imagenet21k", 303_000_000, 14, 18291, 2500),
]


def main() -> None:
    config = flags.FLAGS.config
    try:
        problems.raise_if_any(check.problems(config))
    except problems.ConfigError as e:
        raise e.with_prefix("--config.") from None
    topology, classes, seq_len = flags.FLAGS.topology, flags.FLAGS.num_classes, flags.FLAGS.seq_len
    if seq_len and (flags.FLAGS.fit or flags.FLAGS.compare):
        raise ValueError("--seq_len plans one step: leave out --fit and --compare")
    devices = planner.topology_devices(topology)
    if lens := config.dataset.naflex.seq_lens:  # a NaFlex run: a length at the loop's batch
        if not seq_len and not flags.FLAGS.json:
            longest = "planning the longest, whose attention holds the most (--seq_len=N: another)"
            print(f"NaFlex lengths {lengths_said(config, devices)}: {longest}")
        seq_len = seq_len or max(lens)
        config = at_length(config, len(devices), seq_len)
    if flags.FLAGS.compare:
        compare(devices, topology)
    elif flags.FLAGS.fit:
        fit(config, devices, topology, classes)
    else:
        p = planner.plan_on(config, devices, topology, classes, seq_len)
        print(json.dumps(p.to_json()) if flags.FLAGS.json else table(p))
        if not p.fits and not flags.FLAGS.json:
            print(advice(p))


def lengths_said(config: ml_collections.ConfigDict, devices: list) -> str:
    """'16 (17 tokens), 64 (65 tokens, splash pads them to 128)': each NaFlex length of
    `config` with the tokens its attention computes on `devices`."""
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, devices)
    model = state_lib.planned_model(config, None)
    each, cells = abstract.sequences(model, mesh, config.dataset.naflex.seq_lens), []
    for n, (tokens, padded, how) in each.items():
        pad = f", {how} pads them to {padded}" if padded > tokens else ""
        cells.append(f"{n} ({tokens} tokens{pad})")
    return ", ".join(cells)


def at_length(config: ml_collections.ConfigDict, devices: int, n: int) -> ml_collections.ConfigDict:
    """A NaFlex run's config with the batch the loop gives a step of `n` patches a row."""
    c = copy.deepcopy(config)
    lengths = naflex.Lengths.of(c.dataset.naflex, c.batch_size, devices * c.accum_steps, c.seed)
    c.batch_size = lengths.batch(n)
    return c


def compare(devices: list, topology: str) -> None:
    """Each run of TABLE2: the paper's core-days against the estimate's, a line each."""
    for what, model, data, images, epochs, k, paper in TABLE2:
        # Throughput at a batch that fits the topology (8 images a device, bfloat16,
        # remat, parameters and Adam's state sharded), times the paper's images seen.
        c = configs.get(f"pretrain:{model},{data}")
        c.model.dtype, c.model.remat = "bfloat16", True
        c.mesh.data, c.mesh.fsdp, c.batch_size = -1, len(devices), 8 * len(devices)
        p = planner.plan_on(c, devices, topology, k)
        seen, rate = epochs * images, p.images_per_second
        days = seen / rate * p.devices * p.cores_per_device / 86400 if rate else float("nan")
        if flags.FLAGS.json:
            row = dict(run=what, paper_core_days=paper, images_seen=seen, estimated_core_days=days)
            print(json.dumps({**row, **p.to_json()}))
        else:
            print(
                f"{what}: paper {paper:,} TPUv3-core-days; estimated {days:,.0f} on "
                f"{topology} ({days / paper:.2f}x; {epochs} epochs of {images:,} images "
                f"at {p.images_per_second:,.0f} images/s: batch {c.batch_size}, "
                "bfloat16, remat, FSDP; the compiler's estimate is a lower bound on "
                "the step)",
                flush=True,
            )


def fit(config, devices: list, topology: str, classes: int | None) -> None:
    """The largest batch that fits, data parallel and FSDP, without and with remat."""
    for fsdp in (1, len(devices)):
        for remat in (False, True):
            c = ml_collections.ConfigDict(config.to_dict())
            c.mesh.data, c.mesh.fsdp, c.model.remat = -1, fsdp, remat
            good, bad, n = planner.fit(c, devices, topology, classes)
            how = f"{'fsdp' if fsdp > 1 else 'data'}{' + remat' if remat else ''}"
            if flags.FLAGS.json:
                fits, over = (plan.to_json() if plan else None for plan in (good, bad))
                print(json.dumps(dict(sharding=how, compiles=n, fits=fits, does_not_fit=over)))
            elif good is None:
                said = f"no batch fits ({bad.batch_size}: {console.size(bad.total_bytes)}),"
                print(f"{how}: {said} {n} compiles", flush=True)
            else:
                top = f", {bad.batch_size} does not" if bad else " (the search's limit)"
                print(
                    f"{how}: batch {good.batch_size} fits ({console.size(good.total_bytes)} of "
                    f"{console.size(good.hbm_bytes)}, {good.images_per_second:,.0f} images/s "
                    f"estimated){top}; {n} compiles",
                    flush=True,
                )


preset_argv = configs.preset_argv  # a preset name in --config -> its file (as main.py)


if __name__ == "__main__":
    cli.run(main, define_flags, prepare_argv=preset_argv)
