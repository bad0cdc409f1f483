"""Time converting a checkpoint to every format, and running the ONNX and SavedModel
exports (images/s) beside the JAX model.

    python benchmarks/convert.py [--model=ViT-B_16] [--image_size=224] [--batch=8]

The checkpoint is the variant with random parameters written as .npz (the published
files have the same shapes), so the figures need no download. Each format is converted
from that .npz by `vit_jax.formats.convert.convert`, timed end to end (reading,
adapting, writing). Throughput: the median of 3 timed batches after one warm-up batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from vit_jax import checkpoint
from vit_jax.formats import convert
from vit_jax.models import get_model, param_shapes


def _random_npz(name: str, size: int, path: Path) -> None:
    model = get_model(name, 1000)
    rng = np.random.default_rng(0)
    shapes = param_shapes(model, size)
    params = jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(np.float32), shapes)
    checkpoint.save_npz(path, params)


def _speed(fn, x: np.ndarray) -> float:
    fn(x)  # warm-up (compilation, session set-up)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return len(x) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B_16")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="convert_bench"))
    src = tmp / "src.npz"
    _random_npz(args.model, args.image_size, src)
    outs = {
        "npz": "m.npz",
        "timm": "m.safetensors",
        "hf": "hf",
        "onnx": "m.onnx",
        "saved_model": "sm",
    }
    print(f"{args.model} at {args.image_size}, {os.cpu_count()} cores")
    print("| format | convert s | size MB |")
    print("|---|---|---|")
    for fmt, name in outs.items():
        start = time.perf_counter()
        done = convert.convert(src, fmt, tmp / name)
        seconds = time.perf_counter() - start
        out = Path(done.out)
        files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file()]
        print(f"| {fmt} | {seconds:.1f} | {sum(p.stat().st_size for p in files) / 1e6:.0f} |")

    x = np.random.default_rng(1).uniform(-1, 1, (args.batch, args.image_size, args.image_size, 3))
    x = x.astype(np.float32)
    model, params, _ = convert.load(src)
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
    speeds = {"JAX (jit)": _speed(lambda x: np.asarray(apply(params, x)), x)}
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp / "m.onnx"), providers=["CPUExecutionProvider"])
    speeds["ONNX (onnxruntime)"] = _speed(lambda x: session.run(["logits"], {"images": x}), x)
    import tensorflow as tf

    serve = tf.saved_model.load(str(tmp / "sm")).signatures["serving_default"]
    speeds["SavedModel (TensorFlow)"] = _speed(lambda x: serve(images=tf.constant(x)), x)
    print(f"\n| runtime | img/s (batch {args.batch}) |")
    print("|---|---|")
    for runtime, speed in speeds.items():
        print(f"| {runtime} | {speed:.2f} |")


if __name__ == "__main__":
    main()
