"""What the towers' deltas cost a train step (issue 61): each family's fields on the paper's
B/16 sizes, against the paper's B/16 at the same image size, batch and optimizer.

    python benchmarks/towers.py --batch=8                 # 224 px, SGD, float32, this CPU
    python benchmarks/towers.py --batch=2 --image_size=64 --model=testing   # seconds

Each row is `train_step.measure` (the loop's jitted step, state donated, one device) on a
model built with the family's fields as its loader builds it (weights/towers.py); the patch
count is the paper's (196 at 224 px), so a family with registers also carries its 4 more
tokens, which is what it costs. The families are timed in turn, then the paper's model
again: the spread of its two rows is the machine's drift over the run.
"""

from __future__ import annotations

import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bound import machine, parser  # noqa: E402
from train_step import measure  # noqa: E402

FAMILIES = {
    "paper ViT (B/16)": {},
    "DINOv2 (LayerScale, 4 registers)": dict(layer_scale=1e-5, registers=4, embed_prefix=False),
    "DINOv3 (+ RoPE, no qkv bias)": dict(
        layer_scale=1e-5, registers=4, posemb="none", rope="dinov3", qkv_bias="", gelu="exact"
    ),
    "CLIP (pre-norm, QuickGELU)": dict(pre_norm=True, gelu="quick"),
    "SigLIP (MAP head)": dict(classifier="map"),
    "EVA-02 (SwiGLU, MLP norm, RoPE)": dict(
        swiglu=True,
        mlp_norm=True,
        rope="eva",
        rope_grid=(16, 16),
        qkv_bias="qv",
        classifier="gap",
        class_token=True,
        fc_norm=True,
    ),  # fmt: skip
}


def main() -> None:
    ap = parser(__doc__, lists=False)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    a = ap.parse_args()
    print(f"# {datetime.date.today()} — {machine()}")
    print(f"{a.model} sizes, {a.image_size} px, batch {a.batch}, {a.optimizer}, {a.dtype}\n")
    print("| family | img/s | step ms | x paper's |\n|---|---:|---:|---:|")
    rows = [*FAMILIES.items(), ("paper ViT again (drift)", {})]
    base = None
    for name, fields in rows:
        if fields.get("swiglu"):  # EVA-02's hidden width: 2/3 of 4D per half
            fields = dict(fields, mlp_dim=2048 if a.model == "ViT-B_16" else None)
            fields = {k: v for k, v in fields.items() if v is not None}
        r = measure(a.model, a.image_size, a.batch, a.optimizer, a.dtype, False, False, **fields)
        base = base or r["ms"]
        print(f"| {name} | {r['ips']:.2f} | {r['ms']:.0f} | {r['ms'] / base:.3f} |", flush=True)


if __name__ == "__main__":
    main()
