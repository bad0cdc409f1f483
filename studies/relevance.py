"""Study 6: are the relevance maps faithful, and class-specific? (issue 43)

For each test image, the target is the model's predicted class. The 25% of patches its
map ranks highest are greyed (set to 0, mid-grey in [-1, 1]) and the drop of the target's
logit is measured; the same for 25% of patches drawn at random, many times, whose median
drop is the baseline (the drops are skewed: a mean would favour any map). A map is
faithful on an image when greying its patches lowers the logit more than that median.
Maps: relevance (Chefer et al. 2021, inspection/relevance.py), attention rollout
(inspection/attention.py). Class-specificity: the correlation between an image's
relevance maps for its two most probable classes (rollout's are the same map). Cost:
relevance for a batch against one forward and backward pass of it.

    python studies/lora.py --seeds=0 --workdir=workdirs/study_lora   # the two models
    python studies/relevance.py --checkpoint=workdirs/study_lora/pretrain/final.npz \\
        --checkpoint=workdirs/study_lora/full/seed_0/final.npz --classes_of=0-4 --classes_of=5-9

Prints one Markdown row per checkpoint and writes --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

FRACTION, DRAWS = 0.25, 50


def greyed(images: np.ndarray, order: np.ndarray, grid: tuple[int, int], k: int) -> np.ndarray:
    """`images` with the first `k` patches of each image's `order` set to 0."""
    n, h, w, _ = images.shape
    mask = np.ones((n, grid[0] * grid[1]), np.float32)
    np.put_along_axis(mask, order[:, :k], 0.0, axis=1)
    mask = mask.reshape(n, *grid).repeat(h // grid[0], 1).repeat(w // grid[1], 2)
    return images * mask[..., None]


def study(path: str, classes: tuple[int, ...], num_images: int, seed: int = 0) -> dict:
    import jax

    from vit_jax import data, inspection, weights
    from vit_jax.models import predict

    loaded = weights.load(path)
    model, params, size = loaded.model, loaded.params, loaded.image_size
    cfg = data.default_config()
    cfg.update(preprocessing=loaded.preprocessing, classes=classes)
    with data.eval_iterator(
        cfg,
        f"test[:{num_images}]",
        global_batch=num_images,
        image_size=size,
        process_index=0,
        process_count=1,
    ) as batches:
        batch = next(batches)  # the first test images of the model's classes
    x = batch["image"][batch["mask"] > 0]
    logits_fn = predict.logits_fn(model)
    logit = lambda images: np.asarray(predict.map_batches(logits_fn, params, images, 64))
    base = logit(x)
    top2 = np.argsort(-base, axis=-1)[:, :2]
    target, rows = top2[:, 0], np.arange(len(x))
    grid = model.grid(size)
    k = round(FRACTION * grid[0] * grid[1])
    inspection.relevance(model, params, x[:32], top2[:32], batch_size=32)  # compiled
    began = time.time()
    rel = inspection.relevance(model, params, x, top2, batch_size=32)  # [N, 2, gh, gw]
    seconds = time.time() - began
    _, rollout = inspection.analyse_images(model, params, x, batch_size=32)
    drop = lambda order: base[rows, target] - logit(greyed(x, order, grid, k))[rows, target]
    by_map = lambda maps: np.argsort(-maps.reshape(len(x), -1), axis=1)
    rng = np.random.default_rng(seed)
    random = np.stack([drop(rng.permuted(np.tile(np.arange(grid[0] * grid[1]), (len(x), 1)),
                                         axis=1)) for _ in range(DRAWS)])  # fmt: skip
    median = np.median(random, axis=0)
    out = {"checkpoint": path, "images": len(x), "patches_greyed": k, "grid": list(grid)}
    for name, maps in (("relevance", rel[:, 0]), ("rollout", rollout)):
        d = drop(by_map(maps))
        out[name] = {"beats_random": float((d > median).mean()), "mean_drop": float(d.mean())}
    out["random"] = {"mean_drop": float(random.mean()), "median_drop": float(median.mean())}
    a, b = (rel[:, i].reshape(len(x), -1) for i in (0, 1))
    out["class_correlation"] = float(
        np.mean([np.corrcoef(u, v)[0, 1] for u, v in zip(a, b, strict=True)])
    )
    out["top2_identical"] = float(np.mean([np.allclose(u, v) for u, v in zip(a, b, strict=True)]))

    grad = jax.jit(jax.grad(lambda p, im: predict.logits(model, p, im)[:, 0].sum()))
    batch = x[:32]
    jax.block_until_ready(grad(params, batch))
    t = time.time()
    jax.block_until_ready(grad(params, batch))
    out["relevance_seconds_per_image"] = seconds / len(x)
    out["forward_backward_seconds_per_image"] = (time.time() - t) / len(batch)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", action="append", required=True)
    p.add_argument("--classes_of", action="append", help="e.g. 0-4: the model's classes")
    p.add_argument("--num_images", type=int, default=500)
    p.add_argument("--out", default="relevance_study.json")
    args = p.parse_args()
    results = []
    print(
        "| model | images | relevance beats random | rollout beats random | mean logit drop: "
        "relevance / rollout / random (median) | correlation of the top-2 classes' maps | "
        "seconds an image: relevance (2 classes) / forward+backward |"
    )
    print("|---|---|---|---|---|---|---|")
    for i, path in enumerate(args.checkpoint):
        lo, hi = map(int, (args.classes_of[i] if args.classes_of else "0-9").split("-"))
        r = study(path, tuple(range(lo, hi + 1)), args.num_images)
        results.append(r)
        rel, roll, rnd = r["relevance"], r["rollout"], r["random"]
        print(f"| {path} | {r['images']} | {rel['beats_random']:.0%} | {roll['beats_random']:.0%} "
              f"| {rel['mean_drop']:.3f} / {roll['mean_drop']:.3f} / {rnd['median_drop']:.3f} | "
              f"{r['class_correlation']:.2f} | {r['relevance_seconds_per_image'] * 1e3:.1f} ms / "
              f"{r['forward_backward_seconds_per_image'] * 1e3:.1f} ms |", flush=True)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
