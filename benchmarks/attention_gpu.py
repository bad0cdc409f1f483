"""cuDNN's fused attention against XLA's explicit softmax on one GPU: the loop's fine-tuning
step (SGD, bfloat16 compute) of ViT-B/16 and L/16 at 224 and 384 px, issue 42's GPU measure.

    python benchmarks/attention_gpu.py                 # on a GPU (about 5 minutes on an H200)
    python benchmarks/attention_gpu.py --smoke         # anywhere: Ti/16 at 32 px

For each cell (model, resolution, batch) and choice (`xla`, `cudnn`): img/s of
`train.train_step` jitted with its state donated (benchmarks/train_step.py's `measure`), and
the compiler's bytes on the device, its temporaries (the activations kept for the backward
pass, the attention probabilities among them under `xla`) and in all. A choice the platform
refuses prints the refusal. First, how far cuDNN's results are from XLA's (`agreement`; in
the smoke, splash's in interpret mode). One JSON line per measurement, then a Markdown table.
The JSON's gflops and achieved are XLA's own count: on a GPU it leaves out cuBLAS's calls.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bound import machine  # noqa: E402
from train_step import measure  # noqa: E402

from vit_jax.models import get_model  # noqa: E402

# (model, px, batch): the batch is fixed per cell, the same for both choices.
CELLS = [
    ("ViT-B_16", 384, 128),
    ("ViT-L_16", 384, 64),
    ("ViT-B_16", 224, 256),
    ("ViT-L_16", 224, 128),
]


def agreement(name: str, px: int, choice: str) -> dict:
    """||choice - xla|| / ||xla||, bfloat16, 4 random images and a random head: the logits, and
    the median and largest over the gradients but the key biases' (their exact gradient is 0:
    softmax does not see them, so two roundings of it differ by ~100%)."""
    x = jax.random.uniform(jax.random.key(px), (4, px, px, 3), minval=-1, maxval=1)
    xla = get_model(name, 10, dtype="bfloat16", attention="xla")
    params = xla.init(jax.random.key(1), x[:1])["params"]
    params["head"]["kernel"] = 0.02 * jax.random.normal(jax.random.key(2), (xla.width, 10))
    out = {}
    for m in (xla, xla.clone(attention=choice)):
        f = lambda p, m=m: m.apply({"params": p}, x).astype(jnp.float32)  # [4, 10]
        g = jax.jit(jax.grad(lambda p, f=f: jnp.mean(jnp.sin(f(p)))))(params)
        out[m.attention] = jax.jit(f)(params), jax.tree_util.tree_leaves_with_path(g)
    rel = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
    grads = [rel(a, b) for (path, a), (_, b) in zip(out[choice][1], out["xla"][1], strict=True)
             if "'key']['bias'" not in jax.tree_util.keystr(path)]  # fmt: skip
    return {"model": name, "px": px, "attention": choice,
            "logits": rel(out[choice][0], out["xla"][0]),
            "grad_median": float(np.median(grads)), "grad_max": max(grads)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--smoke", action="store_true", help="Ti/16 at 32 px, batch 4: proves the script runs"
    )
    a = ap.parse_args()
    cells = [("ViT-Ti_16", 32, 4)] if a.smoke else CELLS
    print(f"# {datetime.date.today()} — {machine()}", flush=True)
    try:  # the smoke's CPU has no cuDNN: splash, in interpret mode
        check = agreement(*cells[0][:2], "splash" if a.smoke else "cudnn")
        print(json.dumps({"agreement": check}), flush=True)
    except ValueError as e:
        print(json.dumps({"agreement": str(e)}), flush=True)
    rows = []
    for name, px, batch in cells:
        for choice in ("xla", "cudnn"):
            try:
                r = measure(name, px, batch, "sgd", "bfloat16", False, False, attention=choice)
            except ValueError as e:  # the choice's one-line refusal
                print(json.dumps({"model": name, "px": px, "attention": choice, "refused": str(e)}))
                continue
            row = {"model": name, "px": px, "batch": batch, "attention": choice,
                   **{k: round(v, 3) for k, v in r.items()}}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| model | px | batch | attention | img/s | step ms | temporaries GiB | in all GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['px']} | {r['batch']} | {r['attention']} | {r['ips']:.0f} | "
            f"{r['ms']:.1f} | {r['temp_gib']:.2f} | {r['total_gib']:.2f} |"
        )


if __name__ == "__main__":
    main()
