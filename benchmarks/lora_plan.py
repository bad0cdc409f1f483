"""Full fine-tuning against LoRA, from the planner: bytes per device and the largest batch.

    PYTHONPATH=~/.cache/vit_jax/libtpu-py3.11 python benchmarks/lora_plan.py \\
        [--model=l16] [--size=384] [--topologies=v5e-8,v3-8] [--ranks=0,8]

For each topology and rank (0: full), the `finetune:MODEL,imagenet2012` preset (SGD with
momentum, bfloat16 compute, data parallel, no remat) is compiled for the topology at the
paper's fine-tuning batch (512) and then `planner.fit` searches the largest global batch
that fits (doubling or halving, then bisecting; at most --max_compiles). init_from is never
read (the planner does not need it). Prints a Markdown row per cell.
"""

from __future__ import annotations

import argparse
import time

GiB = 2**30


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="l16")
    p.add_argument("--size", type=int, default=384)
    p.add_argument("--topologies", default="v5e-8,v3-8")
    p.add_argument("--ranks", default="0,8")
    p.add_argument("--cells", default="", help="only these topology:rank cells, e.g. v3-8:0")
    p.add_argument("--max_compiles", type=int, default=6, help="of the search, per cell")
    args = p.parse_args()
    from vit_jax.configs import finetune
    from vit_jax.training import planner

    print(
        "| topology | fine-tuning | parameters + optimizer state a device | a device at batch "
        "512 | largest batch that fits (a device) | compiles, minutes |"
    )
    print("|---|---|---|---|---|---|")
    for topology in args.topologies.split(","):
        devices = planner.topology_devices(topology)
        for rank in map(int, args.ranks.split(",")):
            if args.cells and f"{topology}:{rank}" not in args.cells.split(","):
                continue
            c = finetune.get_config(f"{args.model},imagenet2012")
            c.image_size, c.model.dtype, c.lora.rank = args.size, "bfloat16", rank
            c.model.attention = "xla"  # as recorded (benchmarks/attention_plan.py: fused)
            began = time.time()
            at512 = planner.plan_on(c, devices, topology)
            good, bad, n = planner.fit(c, devices, topology, max_compiles=args.max_compiles)
            state = (at512.param_bytes + at512.optimizer_bytes) / GiB
            fits = f"{good.batch_size} ({good.total_bytes / GiB:.2f} GiB)" if good else "none"
            fits += f"; {bad.batch_size} does not" if good and bad else ""
            trained = "all" if not rank else f"LoRA r={rank} on query, value"
            print(f"| {topology} | {trained} | {state:.2f} GiB | {at512.total_bytes / GiB:.2f} "
                  f"GiB of {at512.hbm_bytes / GiB:.2f} | {fits} | {n + 1}, "
                  f"{(time.time() - began) / 60:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
