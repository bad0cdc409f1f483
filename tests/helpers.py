"""Helpers the tests share: the repository's root, flat parameter trees and their
comparison, random parameters, a model set up for training, idx files, images."""

from __future__ import annotations

import contextlib
import gzip
import importlib
import os
import re
import signal
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.models import param_shapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository

# A skip reason that starts with MISSING names a test dependency that is not installed:
# under CI=true such a skip fails the run (conftest.py).
MISSING = "missing test dependency:"
EMBEDDED_DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
# For the tests that train on the embedded Fashion-MNIST (the `fashion_mnist` presets):
# without it they all skip with this one reason (setup.sh installs it).
needs_embedded_data = pytest.mark.skipif(
    not os.path.isfile(os.path.join(EMBEDDED_DATA, "train-labels-idx1-ubyte.gz")),
    reason=f"{MISSING} the embedded Fashion-MNIST in {EMBEDDED_DATA} "
    "(apt-get install dataset-fashion-mnist, as setup.sh does)",
)


def logits(model, params, x, **kw) -> np.ndarray:
    """The model's output for `x`, jitted: eager Flax dispatches op by op, far slower on CPU."""
    return np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x, **kw))(params, x))


def flat(tree: dict) -> dict:
    """{'a': {'b': x}} -> {'a/b': x}."""
    return traverse_util.flatten_dict(tree, sep="/")


def unflat(tree: dict) -> dict:
    """{'a/b': x} -> {'a': {'b': x}}."""
    return traverse_util.unflatten_dict(tree, sep="/")


def random_params(model, image_size, seed: int = 0, scale: float = 0.3) -> dict:
    """Random float32 parameters of `model` at `image_size`: every one non-zero (a zero head
    or class token would hide mistakes), kernels scaled by 1/sqrt(fan-in) as in a trained
    model so that float32 logits are well conditioned, LayerNorm and GroupNorm scales around
    1, the rest N(0, `scale`)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, s in flat(param_shapes(model, image_size)).items():
        std = scale
        if k.endswith("kernel"):
            qkv = k.endswith(("query/kernel", "key/kernel", "value/kernel"))
            std = 1.0 / np.sqrt(s.shape[0] if qkv else np.prod(s.shape[:-1]))
        v = rng.normal(0.0, std, s.shape)
        if k.endswith("/scale"):
            v = 1.0 + 0.2 * v
        out[k] = v.astype(np.float32)
    return unflat(out)


# Float32 logits against the float64 NumPy reference or another runtime (onnxruntime, TF,
# timm, transformers) differ by at most 3.1e-6 (measured: an R50 hybrid in onnxruntime;
# plain ViTs 1e-6). A wrong LayerNorm epsilon (1e-5 or 1e-12 for 1e-6) or GELU form moves
# the logits of `quiet_params` by 1e-4 or more (test_checkpoint proves that it fails).
FIDELITY_ATOL = 1e-5
# TensorFlow's start-up lines on stderr: a command that prints them has imported it.
TF_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|oneDNN custom operations are on"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
)


def quiet_params(model, image_size, seed: int = 0) -> dict:
    """`random_params` with a residual stream 10x quieter: the patch embedding, class
    token, position embeddings and each block's output projections scaled by 0.1, so
    that LayerNorm inputs have a variance ~1e-2 (as in places of trained ViTs) and the
    epsilon shows in the logits: 1e-12 or 1e-5 instead of 1e-6 moves them >= 1e-4."""
    import re

    loud = r"(^embedding/|^cls$|pos_embedding|/out/|/Dense_1/)"
    tree = flat(random_params(model, image_size, seed))
    return unflat({k: v * np.float32(0.1) if re.search(loud, k) else v for k, v in tree.items()})


def _arrays(tree) -> dict:
    """Any pytree (nested or '/'-flat dicts, dataclasses, an npz file) -> {path: array}."""
    if isinstance(tree, np.lib.npyio.NpzFile):
        tree = dict(tree)
    return {
        jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def assert_trees_equal(got, want, atol: float = 0.0) -> None:
    """`got` and `want` have the same structure, and each array the same dtype and shape
    and the same values: bit for bit, or within `atol` (no relative tolerance)."""
    got, want = _arrays(got), _arrays(want)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k, w in want.items():
        if atol == 0.0:
            np.testing.assert_array_equal(got[k], w, err_msg=k, strict=True)
        else:
            np.testing.assert_allclose(got[k], w, atol=atol, rtol=0, err_msg=k, strict=True)


def assert_trained_alike(got, want, lr_sum: float, atol: float = 2e-5) -> None:
    """Parameters trained with Adam on two layouts (meshes, accumulation) agree within
    `atol`, except in rare elements. Adam divides each gradient element by its own running
    scale, so an element whose gradient is at rounding level can step differently when the
    sums are ordered differently: by at most the learning rate summed over the steps
    (`lr_sum`). Seen: 1 of 65,536 weights 2.2e-5 apart (JAX 0.12, an Intel CI machine).
    A layout bug moves many elements, which this still catches."""
    got, want = _arrays(got), _arrays(want)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        diff = np.abs(got[k].astype(np.float64) - w)
        assert np.mean(diff > atol) <= 1e-3, (k, int(np.sum(diff > atol)), diff.size)
        assert diff.max() <= lr_sum, (k, float(diff.max()), lr_sum)


def assert_npz_equal(got, want) -> None:
    """Two .npz files hold the same arrays bit for bit under the same stored names."""
    with np.load(got) as a, np.load(want) as b:
        assert_trees_equal(a, b)


def write_idx(path: str, array: np.ndarray) -> None:
    """An MNIST-format idx file (gzipped when the path ends in .gz)."""
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def write_idx_split(root, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    """One split ('train' or 't10k') of a Fashion-MNIST directory: its gzipped idx files."""
    write_idx(os.path.join(root, f"{split}-images-idx3-ubyte.gz"), images)
    write_idx(os.path.join(root, f"{split}-labels-idx1-ubyte.gz"), labels)


def write_three_class_idx(root: str) -> str:
    """An idx directory of 3 classes of 8x8 images (30 train, 12 test): class c is a
    little brighter in band c, under noise; easy for a linear probe, not trivial."""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 12)):
        labels = np.arange(n) % 3
        images = rng.integers(0, 60, (n, 8, 8))
        for i, c in enumerate(labels):
            images[i, :, 3 * c : 3 * c + 2] += 25
        write_idx_split(root, prefix, images, labels)
    return root


def images(size, n: int = 2, seed: int = 1) -> np.ndarray:
    """Random images in [-1, 1].  # [n, H, W, 3]"""
    h, w = (size, size) if isinstance(size, int) else size
    return np.random.default_rng(seed).uniform(-1, 1, (n, h, w, 3)).astype(np.float32)


def run_command(module, *args: str) -> int:
    """Runs a command module in-process, as `python -m MODULE ARGS` would; its exit code.

    The command's flags are defined for this call and removed again, so tests can run
    several commands (which share flag names) in one process; flags that libraries
    define on first import (Grain's) stay, as their modules stay imported. Output goes to
    the real stdout/stderr: read it with pytest's capsys.
    """
    import logging

    from absl import app, flags

    from vit_jax import cli

    app.define_help_flags()  # absl's own flags stay defined between commands
    before = set(flags.FLAGS)
    # A failing command silences logging and unraisable reports for the rest of its
    # process (base/exits.py's _last_word); here the process goes on, so they come back.
    disabled, unraisable = logging.root.manager.disable, sys.unraisablehook
    try:
        prepare = getattr(module, "preset_argv", None)
        with warnings.catch_warnings():  # (and warnings)
            cli.run(module.main, module.define_flags, [module.__name__, *args], prepare)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        for name in set(flags.FLAGS) - before:
            module = flags.FLAGS.find_module_defining_flag(name, "vit_jax")
            if module.startswith("vit_jax") or name.startswith("config."):  # and overrides
                delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
        logging.disable(disabled)
        sys.unraisablehook = unraisable
    return 0


def python_m(module: str, *args: str, env: dict | None = None, timeout: int = 300):
    """`python -m MODULE ARGS` in a fresh Python, as a user runs a command, from the
    repository's root (so that this checkout's vit_jax is the one imported); `env` is set
    on top of this process's environment. The finished process, its text output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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


def cpu_signature() -> str:
    """What XLA:CPU compiles for on this machine, as a short text: the vendor, the family
    and model numbers (LLVM picks its target from them, not from the brand string) and the
    vector extensions, e.g. 'AuthenticAMD 25/1 avx avx2 fma sse4_1 sse4_2'. Two machines
    that differ here may round a float32 logit differently in its last bits."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            head = f.read().split("\n\n", 1)[0]
    except OSError:
        return f"{platform.system()} {platform.machine()} {platform.processor()}".strip()
    fields = dict(line.split(":", 1) for line in head.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    vector = sorted(f for f in fields.get("flags", "").split()
                    if f.startswith(("avx", "fma", "amx", "sse4", "f16c")))  # fmt: skip
    family = f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}"
    return " ".join([fields.get("vendor_id", platform.machine()), family, *vector])


def initial_params(start, model, image_size: int) -> dict:
    """The parameters a run of `start` (state.Start) begins with: its init_from file's, or
    the model's own initialisation."""
    from vit_jax import weights

    if start.init_from:
        return weights.load_pretrained(start.init_from, model, image_size, start.reset_head,
                                       start.patch_size)  # fmt: skip
    x = np.zeros((1, image_size, image_size, model.channels), np.float32)
    return jax.jit(model.init)(jax.random.key(start.seed), x)["params"]


def model_and_optimizer(config, skip_nonfinite: bool = False):
    """(model, tx, lr) of a training config (10 classes), as the training loop builds them."""
    from vit_jax.training import state as state_lib

    model = state_lib.build_model(config.model, 10)
    tx, lr = state_lib.make_optimizer(
        config.optimizer, config.total_steps, skip_nonfinite=skip_nonfinite
    )
    return model, tx, lr


def training(config, mesh, accum_steps: int = 1, skip_nonfinite: bool = False):
    """A new TrainState of `config` sharded over `mesh`, and its compiled train step:
    (state, step, shardings)."""
    from vit_jax.training import state as state_lib
    from vit_jax.training import step as step_lib

    model, tx, lr = model_and_optimizer(config, skip_nonfinite)
    state, shardings = state_lib.create_state(state_lib.Start.of(config), model, tx, mesh)
    step, _ = step_lib.jit_steps(model, tx, lr, mesh, shardings, accum_steps)
    return state, step, shardings


def tf_resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """tf.image.resize(image, size) (bilinear, half-pixel centres, no antialiasing) in
    float64, written out from TensorFlow's kernel: source coordinate (o + 0.5) * in / out
    - 0.5, neighbours floor and ceil clamped to the image.  [h, w, c] -> float [H, W, c]"""

    def taps(n: int, m: int):
        src = (np.arange(m) + 0.5) * (n / m) - 0.5
        lo = np.floor(src)
        return np.maximum(lo, 0).astype(int), np.minimum(np.ceil(src), n - 1).astype(int), src - lo

    (y0, y1, fy), (x0, x1, fx) = taps(image.shape[0], size[0]), taps(image.shape[1], size[1])
    x = image.astype(np.float64)
    top = x[y0][:, x0] + (x[y0][:, x1] - x[y0][:, x0]) * fx[None, :, None]
    bottom = x[y1][:, x0] + (x[y1][:, x1] - x[y1][:, x0]) * fx[None, :, None]
    return top + (bottom - top) * fy[:, None, None]


def defined_flags(module_name: str) -> set[str]:
    """The flags that the command's define_flags defines in its own module or in
    vit_jax.cli (define_model_flags), found in this process."""
    from absl import flags

    module = importlib.import_module(module_name)
    before = set(flags.FLAGS)
    module.define_flags()
    new = set(flags.FLAGS) - before
    try:
        owners = {name: flags.FLAGS.find_module_defining_flag(name) for name in new}
        return {name for name in new if owners[name] in (module_name, "vit_jax.cli")}
    finally:
        for name in new:
            delattr(flags.FLAGS, name)


def assert_recorded(got: dict, path, least_sets: int = 1) -> None:
    """`got` {name: array} against the sets recorded in the .npz at `path`, one per JAX
    version and CPU (`cpu_signature`: XLA:CPU rounds the last bits by the CPU it compiles
    for), keyed 'JAX/CPU/name': bit for bit against this machine's set, within
    FIDELITY_ATOL of every set. VIT_JAX_RECORD_LOGITS=1 adds this machine's set where it
    has none (run it on the code the figures are to be held to)."""
    import zlib

    recorded = {}
    if os.path.exists(path):
        with np.load(path) as f:
            recorded = {k: f[k] for k in f.files}
    cpu = f"{zlib.crc32(cpu_signature().encode()):08x}"
    here = f"{jax.__version__}/{cpu}/"
    mine = {k.removeprefix(here): v for k, v in recorded.items() if k.startswith(here)}
    if os.environ.get("VIT_JAX_RECORD_LOGITS") and not mine:
        recorded |= {here + k: v for k, v in got.items()} | {f"cpu/{cpu}": cpu_signature()}
        np.savez(path, **recorded)
        mine = got
    sets = {"/".join(k.split("/")[:2]) for k in recorded if not k.startswith("cpu/")}
    assert len(sets) >= least_sets, f"{len(sets)} sets recorded in {path}"
    assert all(f"cpu/{s.split('/')[1]}" in recorded for s in sets)
    for key, value in got.items():
        if mine:
            np.testing.assert_array_equal(value, mine[key], err_msg=key)
        for s in sets:  # every JAX on every CPU recorded agrees to the fidelity tolerance
            want = recorded[f"{s}/{key}"]
            np.testing.assert_allclose(
                value, want, atol=FIDELITY_ATOL, rtol=0, err_msg=f"{s}/{key}"
            )


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} in step order, from the event files a run wrote in
    `logdir` (local or on a store):
    TFRecord-framed `Event` protos (per record a little-endian uint64 length, its CRC,
    the bytes, their CRC, not checked here)."""
    import struct  # noqa: PLC0415

    from tensorboardX.proto import event_pb2  # noqa: PLC0415

    from vit_jax.base import store  # noqa: PLC0415

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(store.path(logdir).glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):  # a record cut short (a full disk) ends the file
            (length,) = struct.unpack("<Q", data[at : at + 8])
            if at + 16 + length > len(data):
                break
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return {tag: sorted(rows) for tag, rows in out.items()}


@contextlib.contextmanager
def ctrl_c_after_save(monkeypatch, step: int):
    """The run in the block is stopped by Ctrl-C right after it saves checkpoint `step`
    (it raises KeyboardInterrupt, which the block expects)."""
    from vit_jax.workdir.checkpoints import Checkpoints  # noqa: PLC0415

    save = Checkpoints.save

    def save_then_ctrl_c(self, at, state):
        save(self, at, state)
        if at == step:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Checkpoints, "save", save_then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        monkeypatch.setattr(Checkpoints, "save", save)
