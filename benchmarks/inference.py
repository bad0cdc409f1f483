"""Inference speed of ViT variants, against the bound of their own matrix products.

    python benchmarks/inference.py --model=ViT-B_16 --batch=8 --dtype=float32
    python benchmarks/inference.py --model=all --batch=1,8 --image_size=224,384 --no-bound

A resolution that is not a multiple of a model's patch (token stride for hybrids) is
rounded up to one: ViT-H/14 at 384 runs at 392, as the 'res' column says.
Prints, per (model, resolution, batch, dtype): images/s, GFLOPs per image from XLA's
cost analysis, achieved GFLOP/s, and (unless --no-bound) the bound: the summed time
of the model's matrix products (patch embedding, q/k/v/out/MLP and the two attention
products, the stem's convolutions for hybrids), each timed alone at the model's
shapes. `bound/model` near 1 means the model runs as fast as its products allow.
"""

from __future__ import annotations

import datetime
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bound import machine, parser, product_bound, timeit  # noqa: E402

from vit_jax.models import VARIANTS, get_model  # noqa: E402


def measure(name: str, size: int, batch: int, dtype: str, bound: bool, show: bool) -> dict:
    model = get_model(name, 1000, dtype=dtype)
    x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (batch, size, size, 3)), jnp.float32)
    params = jax.jit(model.init)(jax.random.key(0), x[:1])["params"]
    if dtype != "float32":  # parameters stored in the compute dtype, as a deployment would
        params = jax.tree.map(lambda p: p.astype(dtype), params)
    fwd = jax.jit(lambda p, x: model.apply({"params": p}, x))
    compiled = fwd.lower(params, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops", 0.0)) / batch
    t = timeit(lambda: compiled(params, x))
    row = dict(
        model=name,
        size=size,
        batch=batch,
        dtype=dtype,
        ips=batch / t,
        gflops=flops / 1e9,
        achieved=flops * batch / t / 1e9,
        ms=1e3 * t,
    )
    if bound:
        b, lines = product_bound(lambda p, x: model.apply({"params": p}, x), params, x)
        row.update(bound_ms=1e3 * b, ratio=b / t)
        if show:
            print(f"{name} @ {size}, batch {batch}, {dtype}: matrix products, each timed alone")
            print("\n".join(lines))
    return row


def main() -> None:
    ap = parser(__doc__, lists=True)
    args = ap.parse_args()
    # 'all': every published architecture ('-gap-norep' checkpoints compute as their base).
    names = (
        [n for n in VARIANTS if n != "testing" and not n.endswith("-gap-norep")]
        if args.model == "all"
        else args.model.split(",")
    )
    print(f"# {datetime.date.today()} — {machine()}")
    head = (
        f"{'model':<20} {'res':>4} {'batch':>5} {'dtype':>8} {'img/s':>9} "
        f"{'GFLOP/img':>9} {'GFLOP/s':>8} {'model ms':>9} {'bound ms':>9} {'bound/model':>11}"
    )
    print(head)
    for name in names:
        stride = get_model(name, 1000).token_stride
        for asked in map(int, args.image_size.split(",")):
            size = -(-asked // stride) * stride  # e.g. ViT-H/14 at 384 -> 392
            for batch in map(int, args.batch.split(",")):
                for dtype in args.dtype.split(","):
                    r = measure(name, size, batch, dtype, args.bound, args.products)
                    tail = (
                        f"{r['bound_ms']:9.1f} {r['ratio']:11.3f}"
                        if args.bound
                        else f"{'-':>9} {'-':>11}"
                    )
                    print(
                        f"{name:<20} {size:>4} {batch:>5} {dtype:>8} {r['ips']:9.2f} "
                        f"{r['gflops']:9.4g} {r['achieved']:8.1f} {r['ms']:9.1f} " + tail,
                        flush=True,
                    )


if __name__ == "__main__":
    main()
