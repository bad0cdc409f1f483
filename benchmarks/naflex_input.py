"""NaFlex preprocessing against the square pipeline's, per image on one core.

    python benchmarks/naflex_input.py                  # the three kinds + the pipeline row
    python benchmarks/naflex_input.py --jpegs=64 --repeats=7
    python benchmarks/naflex_input.py --smoke          # a few images, one pass: it runs

Each kind is the work a training example costs, timed per example function, in this
process pinned to one core (os.sched_setaffinity; OpenMP/OpenBLAS/OpenCV on one thread):

  square  pixels.decode_crop_resize(bytes, (S, S), 'tf_bilinear', window) +
          pixels.normalize: simplejpeg's decode, OpenCV's bilinear (no antialiasing)
  NaFlex  pixels.decode(bytes, 'tf_bilinear'), the same window sliced, naflex.put: the
          size search, the antialiased resize (tf.image.resize(antialias=True)'s numerics
          in NumPy), [-1, 1], the patches into a batch row

on JPEGs of 375x500 and 480x640 (smooth random content, quality 90, made with PIL in a
temporary directory) at 224 px against seq_len 196 at patch 16 (a 14 x 14 grid for a
square), and on 28x84 uint8 gray arrays (Fashion-MNIST-like, no decode) at 32 px against
seq_len 64 at patch 4. Every image gets its Inception window (augment.crop_window, from
seeded uniforms, dataset.crop_min_area's default); both sides crop the same windows.
The size search's cache (4,096 sizes) is cleared before every NaFlex example of a JPEG:
training windows of photos rarely repeat a size; the 28 x 84 arrays have fewer window sizes
than that, and keep it (their search column: a cache hit). The split of NaFlex's time
times each stage alone over the same images; the patchify column is naflex.put of the
image already at its size (its search cached, its resize only the float conversion):
[-1, 1] and the patches into the row.

When the pipeline takes NaFlex configs (dataset.naflex.seq_lens), a last row times
`train_iterator` end to end on one thread over a folder of those JPEGs (half of each
size), batch 32 at 224 px against seq_len 196 (tokens_per_batch 32 x 196: batch 32).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy loads its BLAS

import argparse  # noqa: E402
import inspect  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vit_jax.data import augment, naflex, pixels  # noqa: E402

# kind: (image (h, w) or None for arrays, square side, patch, seq_len)
KINDS = {
    "jpeg 375x500": ((375, 500), 224, 16, 196),
    "jpeg 480x640": ((480, 640), 224, 16, 196),
    "array 28x84": ((28, 84), 32, 4, 64),
}


def smooth_image(rng: np.random.Generator, hw: tuple[int, int], channels: int = 3):
    """Smooth random content (a 10x upscale of noise): it compresses like a photo."""
    from PIL import Image

    small = rng.integers(0, 256, (max(hw[0] // 10, 2), max(hw[1] // 10, 2), channels), np.uint8)
    image = Image.fromarray(small if channels == 3 else small[..., 0])
    return image.resize(hw[::-1], Image.BILINEAR)


def jpeg_bytes(rng: np.random.Generator, hw: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    smooth_image(rng, hw).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def examples(kind: str, n: int, seed: int = 0) -> list[tuple[object, tuple]]:
    """n (source, window): JPEG bytes (files written to a temporary directory, read back)
    or uint8 [28, 84, 1] arrays, each with its Inception window."""
    from vit_jax.data import default_config

    hw, min_area = KINDS[kind][0], default_config().crop_min_area
    rng = np.random.default_rng(seed)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            if kind.startswith("jpeg"):
                path = os.path.join(tmp, f"{i:05d}.jpg")
                with open(path, "wb") as f:
                    f.write(jpeg_bytes(rng, hw))
                with open(path, "rb") as f:
                    source = f.read()
            else:
                source = np.asarray(smooth_image(rng, hw, channels=1))[..., None]
            u = augment.step_draws(seed, 0, n)[i]
            out.append((source, augment.crop_window(*hw, u, min_area)))
    return out


def square(source, window, side: int) -> np.ndarray:
    image = source if isinstance(source, np.ndarray) else pixels.decode(source, "tf_bilinear")
    x = pixels.resize(
        image, (side, side), "tf_bilinear", window(*image.shape[:2]) if callable(window) else window
    )
    return pixels.normalize(x, in_place=True)


def decode(source) -> np.ndarray:
    return source if isinstance(source, np.ndarray) else pixels.decode(source, "tf_bilinear")


def crop(image: np.ndarray, window) -> np.ndarray:
    y0, x0, h, w = window
    return image[y0 : y0 + h, x0 : x0 + w]


def flex(source, window, out: dict, patch: int, fresh: bool) -> None:
    if fresh:  # a window whose size the cache has not seen: searched
        naflex.size_for_sequence.cache_clear()
    naflex.put(out, 0, crop(decode(source), window), patch)


def best_seconds(fn, items, repeats: int) -> float:
    """The fastest of `repeats` passes of fn over items, seconds an item."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for item in items:
            fn(*item)
        best = min(best, time.perf_counter() - start)
    return best / len(items)


def measure(kind: str, n: int, repeats: int) -> dict:
    """Seconds an image: square, NaFlex, and NaFlex's stages alone."""
    _, side, patch, seq_len = KINDS[kind]
    items = examples(kind, n)
    out = naflex.empty(1, seq_len, patch)
    crops = [(crop(decode(s), w),) for s, w in items]
    sizes = [naflex.size_for_sequence(c.shape[0], c.shape[1], patch, seq_len) for (c,) in crops]
    at_size = [
        (pixels.to_uint8(naflex.resize(c, z)),) for (c,), z in zip(crops, sizes, strict=True)
    ]
    fresh = kind.startswith("jpeg")  # arrays: every 28x84 window fits the cache
    search = naflex.size_for_sequence if not fresh else naflex.size_for_sequence.__wrapped__
    t = {}
    for _ in range(2):  # interleaved twice: drift on the machine falls on both sides
        for name, fn, args in (
            ("square", lambda s, w: square(s, w, side), items),
            ("naflex", lambda s, w: flex(s, w, out, patch, fresh), items),
            ("decode", decode, [(s,) for s, _ in items]),
            ("search", lambda c: search(c.shape[0], c.shape[1], patch, seq_len), crops),
            ("resize", naflex.resize, [(c, z) for (c,), z in zip(crops, sizes, strict=True)]),
            ("patchify", lambda x: naflex.put(out, 0, x, patch), at_size),
            ("square_resize", lambda c: pixels.resize(c, (side, side), "tf_bilinear"), crops),
        ):
            t[name] = min(t.get(name, float("inf")), best_seconds(fn, args, repeats))
    if not kind.startswith("jpeg"):
        t["decode"] = 0.0  # arrays in memory: the 'decode' is the identity
    return t


def naflex_pipeline() -> bool:
    """Whether this tree's pipeline takes NaFlex configs."""
    from vit_jax import data
    from vit_jax.data import pipeline

    params = inspect.signature(pipeline.train_iterator).parameters
    return "naflex" in data.default_config() and "patch_size" in params


def end_to_end(n: int, batches: int, batch: int = 32) -> dict:
    """Images/s of train_iterator on one thread: square 224 px, NaFlex seq_len 196."""
    from vit_jax import data

    rng = np.random.default_rng(1)
    rates = {}
    with tempfile.TemporaryDirectory() as root:
        for split, count in (("train", n), ("test", 2)):
            for i in range(count):
                d = os.path.join(root, split, f"class_{i % 2}")
                os.makedirs(d, exist_ok=True)
                hw = KINDS["jpeg 375x500" if i % 2 else "jpeg 480x640"][0]
                with open(os.path.join(d, f"{i:05d}.jpg"), "wb") as f:
                    f.write(jpeg_bytes(rng, hw))
        for name in ("square", "naflex"):
            cfg = data.default_config()
            cfg.source, cfg.data_dir, cfg.threads, cfg.workers = "folder", root, 1, 0
            extra = {}
            if name == "naflex":
                cfg.naflex.seq_lens, cfg.naflex.tokens_per_batch = (196,), batch * 196
                extra = dict(patch_size=16, batch_multiple=1)
            common = dict(global_batch=batch, image_size=224, seed=0, process_index=0)
            it = data.train_iterator(cfg, process_count=1, **common, **extra)
            try:
                next(it)  # the pool started, the first batch in flight
                start, images = time.perf_counter(), 0
                for _ in range(batches):
                    b = next(it)
                    images += len(b["label"])
                rates[name] = images / (time.perf_counter() - start)
            finally:
                it.close()
    return rates


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jpegs", type=int, default=32, help="images of each kind")
    parser.add_argument("--repeats", type=int, default=5, help="passes; the fastest counts")
    parser.add_argument("--batches", type=int, default=8, help="end-to-end batches timed")
    parser.add_argument("--smoke", action="store_true", help="4 images, 1 pass, 1 batch")
    args = parser.parse_args(argv)
    if args.smoke:
        args.jpegs, args.repeats, args.batches = 4, 1, 1
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    pixels.cv2()  # OpenCV on one thread

    print(f"one core (cpu {core}), {args.jpegs} images a kind, best of {args.repeats} passes")
    print("| kind | square img/s | NaFlex img/s | NaFlex / square | NaFlex us/img: decode | "
          "size search | resize | patchify | square resize us |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in KINDS:
        t = measure(kind, args.jpegs, args.repeats)
        us = {k: v * 1e6 for k, v in t.items()}
        _, side, patch, seq_len = KINDS[kind]
        print(
            f"| {kind}, {side} px vs seq_len {seq_len}/{patch} | {1 / t['square']:.0f} | "
            f"{1 / t['naflex']:.0f} | {t['square'] / t['naflex']:.2f} | {us['decode']:.0f} | "
            f"{us['search']:.0f} | {us['resize']:.0f} | {us['patchify']:.0f} | "
            f"{us['square_resize']:.0f} |"
        )
    if naflex_pipeline():
        rates = end_to_end(max(args.jpegs, 8), args.batches, batch=8 if args.smoke else 32)
        print(
            f"| train_iterator, 1 thread, JPEG folder | {rates['square']:.0f} | "
            f"{rates['naflex']:.0f} | {rates['naflex'] / rates['square']:.2f} | | | | | |"
        )
    else:
        print("(the pipeline takes no dataset.naflex here: no end-to-end row)")


if __name__ == "__main__":
    main()
