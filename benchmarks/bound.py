"""Timing helpers and the matrix-product bound shared by the benchmark scripts.

The bound of a jitted function is the summed time of its own matrix products
(dot_general and convolution equations of its jaxpr, at their shapes and dtypes),
each timed alone. Little can beat it on a CPU, so `bound time / function time` says
how close to the limit the function runs.
"""

from __future__ import annotations

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


def product_bound(fn: Callable, *args, verbose: bool = False) -> tuple[float, list[str]]:
    """Seconds of `fn`'s matrix products each timed alone, summed; and a line per product."""
    total, lines = 0.0, []
    rng = np.random.default_rng(0)
    for ((name, avals, _), eqn), count in products(fn, *args).items():
        operands = [
            jnp.asarray(rng.standard_normal(s).astype(np.float32), dtype=d) for s, d in avals
        ]
        prim = eqn.primitive
        f = jax.jit(lambda *ops, _p=prim, _kw=dict(eqn.params): _p.bind(*ops, **_kw))
        t = timeit(lambda f=f, ops=operands: f(*ops), repeats=3, min_time=0.2)
        total += t * count
        shapes = " x ".join(str(list(s)) for s, _ in avals)
        lines.append(f"  {name:<21} {shapes:<40} x{count:<4} {1e3 * t:8.3f} ms")
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
