"""Input-pipeline throughput: Grain against tf.data doing the same work, and against the
bound of its own per-image work; the training crop's decode alone against a whole decode.

    python benchmarks/input_pipeline.py                       # every case, 1 and 2 cores
    python benchmarks/input_pipeline.py --cases=jpeg224 --jpeg_size=480x640
    python benchmarks/input_pipeline.py --baseline=none       # this tree only
    python benchmarks/input_pipeline.py --preprocessing=pil_antialias  # the other resize
    python benchmarks/input_pipeline.py --augreg --cases=jpeg224,idx32 --cores=1
                                    # each AugReg preset's setting (mixup + RandAugment) per core

Cases: the embedded Fashion-MNIST idx files (in memory, 28x28 gray) at 32 and 56 px,
global batch 256; a folder of JPEGs (300x400, generated) at 224 px with Inception crop
and flip, batch 32 (training); the same JPEGs resized whole to 384 px, batch 32
(evaluation). Each (pipeline, case, cores) runs in its own process pinned to that many
cores (os.sched_setaffinity): Grain with that many threads ('threads'), or that many
worker processes ('workers'), or a hand-written thread pool in Grain's place ('pool');
tf.data with its own autotuning on those cores.

The training case runs once per `dataset.decode` of --decodes, and tf.data does the same
work in each: the pipeline of commit --baseline (default c6b96ae, the last one that had
it, taken from git into a temporary directory) decodes the window alone for 'crop'
(tf.image.decode_and_crop_jpeg, as big_vision's decode_jpeg_and_inception_crop), and for
'full' decodes the whole file and slices the window (tf.io.decode_image, tf.slice: the
original vit_jax's input_pipeline.py). The bound: the per-image work alone (idx: the
batched crop + resize + flip; JPEG: read + decode + crop + resize + flip), timed on one
core, times the cores. The decode alone: on one core, `decode_crop` of an Inception window
of each file against simplejpeg's decode of the whole file (the integer-fast DCT of both).

--augreg times Grain (threads) with each setting of the AugReg presets (their mixup,
RandAugment and decode, vit_jax/configs/augreg.py) and prints images/s per core against
no augmentation and the cores needed per 1,000 images/s.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    "idx32": ("idx", 32, 256),
    "idx56": ("idx", 56, 256),
    "jpeg224": ("folder", 224, 32),
    "eval384": ("folder", 384, 32),
}


def make_jpeg_folder(root: str, num_images: int, size=(300, 400), num_classes: int = 4) -> None:
    size = tuple(size)
    """root/{train,test}/class_k/*.jpg: smooth random RGB images (they compress like photos)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", num_images), ("test", num_classes)):
        for i in range(n):
            class_dir = os.path.join(root, split, f"class_{i % num_classes}")
            os.makedirs(class_dir, exist_ok=True)
            small = rng.integers(0, 256, (size[0] // 10, size[1] // 10, 3), np.uint8)
            image = Image.fromarray(small).resize(size[::-1], Image.BILINEAR)
            image.save(os.path.join(class_dir, f"{i:05d}.jpg"), quality=90)


def config(case: str, folder: str, preprocessing: str = "", decode: str = "full"):
    from vit_jax import data

    cfg = data.default_config()
    if CASES[case][0] == "folder":
        cfg.source, cfg.data_dir = "folder", folder
    if preprocessing:
        cfg.preprocessing = preprocessing
    if "decode" in cfg:  # the tf.data tree has none
        cfg.decode = decode
    return cfg


def batches(cfg, case: str, seed: int = 0):
    """The case's batches without end: training batches, or evaluation passes again and
    again over the train split (eval384)."""
    from vit_jax import data

    _, size, batch = CASES[case]
    common = dict(global_batch=batch, image_size=size, process_index=0, process_count=1)
    if case != "eval384":
        yield from data.train_iterator(cfg, seed=seed, **common)
    while True:  # tf.data's eval_iterator (the baseline) is a generator, Grain's closes
        yield from data.eval_iterator(cfg, cfg.train_split, **common)


def worker(args) -> None:
    """One timing, in this process (pinned by the parent): prints {"ips": images/s}."""
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))

    _, size, batch = CASES[args.case]
    cfg = config(args.case, args.folder, args.preprocessing, args.decode)
    if args.impl == "grain":
        cfg.threads = args.cores if args.mode in ("threads", "pool") else 1
        cfg.workers = args.cores if args.mode == "workers" else 0
    elif args.decode == "full":
        slice_whole_decode()
    if args.mode == "pool":  # a hand-written thread pool in place of Grain's prefetch
        from vit_jax.data import pipeline

        pipeline.Batches = HandPool
    if args.setting:  # the preset's own dataset fields, not copies of them
        from vit_jax.configs import augreg

        preset = augreg.get_config(f"b16,imagenet2012,{args.setting}").dataset
        cfg.mixup, cfg.randaugment, cfg.decode = preset.mixup, preset.randaugment, preset.decode
    it = batches(cfg, args.case)
    for _ in range(args.warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(args.batches):
        out = next(it)
    elapsed = time.perf_counter() - start
    assert out["image"].shape == (batch, size, size, 3)
    print(json.dumps({"ips": args.batches * batch / elapsed}))


def slice_whole_decode() -> None:
    """The baseline tf.data pipeline's training crop sliced from the whole decoded file (the
    original vit_jax's tf.io.decode_jpeg + tf.slice), not decoded alone
    (tf.image.decode_and_crop_jpeg): what dataset.decode='full' does."""
    from vit_jax.data import preprocess  # the baseline tree's (PYTHONPATH)

    crop = preprocess.random_crop
    preprocess.random_crop = lambda image, seed, area: crop(preprocess.decode(image), seed, area)


class HandPool:
    """`pipeline.Batches` done by a hand-written thread pool (the pipeline's own until
    Grain's `ReadOptions` threads measured as fast): what Grain's prefetch is measured
    against."""

    def __init__(self, make, indices: range, threads: int, workers: int):
        import collections
        import concurrent.futures

        self._make, self._indices, self._ahead = make, iter(indices), 2 * threads
        self._pool = concurrent.futures.ThreadPoolExecutor(threads)
        self._queue = collections.deque()
        self._fill()

    def _fill(self) -> None:
        while len(self._queue) < self._ahead and (i := next(self._indices, None)) is not None:
            self._queue.append(self._pool.submit(self._make, i))

    def __iter__(self):
        return self

    def __next__(self):
        if not self._queue:
            raise StopIteration
        batch = self._queue.popleft().result()
        self._fill()
        return batch

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def one_core():
    """This process pinned to one core for the block (the workers started after it inherit
    the process's cores)."""
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {sorted(cores)[0]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def bound(case: str, folder: str, preprocessing: str, decode: str, repeats: int = 3) -> float:
    """Images/s of the per-image work alone, on one core (the best of `repeats`)."""
    from vit_jax.data import augment, pixels, tables

    _, size, batch = CASES[case]
    cfg = config(case, folder, preprocessing, decode)
    table = tables.open_table(cfg, cfg.train_split)
    draws = augment.step_draws(0, 0, batch)
    index = np.arange(batch) % len(table)
    best = float("inf")
    with one_core():
        for _ in range(repeats):
            start = time.perf_counter()
            if table.images is not None:  # what the pipeline does for in-memory images
                h, w = table.images.shape[1:3]
                boxes = [augment.crop_window(h, w, u, cfg.crop_min_area) for u in draws]
                out = pixels.resize_batch(table.images[index], boxes, (size, size), preprocessing)
                mirror = draws[:, -1] < 0.5
                out[mirror] = out[mirror, :, ::-1]
            for i, u in zip(index, draws, strict=True) if table.images is None else ():
                crop = functools.partial(augment.crop_window, u=u, min_area=cfg.crop_min_area)
                window = None if case == "eval384" else crop
                load = (table, int(i), (size, size), preprocessing, window)
                image, _ = tables.load(*load, crop=decode == "crop")
                if case != "eval384" and u[-1] < 0.5:
                    image = image[:, ::-1]
            best = min(best, time.perf_counter() - start)
    return batch / best


def decode_alone(folder: str, repeats: int) -> dict[str, float]:
    """Images/s on one core (the median of `repeats` passes over the training files) of
    the training crop's decode: `decode_crop` of an Inception window of each file, and
    simplejpeg's decode of the whole file, both with the integer-fast DCT."""
    import simplejpeg

    from vit_jax.data import augment, crop_decode

    files = [entry.read_bytes() for entry in sorted(pathlib.Path(folder, "train").glob("*/*.jpg"))]
    draws = augment.step_draws(0, 0, len(files))
    windows = [functools.partial(augment.crop_window, u=u, min_area=0.05) for u in draws]
    timed = {  # each result dropped at once, as in the pipeline
        "crop": crop_decode.decode_crop,
        "whole": lambda data, _: simplejpeg.decode_jpeg(data, fastdct=True),
    }
    out = {}
    with one_core():
        for name, decode in timed.items():
            runs = []
            for _ in range(repeats):
                start = time.perf_counter()
                for data, window in zip(files, windows, strict=True):
                    decode(data, window)
                runs.append(len(files) / (time.perf_counter() - start))
            out[name] = float(np.median(runs))
    return out


def cell(args, columns: list[tuple], case: str, cores: int, decode: str) -> dict:
    """Median images/s of each (name, impl, mode, PYTHONPATH) column over --repeats runs,
    each in a fresh process (one run varies by up to 2x on a shared virtual machine), the
    columns taking turns run by run so that a burst of other work falls on all alike; and
    the highest 1-minute load average seen after a run ('load')."""
    runs, loads = {name: [] for name, *_ in columns}, []
    for _ in range(args.repeats):
        for name, impl, mode, path in columns:
            runs[name].append(_run_once(args, impl, case, cores, mode, path, decode))
            loads.append(os.getloadavg()[0])
    return {name: float(np.median(ips)) for name, ips in runs.items()} | {"load": max(loads)}


def _run_once(args, impl: str, case: str, cores: int, mode: str, path: str, decode: str):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"--impl={impl}"]
    cmd += [f"--case={case}", f"--cores={cores}", f"--mode={mode}", f"--folder={args.folder}"]
    cmd += [f"--batches={args.batches}", f"--warmup={args.warmup}", f"--decodes={decode}"]
    cmd += [f"--preprocessing={args.preprocessing}"]
    cmd += [f"--setting={setting}"] if (setting := getattr(args, "setting", "")) else []
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    if proc.returncode:
        raise RuntimeError(f"{impl} {case} on {cores} cores failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["ips"]


def baseline_tree(rev: str, into: str) -> str | None:
    """The vit_jax package of commit `rev`, extracted into `into`; None if git cannot."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", rev, "vit_jax"], capture_output=True, check=False
    )
    if archive.returncode:
        print(f"baseline {rev}: {archive.stderr.decode().strip()}; tf.data not timed")
        return None
    os.makedirs(into, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"subset of {list(CASES)}")
    parser.add_argument("--cores", default="1,2", help="core counts to pin to")
    parser.add_argument("--decodes", default="full,crop", help="dataset.decode of jpeg224")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=8, help="untimed batches per run")
    parser.add_argument("--jpegs", type=int, default=256, help="JPEGs in the generated folder")
    parser.add_argument("--jpeg_size", default="300x400", help="their HxW, e.g. 375x500")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (median)")
    parser.add_argument("--baseline", default="c6b96ae", help="commit with tf.data, or none")
    parser.add_argument(
        "--preprocessing", default="tf_bilinear", help="tf_bilinear or pil_antialias"
    )
    parser.add_argument("--augreg", action="store_true", help="time each AugReg setting")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setting", default="", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="grain", help=argparse.SUPPRESS)
    parser.add_argument("--case", default="idx32", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="threads", help=argparse.SUPPRESS)
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.cores, args.decode = int(args.cores), args.decodes
        return worker(args)

    cases, cores = args.cases.split(","), [int(c) for c in args.cores.split(",")]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; expected some of {list(CASES)}")
    if set(args.decodes.split(",")) - {"full", "crop"}:
        parser.error(f"--decodes: {args.decodes!r} is not a subset of full,crop")
    here = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    if args.augreg:
        return augreg_costs(args, cases, cores, here)
    with tempfile.TemporaryDirectory() as tmp:
        args.folder = os.path.join(tmp, "jpegs")
        make_jpeg_folder(args.folder, args.jpegs, map(int, args.jpeg_size.split("x")))
        old = None if args.baseline == "none" else baseline_tree(args.baseline, tmp + "/old")
        rows = timings(args, cases, cores, here, old)
        alone = decode_alone(args.folder, args.repeats) if "jpeg224" in cases else None
    print_table(args, rows, alone)


def timings(args, cases: list[str], cores: list[int], here: str, old: str | None) -> list:
    """A row per (case, decode, cores): Grain's modes, tf.data, the bound, the load."""
    columns = [(mode, "grain", mode, here) for mode in ("threads", "workers", "pool")]
    columns += [("tfdata", "tfdata", "-", old)] if old else []
    rows = []
    for case in cases:
        for decode in args.decodes.split(",") if case == "jpeg224" else ["full"]:
            one_core = bound(case, args.folder, args.preprocessing, decode)
            for n in cores:
                row = dict(case=case, decode=decode if case == "jpeg224" else "-", cores=n)
                row |= cell(args, columns, case, n, decode) | {"bound": one_core * n}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def print_table(args, rows: list[dict], alone: dict | None) -> None:
    print(
        f"\nimages/s, median of {args.repeats} runs of {args.batches} batches after {args.warmup}"
    )
    print("bound = the per-image work alone on one core x cores")
    print(f"preprocessing {args.preprocessing}; tf.data = commit {args.baseline}'s, same decode")
    print("ratios: Grain (the better of threads and workers) over tf.data and over the bound;")
    print("pool = a hand-written thread pool in place of Grain's ReadOptions threads;")
    print("load = the highest 1-minute load average after a run of the cell (its own add ~cores)")
    header = (
        f"{'case':<8} {'decode':>6} {'cores':>5} {'tf.data':>8} {'threads':>8} {'workers':>8} "
        f"{'pool':>9} {'bound':>8} {'vs tf.data':>10} {'vs bound':>9} {'load':>5}"
    )
    print(header + "\n" + "-" * len(header))
    for r in rows:
        best = max(r["threads"], r["workers"])
        tf_cell = f"{r['tfdata']:>8.0f}" if "tfdata" in r else f"{'-':>8}"
        ratio = f"{best / r['tfdata']:>10.2f}" if "tfdata" in r else f"{'-':>10}"
        print(
            f"{r['case']:<8} {r['decode']:>6} {r['cores']:>5} {tf_cell} {r['threads']:>8.0f} "
            f"{r['workers']:>8.0f} {r['pool']:>9.0f} {r['bound']:>8.0f} {ratio} "
            f"{best / r['bound']:>9.2f} {r['load']:>5.1f}"
        )
    if alone:
        print(
            f"\ndecode alone ({args.jpeg_size} JPEGs, one core, images/s): decode_crop of "
            f"Inception windows {alone['crop']:.0f}, simplejpeg whole {alone['whole']:.0f}, "
            f"ratio {alone['crop'] / alone['whole']:.2f}"
        )


def augreg_costs(args, cases: list[str], cores: list[int], pythonpath: str) -> None:
    """Grain's images/s per core with each AugReg setting, against no augmentation."""
    from vit_jax.configs import augreg

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        args.folder = os.path.join(tmp, "jpegs")
        make_jpeg_folder(args.folder, args.jpegs, map(int, args.jpeg_size.split("x")))
        for case in cases:
            for n in cores:
                for setting in augreg.SETTINGS:
                    args.setting = setting
                    column = ("ips", "grain", "threads", pythonpath)
                    ips = cell(args, [column], case, n, "full")["ips"]  # decode: the preset's
                    rows.append(dict(case=case, cores=n, setting=setting, ips=ips))
                    print(json.dumps(rows[-1]), flush=True)
    print(f"\nGrain (threads) with each AugReg setting, {args.batches} timed batches")
    header = f"{'case':<8} {'cores':>5} {'setting':<8} {'images/s':>9} {'per core':>9} "
    header += f"{'vs none':>8} {'cores per 1k img/s':>19}"
    print(header + "\n" + "-" * len(header))
    for r in rows:
        none = next(x["ips"] for x in rows if x["case"] == r["case"] and x["cores"] == r["cores"])
        per_core = r["ips"] / r["cores"]
        print(
            f"{r['case']:<8} {r['cores']:>5} {r['setting']:<8} {r['ips']:>9.0f} {per_core:>9.0f} "
            f"{r['ips'] / none:>8.2f} {1000 / per_core:>19.1f}"
        )


if __name__ == "__main__":
    main()
