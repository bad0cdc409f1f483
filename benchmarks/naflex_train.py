"""What NaFlex costs in training (issue "Train and serve at native aspect ratio"): the loop's
jitted train step on a NaFlex batch against the square model's at the same tokens and batch,
on this CPU, with the compiles its lengths cost; and the padding each length leaves on the
NaFlex study's Fashion-MNIST canvases.

    python benchmarks/naflex_train.py                       # ViT 192x4, patch 16, 3 lengths
    python benchmarks/naflex_train.py --seq_lens=64,144,256 --tokens_per_batch=4096 --repeats=7
    python benchmarks/naflex_train.py --smoke               # a tiny model, seconds
    python benchmarks/naflex_train.py --padding_only        # the second table alone

Step table: a small ViT (width 192, depth 4, 3 heads, MLP 768, patch 16, 10 classes, Adam as
`fashion_mnist:tiny` sets it, float32, attention as `auto` picks it: XLA's on a CPU) built as
the loop builds it (training.state + step.jit_steps, one device). NaFlex: ONE state whose
position table is made for the longest length's square grid (config.image_size, as in a
run) and ONE jitted step, called at each length N with the loop's batch,
tokens_per_batch // N (data.naflex.Lengths); its rows come from `naflex.put` on random
photos-like sizes (aspect ratio log-uniform in 1:2 ... 2:1), each resized to the largest grid
of at most N patches for its ratio: rows 85-100% filled, mixed grids. Square: the same model
on sqrt(N) x 16 px images (N patches, no padding), its own state (position table of that
grid), the same batch: equal tokens, equal images. After a warm-up call each, the two steps
are timed alternately (`--repeats` calls each; the machine's drift hits both alike) and the
median printed: ms a step, images/s, patches/s (sequence slots, padding included; for NaFlex
also the real patches); NaFlex / square is the ratio of step times: what the masks and each
image's position-table resize cost. The first call of each step is timed too (trace, lower,
XLA's compile, one run), and XLA's compile seconds (jax.monitoring's
backend_compile_duration), with the jitted step's cache entries: NaFlex compiles once per
length, the price of its buckets.

Padding table (no timing): Fashion-MNIST items on canvases of studies/naflex.py's seven shapes
(SHAPES: 28x84 ... 84x28 px, aspect 1:3 ... 3:1), patch 4, the study's lengths: for each
length the fraction of a row that is padding, 1 - gh*gw/N at naflex.size_for_sequence's grid,
its mean over the shapes drawn uniformly (and its range); then the same over all 16 canvases
h x w with h, w in {28, 42, 56, 84} (all within 3:1).
Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bound import machine  # noqa: E402

from vit_jax.data import naflex  # noqa: E402

MODEL = dict(width=192, depth=4, num_heads=3, mlp_dim=768, patch_size=16)
SMOKE = dict(width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=4)
CLASSES = 10
# studies/naflex.py's SHAPES (h, w) and BUDGETS: its canvases and lengths at patch 4
STUDY_SHAPES = ((28, 84), (28, 56), (28, 42), (28, 28), (42, 28), (56, 28), (84, 28))
STUDY_LENGTHS = (16, 36, 64, 100, 147)
SIDES = (28, 42, 56, 84)
COMPILES: list[float] = []  # XLA's compile seconds, as jax.monitoring reports them


def _listen(event: str, seconds: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        COMPILES.append(seconds)


def naflex_batch(n: int, batch: int, patch: int, seed: int = 0) -> tuple[dict, float, int]:
    """(a NaFlex batch of `batch` random-aspect images put at n patches a row, its mean fill
    of n, its distinct grids). Sizes: a side of 4-8 grids' worth of pixels, aspect ratio
    log-uniform in 1:2 ... 2:1."""
    rng = np.random.default_rng(seed)
    out = naflex.empty(batch, n, patch)
    grids = []
    for j in range(batch):
        side = rng.uniform(1.0, 2.0) * math.isqrt(n) * patch
        ratio = math.exp(rng.uniform(-math.log(2), math.log(2)))  # height / width
        h, w = max(round(side * math.sqrt(ratio)), 1), max(round(side / math.sqrt(ratio)), 1)
        small = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), np.uint8)
        image = np.repeat(np.repeat(small, 8, 0), 8, 1)[:h, :w]  # blocky content, h x w
        grids.append(naflex.put(out, j, image, patch, flip=bool(j % 2)))
    fill = float(np.mean([gh * gw / n for gh, gw in grids]))
    return out, fill, len(set(grids))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.3g}"


def rate(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def labels(batch: int, seed: int = 0) -> np.ndarray:
    return np.eye(CLASSES, dtype=np.float32)[
        np.random.default_rng(seed).integers(0, CLASSES, batch)
    ]


class Trainer:
    """A state and the loop's jitted train step (training.state, step.jit_steps) for the
    model at `image_size` (the position table's grid), on one device."""

    def __init__(self, model_kw: dict, image_size: int):
        from vit_jax.configs import fashion_mnist
        from vit_jax.parallel import sharding
        from vit_jax.training import state as state_lib
        from vit_jax.training import step as step_lib

        c = fashion_mnist.get_config("tiny")
        c.model.update(**model_kw)
        c.image_size = image_size
        self.mesh = sharding.make_mesh(-1, 1, devices=jax.devices()[:1])
        model = state_lib.build_model(c.model, CLASSES)
        tx, lr_fn = state_lib.optimizer_of(c)
        start = state_lib.Start(seed=0, image_size=image_size)
        self.state, shardings = state_lib.create_state(start, model, tx, self.mesh)
        self.step, _ = step_lib.jit_steps(model, tx, lr_fn, self.mesh, shardings)
        self.split = sharding.batch_sharding(self.mesh)

    def put(self, batch: dict) -> dict:
        return jax.tree.map(lambda a: jax.device_put(a, self.split), batch)

    def __call__(self, batch: dict) -> float:
        """Seconds of one step (the state carried on: its buffers are donated)."""
        began = time.perf_counter()
        self.state, metrics = self.step(self.state, batch)
        jax.block_until_ready(metrics)
        return time.perf_counter() - began

    def first(self, batch: dict) -> tuple[float, float]:
        """(seconds of the first call at this shape, XLA's compile seconds within it)."""
        COMPILES.clear()
        took = self(batch)
        return took, sum(COMPILES)


def step_rows(args, model_kw: dict) -> None:
    """One row per length: the square and the NaFlex train step, their ratio, the compiles."""
    patch = model_kw["patch_size"]
    lengths = naflex.Lengths(tuple(args.seq_lens), args.tokens_per_batch, 1, 0)
    longest = math.isqrt(max(args.seq_lens)) * patch
    flex = Trainer(model_kw, longest)  # one state, one step for every length (as a run)
    jax.monitoring.register_event_duration_secs_listener(_listen)
    print(f"train step, {machine()}, load {os.getloadavg()[0]:.1f}, "
          f"ViT {model_kw['width']}x{model_kw['depth']} patch {patch}, float32, "
          f"{args.tokens_per_batch:,} patches a step, median of {args.repeats}")  # fmt: skip
    print("| N | batch | square: grid, ms | square: img/s, patches/s | NaFlex: fill, grids, ms | "
          "NaFlex: img/s, patches/s (real) | NaFlex / square (time) | first call s (XLA "
          "compile s): square, NaFlex |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    firsts = []
    for n in args.seq_lens:
        b, g = lengths.batch(n), math.isqrt(n)
        square = Trainer(model_kw, g * patch)
        rng = np.random.default_rng(n)
        images = rng.uniform(-1, 1, (b, g * patch, g * patch, 3)).astype(np.float32)
        sq_batch = square.put({"image": images, "label": labels(b)})
        x, fill, grids = naflex_batch(n, b, patch, seed=n)
        fx_batch = flex.put({"image": x, "label": labels(b)})
        sq_first, fx_first = square.first(sq_batch), flex.first(fx_batch)
        firsts.append(fx_first)
        for _ in range(args.warmup):
            square(sq_batch), flex(fx_batch)
        times = ([], [])
        for _ in range(args.repeats):
            times[0].append(square(sq_batch))
            times[1].append(flex(fx_batch))
        sq, fx = (statistics.median(t) for t in times)
        real = b * n * fill / fx
        print(f"| {n} | {b} | {g}x{g}, {ms(sq)} | {rate(b / sq)}, {b * n / sq:,.0f} | "
              f"{fill:.1%}, {grids}, {ms(fx)} | {rate(b / fx)}, {b * n / fx:,.0f} "
              f"({real:,.0f}) | {fx / sq:.3f} | {sq_first[0]:.1f} ({sq_first[1]:.1f}), "
              f"{fx_first[0]:.1f} ({fx_first[1]:.1f}) |", flush=True)  # fmt: skip
    jax.monitoring.unregister_event_duration_listener(_listen)
    print(f"\nNaFlex: one jitted step, {flex.step._cache_size()} compiled versions for "
          f"{len(args.seq_lens)} lengths; first calls {sum(f[0] for f in firsts):.1f} s, "
          f"XLA's compiles {', '.join(f'{f[1]:.1f}' for f in firsts)} s")  # fmt: skip


def padding(shapes, lengths, patch: int) -> list[tuple[int, float, float, float]]:
    """(N, mean, min, max) over `shapes` of the padding fraction 1 - gh*gw/N of a row."""
    rows = []
    for n in lengths:
        pads = []
        for h, w in shapes:
            gh, gw = (s // patch for s in naflex.size_for_sequence(h, w, patch, n))
            pads.append(1 - gh * gw / n)
        rows.append((n, float(np.mean(pads)), min(pads), max(pads)))
    return rows


def padding_rows(patch: int = 4) -> None:
    """The padding fraction per length on the study's canvases (and on all 16 pairs)."""
    study = padding(STUDY_SHAPES, STUDY_LENGTHS, patch)
    pairs = [(h, w) for h in SIDES for w in SIDES if max(h, w) <= 3 * min(h, w)]
    every = padding(pairs, STUDY_LENGTHS, patch)
    print(f"\npadding of a row, patch {patch}: studies/naflex.py's {len(STUDY_SHAPES)} canvas "
          f"shapes (28x84 ... 84x28), and all {len(pairs)} h x w in {SIDES}")  # fmt: skip
    print("| N | study canvases: mean padding | min - max | grids (28x84, 28x28, 84x28) | "
          f"{len(pairs)} canvases: mean padding |")  # fmt: skip
    print("|---|---|---|---|---|")
    for (n, mean, lo, hi), (_, mean16, _, _) in zip(study, every, strict=True):
        grids = [tuple(s // patch for s in naflex.size_for_sequence(h, w, patch, n))
                 for h, w in ((28, 84), (28, 28), (84, 28))]  # fmt: skip
        cells = ", ".join(f"{gh}x{gw}" for gh, gw in grids)
        print(f"| {n} | {mean:.1%} | {lo:.1%} - {hi:.1%} | {cells} | {mean16:.1%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq_lens", default="64,144,256", help="N, comma-separated squares")
    ap.add_argument("--tokens_per_batch", type=int, default=4096, help="patches a step")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps of each")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps after the first")
    ap.add_argument("--padding_only", action="store_true", help="the padding table alone")
    ap.add_argument("--smoke", action="store_true", help="a tiny model at N = 16, 36")
    args = ap.parse_args()
    if args.smoke:
        args.seq_lens, args.tokens_per_batch, args.repeats = "16,36", 576, 2
    args.seq_lens = [int(n) for n in args.seq_lens.split(",")]
    if not args.padding_only:
        step_rows(args, SMOKE if args.smoke else MODEL)
    padding_rows()


if __name__ == "__main__":
    main()
