"""The planner over a matrix of runs: models x resolutions x TPU topologies x shardings.

    PYTHONPATH=~/.cache/vit_jax/libtpu-py3.11 python benchmarks/plan_matrix.py \\
        --models=b16,l16,h14 --sizes=224,384 --topologies=v3-8,v4-8,v5e-16,v5p-8 \\
        --out=plan_matrix.jsonl

Each cell is one `python -m vit_jax.plan --json` in a subprocess (the run's own train
step compiled for the topology): 224 px is the paper's pretraining (`pretrain:MODEL,
imagenet21k`: batch 4096, Adam), 384 px its fine-tuning (`finetune:MODEL,imagenet2012`:
batch 512, SGD); float32 as the presets. A size is rounded to the model's patch (H/14 at
384 plans 378 px, 27 x 14). Shardings: 'data' (data parallel, as the
presets) and 'fsdp' (parameters and optimizer state over every device, with remat).
Each cell's JSON is appended to --out as it finishes, and cells already there are not
run again, so a stopped matrix resumes. Prints a Markdown row per cell.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

DEVICES_PER_CHIP = {"TPU v3": 2, "TPU v4": 2}  # as libtpu lays them out here; others 1
GiB = 2**30


def cell_args(model: str, size: int, topology: str, sharding: str) -> list[str]:
    """The planner's flags for one cell."""
    if size == 224:
        args = [f"--config=pretrain:{model},imagenet21k"]
    else:
        args = [f"--config=finetune:{model},imagenet2012", f"--config.image_size={size}"]
    if sharding == "fsdp":
        # vN-COUNT counts TensorCores (v3, v4: a device each here; v5p: two a device)
        # or chips (v5e, v6e: a device each)
        count = int(topology.rsplit("-", 1)[1])
        devices = count // 2 if topology.startswith("v5p") else count
        args += [f"--config.mesh.fsdp={devices}", "--config.model.remat=True"]
    # XLA's attention, as the matrix was recorded (auto fuses from 512 tokens on v4 and newer:
    # benchmarks/attention_plan.py measures that)
    return [*args, "--config.model.attention=xla", f"--topology={topology}", "--json"]


def row(key: str, p: dict) -> str:
    """A Markdown row: the cell, bytes per device, fits, FLOPs, estimate, img/s per chip."""
    total = f"{p['total_bytes'] / GiB:.2f} of {p['hbm_bytes'] / GiB:.1f} GiB"
    if not p["compiled"]:
        took = f"{p['compile_seconds']:.0f} s"
        return f"| {key} | {total} | no (XLA refused) | - | - | - | - | {took} |"
    chip = DEVICES_PER_CHIP.get(p["device_kind"], 1)
    ips = p["images_per_second"]
    speed = (
        f"{p['step_seconds'] * 1e3:,.0f} ms | {ips / p['devices'] * chip:,.0f} | "
        f"{100 * p['utilisation']:.0f}%"
        if ips
        else "none | - | -"
    )
    return (
        f"| {key} | {total} | {'yes' if p['fits'] else 'no'} | "
        f"{p['flops'] / 1e12:.1f} TFLOP | {speed} | {p['compile_seconds']:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="b16,l16,h14")
    parser.add_argument("--sizes", default="224,384")
    parser.add_argument("--topologies", default="v3-8,v4-8,v5e-16,v5p-8")
    parser.add_argument("--shardings", default="data,fsdp")
    parser.add_argument("--out", default="plan_matrix.jsonl")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args()
    done = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {d["cell"]: d for d in map(json.loads, f)}
    print("| run, topology, sharding | per device | fits | FLOPs per device | step "
          "(estimate) | img/s per chip | utilisation | compile here |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    cells = itertools.product(
        args.models.split(","), map(int, args.sizes.split(",")), args.topologies.split(","),
        args.shardings.split(","),
    )  # fmt: skip
    for model, size, topology, sharding in cells:
        patch = int(model[1:])
        size = round(size / patch) * patch  # H/14 at 384: 378 (27 x 14), as the check says
        key = f"{model.upper()[0]}/{model[1:]} {size} px, {topology}, {sharding}"
        if key not in done:
            began = time.time()
            flags = cell_args(model, size, topology, sharding)
            cmd = [sys.executable, "-m", "vit_jax.plan", *flags]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"| {key} | compile over {args.timeout} s: not planned |", flush=True)
                continue
            if proc.returncode != 0:
                error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
                print(f"| {key} | failed: {(error or ['?'])[0]} |", flush=True)
                continue
            done[key] = {"cell": key, "wall_seconds": time.time() - began,
                         **json.loads(proc.stdout)}  # fmt: skip
            with open(args.out, "a") as f:
                f.write(json.dumps(done[key]) + "\n")
        print(row(key, done[key]), flush=True)


if __name__ == "__main__":
    main()
