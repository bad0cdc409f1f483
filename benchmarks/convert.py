"""Time converting a checkpoint to every format, and running the ONNX export (images/s)
beside the JAX model.

    python benchmarks/convert.py [--model=ViT-B_16] [--image_size=224] [--batch=8]
        [--formats=npz,timm,hf,onnx]

The checkpoint is the variant with random parameters written as .npz (the published
files have the same shapes), so the figures need no download. Each format is converted
from that .npz by `vit_jax.weights.convert.convert`, timed end to end (reading,
adapting, writing). Throughput: the median of 3 timed batches after one warm-up batch;
each runtime's largest logit difference from the JAX model on that batch beside it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from bound import timeit  # this script's directory

from vit_jax import weights
from vit_jax.models import get_model, param_shapes
from vit_jax.weights import convert


def _random_npz(name: str, size: int, path: Path) -> None:
    model = get_model(name, 1000)
    rng = np.random.default_rng(0)
    shapes = param_shapes(model, size)
    params = jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(np.float32), shapes)
    weights.save_npz(path, params)


def _speed(fn, x: np.ndarray) -> float:
    """Images/s: the median of 3 batches after one warm-up (compilation, session set-up)."""
    return len(x) / timeit(lambda: fn(x), warmup=1, repeats=3, min_time=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B_16")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--formats", default="npz,timm,hf,onnx")
    args = parser.parse_args()
    formats = args.formats.split(",")
    with tempfile.TemporaryDirectory(prefix="convert_bench") as tmp:  # GBs, removed after
        run_all(args.model, args.image_size, args.batch, formats, Path(tmp))


def run_all(name: str, image_size: int, batch: int, formats: list[str], tmp: Path) -> None:
    src = tmp / "src.npz"
    _random_npz(name, image_size, src)
    outs = {"npz": "m.npz", "timm": "m.safetensors", "hf": "hf", "onnx": "m.onnx"}
    print(f"{name} at {image_size}, {os.cpu_count()} cores")
    print("| format | convert s | size MB |")
    print("|---|---|---|")
    for fmt, name in outs.items():
        if fmt not in formats:
            continue
        start = time.perf_counter()
        done = convert.convert(src, fmt, tmp / name)
        seconds = time.perf_counter() - start
        out = Path(done.out)
        files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file()]
        files += [p for p in [out.with_name(out.name + ".data")] if p.is_file()]  # ONNX > 2 GB
        print(f"| {fmt} | {seconds:.1f} | {sum(p.stat().st_size for p in files) / 1e6:.1f} |")

    x = np.random.default_rng(1).uniform(-1, 1, (batch, image_size, image_size, 3))
    x = x.astype(np.float32)
    loaded = convert.load(src)
    model, params = loaded.model, loaded.params
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
    want = np.asarray(apply(params, x))
    runs = {"JAX (jit)": lambda x: np.asarray(apply(params, x))}
    if "onnx" in formats:
        import onnxruntime as ort

        session = ort.InferenceSession(str(tmp / "m.onnx"), providers=["CPUExecutionProvider"])
        runs["ONNX (onnxruntime)"] = lambda x: session.run(["logits"], {"images": x})[0]
    print(f"\n| runtime | img/s (batch {batch}) | max abs logit diff from JAX |")
    print("|---|---|---|")
    for runtime, run in runs.items():
        diff = float(np.abs(run(x) - want).max())
        print(f"| {runtime} | {_speed(run, x):.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
