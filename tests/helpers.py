"""Helpers the tests share: flat parameter trees, random parameters, idx files, images."""

from __future__ import annotations

import gzip
import os

import jax
import numpy as np
from flax import traverse_util

from vit_jax.models import param_shapes


def logits(model, params, x, **kw) -> np.ndarray:
    """The model's output for `x`, jitted: eager Flax dispatches op by op, far slower on CPU."""
    return np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x, **kw))(params, x))


def flat(tree: dict) -> dict:
    """{'a': {'b': x}} -> {'a/b': x}."""
    return traverse_util.flatten_dict(tree, sep="/")


def unflat(tree: dict) -> dict:
    """{'a/b': x} -> {'a': {'b': x}}."""
    return traverse_util.unflatten_dict(tree, sep="/")


def random_params(model, image_size, seed: int = 0, scale: float = 0.2) -> dict:
    """Random float32 parameters of `model` at `image_size` (head included, non-zero),
    LayerNorm and GroupNorm scales around 1 so that activations stay in range."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, s in flat(param_shapes(model, image_size)).items():
        x = rng.normal(0.0, scale, s.shape).astype(np.float32)
        if key.endswith("/scale"):
            x = 1.0 + x
        out[key] = x
    return unflat(out)


def write_idx(path: str, array: np.ndarray) -> None:
    """An MNIST-format idx file (gzipped when the path ends in .gz)."""
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def images(size, n: int = 2, seed: int = 1) -> np.ndarray:
    """Random images in [-1, 1].  # [n, H, W, 3]"""
    h, w = (size, size) if isinstance(size, int) else size
    return np.random.default_rng(seed).uniform(-1, 1, (n, h, w, 3)).astype(np.float32)


def run_command(module, *args: str) -> int:
    """Runs a command module in-process, as `python -m MODULE ARGS` would; its exit code.

    The command's flags are defined for this call and removed again, so tests can run
    several commands (which share flag names) in one process. Output goes to the real
    stdout/stderr: read it with pytest's capsys.
    """
    from absl import app, flags

    from vit_jax import cli

    app.define_help_flags()  # absl's own flags stay defined between commands
    before = set(flags.FLAGS)
    try:
        prepare = getattr(module, "preset_argv", None)
        cli.run(module.main, module.define_flags, [module.__name__, *args], prepare)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        for name in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
    return 0


def tiny_config(**overrides):
    """The `fashion_mnist:tiny` preset (20 steps of a 2-block model) with fields
    overridden; 'model.dropout' names a nested one, as --config.model.dropout does."""
    from vit_jax.configs import fashion_mnist

    c = fashion_mnist.get_config("tiny")
    for key, value in overrides.items():
        *sections, field = key.split(".")
        node = c
        for name in sections:
            node = node[name]
        node[field] = value
    return c


def batch(n: int, size: int = 28, k: int = 10, seed: int = 0) -> dict:
    """A random training batch: images in [-1, 1], one-hot labels of k classes."""
    rng = np.random.default_rng(seed)
    labels = np.eye(k, dtype=np.float32)[rng.integers(0, k, n)]
    return {"image": rng.uniform(-1, 1, (n, size, size, 3)).astype(np.float32), "label": labels}


def snapshot(workdir):
    """{relative path: (bytes, mtime_ns)} of every file, and every directory's mtime."""
    out = {}
    for root, dirs, files in os.walk(workdir):
        for name in files + dirs:
            path = os.path.join(root, name)
            data = None if os.path.isdir(path) else open(path, "rb").read()
            out[os.path.relpath(path, workdir)] = (data, os.stat(path).st_mtime_ns)
    return out
