"""XLA's attention against the splash kernel for the paper's fine-tuning resolutions, from
the planner: bytes per device, the activations a device keeps per image, the largest batch
that fits, and FLOPs.

    PYTHONPATH=~/.cache/vit_jax/libtpu-py3.11 python benchmarks/attention_plan.py \\
        [--models=l16:512,h14:518] [--topologies=v5e-8,v4-8,v5p-8] [--attention=xla,splash]
    ... --fit --at=FITS,FAILS    # narrows a bracket: a batch a device that fits, one that does not

For each cell, the `finetune:MODEL,imagenet2012` preset (SGD with momentum, bfloat16
compute, data parallel, no remat) is compiled for the topology at 1 and 8 images a device (`--at`):
the difference is what one more image costs (activations: at these resolutions mostly the
attention probabilities, with xla), the rest what a device holds whatever the batch. The
largest batch is where that line reaches the chip's HBM; --fit then searches for the
largest that compiles within HBM, a device's images at a time: each compile's guess is where
the line through the nearest fitting and failing compiles reaches HBM (XLA rematerialises
near the limit, so the first line is not the last word), until the batch fits and one more
image a device does not, or --max-compiles (a floor then; the planner's bisecting `--fit`
takes ~6 compiles of ~3 minutes each here). The step time at 8 images a device is the
compiler's estimate where libtpu's cost model gives one (a positive number: not for v4 or
v5e), and the FLOPs at the chip's peak bf16 rate, a lower bound (the kernel's analytic FLOPs
included: compiled.kernel_flops). Prints a Markdown row per cell.
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


def search(seen: dict, at, n: int, max_compiles: int) -> str:
    """The largest images a device that fit, from the plans `seen` (images a device -> Plan):
    each guess is where the line through the largest fitting and the smallest failing plan
    (or the two largest) reaches HBM, kept between them. Where bytes grew at under half the
    first line's slope or fell (XLA trading memory for recomputation near the limit), or if
    the first plans hold over 85% of HBM already (a narrowing run's seeds, whose line is
    flat), it strides from then on, twice the last stride, or bisects once a batch has failed
    (a line from a flat point means nothing); a guess is kept in
    the middle half of a wide bracket, which so shrinks at every compile. Returns the cell."""
    low, high = sorted(seen)
    first = (seen[high].total_bytes - seen[low].total_bytes) / (high - low)
    flat = seen[low].total_bytes > 0.85 * seen[low].hbm_bytes
    for compiles in range(max_compiles + 1):
        fitting = sorted(k for k, p in seen.items() if p.fits) or [0]
        good, bad = fitting[-1], min((k for k, p in seen.items() if not p.fits), default=None)
        if bad == good + 1 or not good:  # (nothing fits: 0)
            return f"**{good * n}** ({good}; {bad} a device does not fit, {compiles} compiles)"
        if compiles == max_compiles:
            return f"{good * n} fits ({good} a device; a floor after {compiles} compiles)"
        a, b = (good, bad) if bad and good else sorted(seen)[-2:]
        slope = (seen[b].total_bytes - seen[a].total_bytes) / (b - a)
        flat = flat or slope < first / 2  # once seen, for the rest of the search
        if flat:
            guess = (good + bad) // 2 if bad else good + 2 * (good - fitting[-2])
        else:
            guess = good + int((seen[good].hbm_bytes - seen[good].total_bytes) // slope)
        guess = max(good + 1, min(guess, bad - 1) if bad else guess)
        if bad and bad - good > 3:  # in the bracket's middle half: it shrinks by a quarter
            guess = min(max(guess, good + (bad - good) // 4), bad - (bad - good) // 4)
        seen[guess] = p = at(guess)
        ms = f", {p.step_seconds * 1e3:.0f} ms a step (estimate)" if p.step_seconds > 0 else ""
        print(f"  {guess} a device: {p.total_bytes / GiB:.2f} GiB, "
              f"{'fits' if p.fits else 'does not fit'}{ms}", flush=True)  # fmt: skip
    raise AssertionError  # (the loop returns)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="l16:512,h14:518", help="MODEL:PIXELS, comma-separated")
    p.add_argument("--topologies", default="v5e-8,v4-8,v5p-8")
    p.add_argument("--attention", default="xla,splash")
    p.add_argument("--at", default="1,8", help="two batches a device to compile (H/14 on 16 "
                   "GiB chips: 1,2, since XLA already rematerialises at 8)")  # fmt: skip
    p.add_argument("--fit", action="store_true", help="search for the largest batch that fits")
    p.add_argument("--max-compiles", type=int, default=4, help="--fit's compiles a cell")
    args = p.parse_args()
    from vit_jax.configs import finetune
    from vit_jax.training import planner
    from vit_jax.training.compiled import CHIPS

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
                found = f"the line: {largest * n} ({largest})"
                if args.fit:
                    found = search({low: one, high: eight}, at, n, args.max_compiles)
                compiler = f"{eight.step_seconds * 1e3:.0f}" if eight.step_seconds > 0 else "-"
                peak = eight.flops / CHIPS[eight.device_kind].peak_flops * 1e3
                print(f"| {model}, {pixels} | {topology} | {attention} | {fixed / GiB:.2f} GiB "
                      f"| {image / GiB:.3f} GiB | {found} | {eight.flops / 1e12:.1f} | "
                      f"{compiler} / {peak:.0f} | {(time.time() - began) / 60:.0f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
