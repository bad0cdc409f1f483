"""What NaFlex's masks cost (issue 52; the aim: at most 10%): the forward pass of a NaFlex
batch with realistic padding against the square model's at the same sequence length N, on
this CPU, and the train step the planner compiles for a TPU topology with splash attention.

    python benchmarks/naflex_forward.py [--model=ViT-B_16] [--seq_lens=256,576,1024] [--batch=4]
    PYTHONPATH=~/.cache/vit_jax/libtpu-py3.11 python benchmarks/naflex_forward.py \\
        --topology=v5e-8 --plan_batch=4    # the planner's rows too (needs libtpu)

At each N the square model sees images of sqrt(N) x P px (N patches, no padding); NaFlex a
batch of as many images at the aspect ratios of ASPECTS, each at the largest grid of at
most N patches for its ratio (as NaFlex preprocessing resizes: 85-100% of N), padded to N.
One model and one set of parameters (the position table made for the square grid, which
NaFlex resizes to each image's), jitted, float32, attention as `auto` picks it (XLA's on a
CPU); the two are timed alternately, the median of each printed, and their ratio. With
libtpu, the loop's train step is planned (vit_jax/training/planner.py) for the topology with
attention=splash and bfloat16 (the finetune preset, `--plan_batch` images a device) for
both: the tokens and what splash pads them to, FLOPs and bytes per device, and the step
time, the compiler's estimate where it gives one, else the FLOPs at the chip's peak (a lower
bound).
Prints Markdown rows.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu on the path: no TPU backend here
import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bound import machine  # noqa: E402

from vit_jax.models import get_model, naflex  # noqa: E402

ASPECTS = (1.0, 3 / 4, 4 / 3, 9 / 16)  # height / width: square, 4:3, 3:4, 16:9
SMOKE = dict(width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=4)


def grid(aspect: float, n: int) -> tuple[int, int]:
    """The largest (gh, gw) of about `aspect` (gh / gw) with gh * gw <= n."""
    return max(1, math.floor(math.sqrt(n * aspect))), max(1, math.floor(math.sqrt(n / aspect)))


def inputs(n: int, batch: int, patch: int, seed: int = 0) -> tuple[np.ndarray, dict, float]:
    """(square images [B, S, S, 3], a NaFlex batch of `batch` mixed aspect ratios padded to
    n, its mean fill of n)."""
    rng = np.random.default_rng(seed)
    side = math.isqrt(n) * patch
    square = rng.uniform(-1, 1, (batch, side, side, 3)).astype(np.float32)
    grids = [grid(ASPECTS[i % len(ASPECTS)], n) for i in range(batch)]
    rows = [
        naflex.patchify(rng.uniform(-1, 1, (1, gh * patch, gw * patch, 3)), patch, n)
        for gh, gw in grids
    ]
    x = {k: np.concatenate([r[k] for r in rows]) for k in naflex.KEYS}
    return square, x, float(np.mean([gh * gw / n for gh, gw in grids]))


def alternately(fn, params, a, b, repeats: int) -> tuple[float, float]:
    """Median seconds of fn(params, a) and of fn(params, b), called in turn (the machine's
    drift hits both alike)."""
    for x in (a, b):
        jax.block_until_ready(fn(params, x))  # compiled, warm
    times = ([], [])
    for _ in range(repeats):
        for x, out in zip((a, b), times, strict=True):
            began = time.perf_counter()
            jax.block_until_ready(fn(params, x))
            out.append(time.perf_counter() - began)
    return float(np.median(times[0])), float(np.median(times[1]))


def forward_rows(args, model_kw: dict) -> None:
    """One row per N: the square and the NaFlex forward pass on this CPU, and their ratio."""
    print(f"forward pass, {machine()}, {args.model or 'smoke'}, batch {args.batch}, float32")
    print("| N | square: px, ms | NaFlex: fill of N, ms | NaFlex / square |")
    print("|---|---|---|---|")
    for n in args.seq_lens:
        model = get_model(args.model, 1000, **model_kw)
        p = model.patch_size
        square, x, fill = inputs(n, args.batch, p)
        params = jax.jit(model.init)(jax.random.key(0), square[:1])["params"]
        apply = jax.jit(lambda params, x, model=model: model.apply({"params": params}, x))
        sq, fx = alternately(apply, params, square, x, args.repeats)
        print(f"| {n} | {square.shape[1]}, {sq * 1e3:.4g} | {fill:.0%}, {fx * 1e3:.4g} | "
              f"{fx / sq:.3f} |", flush=True)  # fmt: skip


def plan_rows(args, model_kw: dict) -> None:
    """One row per N: the planner's train step for the topology, square and NaFlex."""
    from vit_jax.training import planner
    from vit_jax.training.compiled import CHIPS
    from vit_jax.training.state import build_model

    try:
        devices = planner.topology_devices(args.topology)
    except ImportError as e:
        print(f"planner rows skipped: {e}")
        return
    from vit_jax.configs import finetune

    print(f"\ntrain step planned for {args.topology}, attention=splash, bfloat16, "
          f"{args.plan_batch} images a device")  # fmt: skip
    print("| N | tokens, splash pads to | square: GFLOP, ms, GiB a device | NaFlex: GFLOP, ms, "
          "GiB a device | NaFlex / square (FLOPs, ms) | compile s |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for n in args.seq_lens:
        c = finetune.get_config("b16,imagenet2012")  # SGD, data parallel, no remat
        c.model.update(name=args.model, dtype="bfloat16", attention="splash", **model_kw)
        c.image_size = math.isqrt(n) * build_model(c.model, 1000).patch_size
        c.batch_size = args.plan_batch * len(devices)
        began = time.time()
        sq, fx = (planner.plan_on(c, devices, args.topology, 1000, s) for s in (None, n))
        both = sq.step_seconds > 0 and fx.step_seconds > 0  # the compiler's, else at peak
        peak = CHIPS[sq.device_kind].peak_flops
        ms = [1e3 * (p.step_seconds if both else p.flops / peak) for p in (sq, fx)]
        kind = "compiler's estimate" if both else "FLOPs at peak"
        cost = lambda p, t: f"{p.flops / 1e9:.4g}, {t:.4g}, {p.total_bytes / 2**30:.2f}"
        print(f"| {n} | {fx.tokens}, {fx.kernel_tokens} | {cost(sq, ms[0])} | {cost(fx, ms[1])} | "
              f"{fx.flops / sq.flops:.3f}, "
              f"{ms[1] / ms[0]:.3f} ({kind}) | {time.time() - began:.0f} |",
              flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="ViT-B_16", help="a variant name")
    ap.add_argument("--seq_lens", default="256,576,1024", help="N, comma-separated squares")
    ap.add_argument("--batch", type=int, default=4, help="images a forward pass")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls of each")
    ap.add_argument("--topology", default="v5e-8", help="the planner's TPU topology")
    ap.add_argument("--plan_batch", type=int, default=4, help="images a device, planned")
    ap.add_argument("--no-plan", dest="plan", action="store_false", help="CPU rows only")
    ap.add_argument("--smoke", action="store_true", help="a tiny model at N = 16, 36")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.seq_lens, args.repeats = None, "16,36", 2
    args.seq_lens = [int(n) for n in args.seq_lens.split(",")]
    model_kw = SMOKE if args.model is None else {}
    forward_rows(args, model_kw)
    if args.plan:
        plan_rows(args, model_kw)


if __name__ == "__main__":
    main()
