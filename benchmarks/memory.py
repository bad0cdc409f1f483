"""Per-device memory of ViT training, replicated vs FSDP, and the largest batch that fits.

    python benchmarks/memory.py --budget_gib=16 [--models=ViT-B_16,ViT-L_16] [--image_size=224]

On 8 emulated CPU devices (set here before jax starts); nothing is allocated.

1. The training state (parameters + Adam's two float32 moments) per device, from
   `jax.eval_shape` and `sharding.tree_shardings`: replicated (mesh data=8, fsdp=1)
   against FSDP (data=1, fsdp=8).
2. The largest batch per device within --budget_gib, plain / remat / remat+scan, for
   both layouts. A device's peak is read from the compiled train step's
   `memory_analysis()` (XLA's buffer assignment): arguments + outputs - donated
   (aliased) + temporaries. Temporaries grow about linearly with the batch (above a
   few examples), so two compiles (per-device batch 16 and 64) give a line; it is
   extrapolated to the budget and the result compiled once more to check; where it
   does not fit, the batch is bisected by compiling (column 'found'). These are
   XLA:CPU's figures: a GPU or TPU compiler assigns buffers differently, so read
   them as estimates there. On XLA:CPU `remat` without `scan` saves nothing (its
   schedule recomputes the blocks early); with `scan` it does.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

DEVICES = 8
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from bound import machine  # noqa: E402

from vit_jax.configs import common  # noqa: E402
from vit_jax.models import count_params  # noqa: E402
from vit_jax.parallel import sharding  # noqa: E402
from vit_jax.training import state as state_lib  # noqa: E402
from vit_jax.training import step as step_lib  # noqa: E402
from vit_jax.workdir.workdir import tree_bytes  # noqa: E402

GIB = 2**30
LAYOUTS = {"replicated": (DEVICES, 1), "fsdp": (1, DEVICES)}
VARIANTS = {"plain": {}, "remat": {"remat": True}, "remat+scan": {"remat": True, "scan": True}}
PROBES = (16, 64)  # per-device batches of the two compiles that give the line


def setup(name: str, image_size: int, variant: dict) -> tuple:
    """(config, model, tx, lr_fn, abstract state) of a pretraining run of `name`."""
    c = common.base(name)
    c.image_size = image_size
    c.model.update(variant)
    c.optimizer.update(name="adam", weight_decay=0.1)
    model = state_lib.build_model(c.model, 1000)
    tx, lr_fn = state_lib.make_optimizer(c.optimizer, c.total_steps)
    return c, model, tx, lr_fn, state_lib.abstract_state(state_lib.Start.of(c), model, tx)


def state_row(name: str, image_size: int) -> dict:
    """Bytes of the state in total and per device, replicated and FSDP."""
    _, _, _, _, abstract = setup(name, image_size, {})
    row = {"model": name, "params": count_params(abstract.params)}
    row["params_gib"] = tree_bytes(abstract.params) / GIB
    row["state_gib"] = tree_bytes(abstract) / GIB
    for layout, (data, fsdp) in LAYOUTS.items():
        mesh = sharding.make_mesh(data, fsdp)
        shardings = sharding.tree_shardings(mesh, abstract)
        row[layout] = sharding.bytes_per_device(abstract, shardings) / GIB
    return row


def peak_bytes(setup_out: tuple, layout: str, per_device: int) -> int:
    """One device's peak of the compiled train step at `per_device` examples."""
    c, model, tx, lr_fn, abstract = setup_out
    mesh = sharding.make_mesh(*LAYOUTS[layout])
    shardings = sharding.tree_shardings(mesh, abstract)
    batch_sharding = sharding.batch_sharding(mesh)
    n, size = per_device * DEVICES, c.image_size
    batch = {
        "image": jax.ShapeDtypeStruct((n, size, size, 3), jnp.float32, sharding=batch_sharding),
        "label": jax.ShapeDtypeStruct((n, 1000), jnp.float32, sharding=batch_sharding),
    }
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    step, _ = step_lib.jit_steps(model, tx, lr_fn, mesh, shardings, 1)  # as the loop jits it
    m = step.lower(state, batch).compile().memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )


def largest_batch(setup_out: tuple, layout: str, budget: float) -> tuple[int, float, float, str]:
    """(per-device batch, its compiled peak, bytes per example, how it was found) within
    `budget` bytes: the probes' line extrapolated, checked by compiling; bisected
    between the largest batch known to fit and the smallest known not to if over."""
    b1, b2 = PROBES
    peaks = {b: peak_bytes(setup_out, layout, b) for b in PROBES}
    slope = max((peaks[b2] - peaks[b1]) / (b2 - b1), 1.0)
    guess = max(int((budget - peaks[b1]) // slope) + b1, 1)
    peaks[guess] = peak_bytes(setup_out, layout, guess)
    fits = [b for b, p in peaks.items() if p <= budget]
    over = [b for b, p in peaks.items() if p > budget]
    lo, hi = max(fits, default=0), min(over, default=None)
    how = "line"
    while hi is not None and hi - lo > max(1, lo // 20):  # to within 5%
        how, mid = "bisected", (lo + hi) // 2
        peaks[mid] = peak_bytes(setup_out, layout, mid)
        lo, hi = (mid, hi) if peaks[mid] <= budget else (lo, mid)
    return lo, float(peaks.get(lo, 0.0)), slope, how


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="ViT-B_16,ViT-L_16")
    ap.add_argument("--state_models", default="ViT-B_16,ViT-L_16,ViT-H_14")
    ap.add_argument("--image_size", type=int, default=224)
    ap.add_argument("--budget_gib", type=float, default=16.0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    print(f"# {datetime.date.today()} — {machine()}, {jax.device_count()} emulated devices")
    print(f"\nTraining state per device (params + Adam mu, nu; float32), {a.image_size} px")
    print(
        f"{'model':<10} {'params':>12} {'params GiB':>10} {'state GiB':>10} "
        f"{'replicated':>11} {'FSDP/8':>8} {'ratio':>6}"
    )
    for name in a.state_models.split(","):
        r = state_row(name, a.image_size)
        print(
            f"{name:<10} {r['params']:>12,} {r['params_gib']:>10.2f} {r['state_gib']:>10.2f} "
            f"{r['replicated']:>11.2f} {r['fsdp']:>8.3f} {r['replicated'] / r['fsdp']:>6.2f}"
        )
    print(
        f"\nLargest batch per device within {a.budget_gib:g} GiB ({a.image_size} px, Adam; "
        f"XLA:CPU memory_analysis at per-device {PROBES[0]} and {PROBES[1]}, the line "
        "extrapolated and checked by compiling, bisected where it did not fit)"
    )
    print(
        f"{'model':<10} {'variant':<11} {'layout':<11} {'MiB/example':>11} "
        f"{'batch/device':>12} {'global':>7} {'peak GiB':>9} {'found':>9}"
    )
    for name in a.models.split(","):
        for variant in a.variants.split(","):
            s = setup(name, a.image_size, VARIANTS[variant])
            for layout in LAYOUTS:
                b, peak, slope, how = largest_batch(s, layout, a.budget_gib * GIB)
                print(
                    f"{name:<10} {variant:<11} {layout:<11} {slope / 2**20:>11.1f} "
                    f"{b:>12} {b * DEVICES:>7} {peak / GIB:>9.2f} {how:>9}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
