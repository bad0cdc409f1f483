"""Timing helpers and the matrix-product bound shared by the benchmark scripts.

The bound of a jitted function is the summed time of its own matrix products
(dot_general and convolution equations of its jaxpr, at their shapes and dtypes),
each timed alone. Little can beat it on a CPU, so `bound time / function time` says
how close to the limit the function runs.
"""

from __future__ import annotations

import argparse
import collections
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

PRODUCTS = ("dot_general", "conv_general_dilated")


def parser(doc: str, *, lists: bool) -> argparse.ArgumentParser:
    """The flags the inference and train-step benchmarks share: what to time (model,
    batch, resolution, dtype; comma-separated lists where `lists`) and the bound."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    several, kind = (" (comma-separated)", str) if lists else ("", int)
    models = "model names, comma-separated, or 'all'" if lists else "model name"
    ap.add_argument("--model", default="ViT-B_16", help=models)
    ap.add_argument("--batch", type=kind, default="8", help="batch size" + several)
    ap.add_argument("--image_size", type=kind, default="224", help="resolution" + several)
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16" + several)
    ap.add_argument(
        "--no-bound",
        dest="bound",
        action="store_false",
        help="skip timing the matrix products alone (a quick run measures the model only)",
    )
    ap.add_argument("--products", action="store_true", help="print each product's time")
    return ap


def timeit(
    fn: Callable[[], Any], *, warmup: int = 2, repeats: int = 5, min_time: float = 0.5
) -> float:
    """Median seconds of one call of `fn` (results blocked on), after warm-up calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
        if len(times) >= 100:
            break
    return float(np.median(times))


def _subjaxprs(eqn) -> list:
    out = []
    for v in eqn.params.values():
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(item, jex_core.ClosedJaxpr):
                out.append(item.jaxpr)
            elif isinstance(item, jex_core.Jaxpr):
                out.append(item)
    return out


def products(fn: Callable, *args) -> collections.Counter:
    """{(primitive, operand avals, params): count} of every matrix product in `fn`'s jaxpr.

    Products inside a scan count once per iteration.
    """
    counts: collections.Counter = collections.Counter()

    def walk(jaxpr, times: int) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in PRODUCTS:
                avals = tuple((tuple(v.aval.shape), str(v.aval.dtype)) for v in eqn.invars)
                params = tuple(sorted((k, repr(v)) for k, v in eqn.params.items()))
                counts[(eqn.primitive.name, avals, params, eqn)] += times
            n = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
            for sub in _subjaxprs(eqn):
                walk(sub, times * n)

    walk(jax.make_jaxpr(fn)(*args).jaxpr, 1)
    # Equal shapes and parameters are one product: keep one equation for each.
    merged: collections.Counter = collections.Counter()
    first: dict = {}
    for (name, avals, params, eqn), c in counts.items():
        key = (name, avals, params)
        first.setdefault(key, eqn)
        merged[key] += c
    return collections.Counter({(k, first[k]): c for k, c in merged.items()})


def gemm_shape(eqn) -> tuple[int, int, int, int] | None:
    """(batch, m, k, n) of a dot_general: the plain matrix product it amounts to."""
    if eqn.primitive.name != "dot_general":
        return None
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    size = lambda shape, dims: int(np.prod([shape[d] for d in dims])) if dims else 1
    lfree = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rs)) if d not in rc and d not in rb]
    return size(ls, lb), size(ls, lfree), size(ls, lc), size(rs, rfree)


def product_bound(fn: Callable, *args) -> tuple[float, list[str]]:
    """Seconds of `fn`'s matrix products each timed alone, summed; and a line per product.

    A dot_general is timed as the plain (batched) matrix product it amounts to,
    [b, m, k] x [b, k, n] with operands laid out for it: how XLA lays out and
    transposes operands inside the model is the model's business, not the bound's.
    Convolutions are timed as they are.
    """
    rng = np.random.default_rng(0)
    timed: collections.Counter = collections.Counter()
    what: dict = {}
    for ((name, avals, _), eqn), count in products(fn, *args).items():
        dtype = avals[0][1]
        gemm = gemm_shape(eqn)
        key = (gemm, dtype) if gemm else (name, avals, repr(sorted(eqn.params.items())))
        timed[key] += count
        what.setdefault(key, (eqn, avals, gemm))
    total, lines = 0.0, []
    for key, count in timed.items():
        eqn, avals, gemm = what[key]
        if gemm:
            b, m, k, n = gemm
            shapes = [(b, m, k), (b, k, n)]
            f = jax.jit(jnp.matmul)
            label = f"matmul [{b}] {m}x{k} @ {k}x{n}"
        else:
            shapes = [s for s, _ in avals]
            prim, params = eqn.primitive, dict(eqn.params)
            f = jax.jit(lambda *ops, _p=prim, _kw=params: _p.bind(*ops, **_kw))
            label = f"{eqn.primitive.name} " + " x ".join(str(list(s)) for s in shapes)
        ops = [
            jnp.asarray(rng.standard_normal(s).astype(np.float32), dtype=avals[0][1])
            for s in shapes
        ]
        t = timeit(lambda f=f, ops=ops: f(*ops), repeats=3, min_time=0.2)
        total += t * count
        lines.append(f"  {label:<58} x{count:<4} {1e3 * t:8.3f} ms")
    return total, lines


def machine() -> str:
    """One line naming the machine the figures were taken on."""
    dev = jax.devices()[0]
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    import os

    return (
        f"{dev.platform} ({dev.device_kind}), {cpu}, {os.cpu_count()} cores, jax {jax.__version__}"
    )
