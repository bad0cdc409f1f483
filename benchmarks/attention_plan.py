"""XLA's attention against the splash kernel for the paper's fine-tuning resolutions, from
the planner: bytes per device, the activations a device keeps per image, the largest batch
that fits, and FLOPs.

    PYTHONPATH=~/.cache/vit_jax/libtpu-py3.11 python benchmarks/attention_plan.py \\
        [--models=l16:512,h14:518] [--topologies=v5e-8,v4-8,v5p-8] [--attention=xla,splash]

For each cell, the `finetune:MODEL,imagenet2012` preset (SGD with momentum, bfloat16
compute, data parallel, no remat) is compiled for the topology at 1 and 8 images a device (`--at`):
the difference is what one more image costs (activations: at these resolutions mostly the
attention probabilities, with xla), the rest what a device holds whatever the batch. The
largest batch is where that line reaches the chip's HBM; --check compiles it and one
more image a device, to confirm (the planner's `--fit` search takes ~6 compiles of ~3
minutes each here). The step time at 8 images a device is the compiler's estimate where
libtpu's cost model gives one (a positive number: not for v4 or v5e), and the FLOPs at the
chip's peak bf16 rate, a lower bound (the kernel's analytic FLOPs included:
report.kernel_flops). Prints a Markdown row per cell.
"""

from __future__ import annotations

import argparse
import time

GiB = 2**30


def dict_with(config, **fields):
    """A copy of `config` with `fields` set."""
    config = config.copy_and_resolve_references()
    config.update(fields)
    return config


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="l16:512,h14:518", help="MODEL:PIXELS, comma-separated")
    p.add_argument("--topologies", default="v5e-8,v4-8,v5p-8")
    p.add_argument("--attention", default="xla,splash")
    p.add_argument("--at", default="1,8", help="two batches a device to compile (H/14 on 16 "
                   "GiB chips: 1,2, since XLA already rematerialises at 8)")  # fmt: skip
    p.add_argument("--check", action="store_true", help="compile the batch found and one more")
    args = p.parse_args()
    from vit_jax.configs import finetune
    from vit_jax.training import planner
    from vit_jax.training.report import CHIPS

    print("| model, pixels | topology | attention | a device holds | each image a device "
          "adds | largest batch (a device) | TFLOPs a step a device (the second batch) | "
          "ms a step there: compiler / at peak | minutes |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for topology in args.topologies.split(","):
        devices = planner.topology_devices(topology)
        n = len(devices)
        for model, pixels in (m.split(":") for m in args.models.split(",")):
            for attention in args.attention.split(","):
                began = time.time()
                c = finetune.get_config(f"{model},imagenet2012")
                c.image_size, c.model.dtype, c.model.attention = int(pixels), "bfloat16", attention
                at = lambda per_device, c=c, d=devices, t=topology: planner.plan_on(
                    dict_with(c, batch_size=per_device * len(d)), d, t)  # fmt: skip
                low, high = map(int, args.at.split(","))
                one, eight = at(low), at(high)
                image = (eight.total_bytes - one.total_bytes) / (high - low)
                fixed = one.total_bytes - low * image
                largest = int((one.hbm_bytes - fixed) // image)
                found = f"{largest * n} ({largest})"
                if args.check:
                    ok, over = at(largest).fits, at(largest + 1).fits
                    found += " confirmed" if ok and not over else f" NOT confirmed ({ok}, {over})"
                compiler = f"{eight.step_seconds * 1e3:.0f}" if eight.step_seconds > 0 else "-"
                peak = eight.flops / CHIPS[eight.device_kind].peak_flops * 1e3
                print(f"| {model}, {pixels} | {topology} | {attention} | {fixed / GiB:.2f} GiB "
                      f"| {image / GiB:.3f} GiB | {found} | {eight.flops / 1e12:.1f} | "
                      f"{compiler} / {peak:.0f} | {(time.time() - began) / 60:.0f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
