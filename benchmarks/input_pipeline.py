"""Training input-pipeline throughput: images/s of vit_jax.data.train_iterator.

Cases: (a) the embedded Fashion-MNIST idx source (in memory, 28x28 gray) at 32 and 56 px
with global batch 256; (b) a folder of random 300x400 JPEGs (generated in a temp dir)
at 224 px with batch 32. Each case runs a warm-up, then times --batches batches.

    python benchmarks/input_pipeline.py                 # all cases
    python benchmarks/input_pipeline.py --batches 100 --cases idx32,folder224

Per core = images/s divided by the CPU cores this process may use (os.sched_getaffinity).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def make_jpeg_folder(root: str, num_images: int, size=(300, 400), num_classes: int = 4) -> None:
    """root/{train,test}/class_k/*.jpg: random RGB images of size (height, width)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", num_images), ("test", num_classes)):
        for i in range(n):
            class_dir = os.path.join(root, split, f"class_{i % num_classes}")
            os.makedirs(class_dir, exist_ok=True)
            # Smooth random images compress like photos, unlike white noise.
            small = rng.integers(0, 256, (size[0] // 10, size[1] // 10, 3), np.uint8)
            image = Image.fromarray(small).resize(size[::-1], Image.BILINEAR)
            image.save(os.path.join(class_dir, f"{i:05d}.jpg"), quality=90)


def time_case(cfg, *, global_batch: int, image_size: int, warmup: int, batches: int) -> float:
    """Images/s of the train iterator after `warmup` batches."""
    from vit_jax import data

    iterator = data.train_iterator(
        cfg,
        global_batch=global_batch,
        image_size=image_size,
        seed=0,
        process_index=0,
        process_count=1,
    )
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
    elapsed = time.perf_counter() - start
    assert batch["image"].shape == (global_batch, image_size, image_size, 3)
    return batches * global_batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50, help="timed batches per case")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches per case")
    parser.add_argument(
        "--cases",
        default="idx32,idx56,folder224",
        help="comma-separated subset of idx32,idx56,folder224",
    )
    parser.add_argument("--jpegs", type=int, default=256, help="JPEGs in the generated folder")
    args = parser.parse_args()

    from vit_jax import data

    cores = len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            cfg = data.default_config()
            if case.startswith("idx"):
                source, batch, size = "Fashion-MNIST idx (in memory)", 256, int(case[3:])
            elif case == "folder224":
                make_jpeg_folder(tmp, args.jpegs)
                cfg.source, cfg.data_dir = "folder", tmp
                source, batch, size = f"JPEG folder, {args.jpegs} x 300x400", 32, 224
            else:
                raise ValueError(
                    f"--cases: unknown case {case!r}; expected idx32, idx56, folder224."
                )
            rate = time_case(
                cfg, global_batch=batch, image_size=size, warmup=args.warmup, batches=args.batches
            )
            rows.append((source, size, batch, rate, rate / cores))

    print(f"\ntrain_iterator throughput, {cores} CPU cores, {args.batches} timed batches per case")
    header = f"{'source':<34} {'size':>5} {'batch':>6} {'images/s':>10} {'per core':>10}"
    print(header)
    print("-" * len(header))
    for source, size, batch, rate, per_core in rows:
        print(f"{source:<34} {size:>5} {batch:>6} {rate:>10.0f} {per_core:>10.0f}")


if __name__ == "__main__":
    main()
