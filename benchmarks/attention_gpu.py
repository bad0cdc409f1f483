"""cuDNN's fused attention against XLA's explicit softmax on one GPU: the loop's fine-tuning
step (SGD, bfloat16 compute) of ViT-B/16 and L/16 at 224 and 384 px, issue 42's GPU measure.

    python benchmarks/attention_gpu.py                 # on a GPU (about 5 minutes on an H200)
    python benchmarks/attention_gpu.py --smoke         # anywhere: Ti/16 at 32 px
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python benchmarks/attention_gpu.py \
        --cells=ViT-L_16:224:128 --fit=ViT-L_16:384    # JAX takes 75% of the GPU unless told

For each cell (model, resolution, batch) and choice (`xla`, `cudnn`): img/s of
`step.train_step` jitted with its state donated (benchmarks/train_step.py's `measure`), and
the compiler's bytes on the device, its temporaries (the activations kept for the backward
pass, the attention probabilities among them under `xla`) and in all. A choice the platform
refuses prints the refusal. First, how far cuDNN's results are from XLA's (`agreement`; in
the smoke, splash's in interpret mode). One JSON line per measurement, then a Markdown table.
The JSON's gflops and achieved are XLA's own count: on a GPU it leaves out cuBLAS's calls.
`--fit` then finds, for each choice, the largest batch whose step runs (`fit`): at L/16 and
384 px about 4 minutes a choice on an H200 (each compile takes about a minute there).
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


def fit(name: str, px: int, choice: str, limit: float | None = None) -> None:
    """The largest batch of `choice` whose step runs on this device: the compiler's bytes in all
    at 32 and 64 images give a line; where it meets the device's limit is the guess. A step is
    then run there, and at 0.9x the guess if that one runs out of memory. JSON lines. `limit`
    (GiB) stands for the device's own, which a CPU does not have."""
    limit = limit or jax.devices()[0].memory_stats()["bytes_limit"] / 2**30
    kw = dict(opt="sgd", dtype="bfloat16", remat=False, bound=False, attention=choice)
    at = {b: measure(name, px, b, timed=False, **kw)["total_gib"] for b in (32, 64)}
    per_image = (at[64] - at[32]) / 32
    guess = int(64 + (limit - at[64]) / per_image)
    head = {"fit": name, "px": px, "attention": choice, "limit_gib": limit}
    print(json.dumps({**head, "gib_at": at, "gib_an_image": per_image, "guess": guess}), flush=True)
    for batch in (guess, int(0.9 * guess)):
        try:
            r = measure(name, px, batch, **kw)
        except Exception as e:  # noqa: BLE001 - only running out of memory is a result
            if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
                raise
            print(json.dumps({"fit": name, "attention": choice, "batch": batch, "runs": False,
                              "error": str(e).splitlines()[0][:300]}), flush=True)  # fmt: skip
            continue
        print(json.dumps({"fit": name, "attention": choice, "batch": batch, "runs": True,
                          **{k: round(v, 3) for k, v in r.items()}}), flush=True)  # fmt: skip
        return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--smoke", action="store_true", help="Ti/16 at 32 px, batch 4: proves the script runs"
    )
    ap.add_argument("--cells", default="", help="model:px:batch,... in place of the four cells")
    ap.add_argument("--fit", default="", help="model:px: the largest batch of each choice")
    ap.add_argument("--limit_gib", type=float, help="--fit's memory limit (default: the device's)")
    a = ap.parse_args()
    cells = [(m, int(px), int(b)) for m, px, b in (c.split(":") for c in a.cells.split(",") if c)]
    cells = [("ViT-Ti_16", 32, 4)] if a.smoke else cells or CELLS
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
    if a.fit:
        name, px = a.fit.split(":")
        for choice in ("xla", "cudnn"):
            try:
                fit(name, int(px), choice, a.limit_gib)
            except ValueError as e:  # the choice's one-line refusal
                print(json.dumps({"fit": name, "attention": choice, "refused": str(e)}))


if __name__ == "__main__":
    main()
