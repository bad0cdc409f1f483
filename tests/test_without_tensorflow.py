"""Models, checkpoints, the jitted steps, the classify command and the benchmarks run where
TensorFlow is absent (accelerator machines often lack it): each runs in a subprocess in
which importing tensorflow fails. A pipeline then names the extra to install; where
TensorFlow is present, its start-up notes stay off stderr (vit_jax/base/quiet_tf.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from helpers import ROOT, random_params
from PIL import Image

from vit_jax import weights
from vit_jax.models import get_model

BLOCK = """
import importlib.abc, sys
class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
sys.meta_path.insert(0, NoTensorFlow())
"""


def run_without_tf(code: str, *args: str, cwd: str = "/", block: str = BLOCK) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-c", block + code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_block_works():
    out = run_without_tf(
        "try:\n    import tensorflow\nexcept ImportError as e:\n    print('blocked:', e)"
    )
    assert "blocked: No module named 'tensorflow' (blocked)" in out


def test_library_and_train_step_without_tensorflow():
    out = run_without_tf("""
import jax, numpy as np
from vit_jax import weights
from vit_jax.training import optim, state, steps
from vit_jax.parallel import sharding
from vit_jax.configs import fashion_mnist
from vit_jax.models import get_model
c = fashion_mnist.get_config("tiny")
model = state.build_model(c.model, 10)
tx, lr = optim.make_optimizer(c.optimizer, c.total_steps)
mesh = sharding.make_mesh(devices=jax.devices()[:1])
s, shardings = state.create_state(state.Start(c.seed, c.image_size), model, tx, mesh)
step, _ = steps.compile_steps(model, tx, lr, 1, mesh, shardings)
batch = {"image": np.zeros((8, 28, 28, 3), np.float32), "label": np.eye(10, dtype=np.float32)[:8]}
s, m = step(s, batch)
print("loss", float(m["loss"]), "step", int(s.step))
assert "tensorflow" not in sys.modules
""")
    loss = float(out.split()[1])
    assert abs(loss - np.log(10)) < 0.05 and out.split()[3] == "1"  # zero head: chance


def test_classify_command_without_tensorflow(tmp_path):
    model = get_model("testing", 3)
    path = str(tmp_path / "t.npz")
    weights.save_npz(path, random_params(model, 32))
    image = str(tmp_path / "x.png")
    Image.new("RGB", (40, 30), (10, 200, 40)).save(image)
    code = "import runpy; runpy.run_module('vit_jax.infer', run_name='__main__')"
    out = run_without_tf(code, f"--checkpoint={path}", f"--image={image}", "--top_k=3")
    assert out.splitlines()[0] == image and len(out.splitlines()) == 4


def test_benchmarks_without_tensorflow():
    for script, extra in (("inference.py", "--batch=2"), ("train_step.py", "--batch=2")):
        code = (
            f"import runpy, sys; sys.argv[0] = {script!r}; "
            f"sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r}); "
            f"runpy.run_path({os.path.join(ROOT, 'benchmarks', script)!r}, run_name='__main__')"
        )
        out = run_without_tf(code, "--model=testing", "--image_size=32", extra, "--no-bound")
        row = next(line.split() for line in out.splitlines() if line.startswith("testing"))
        assert row[-1] == "-" and float(row[5 if script == "train_step.py" else 4]) > 0


def test_a_pipeline_without_tensorflow_names_the_extra():
    out = run_without_tf("""
from vit_jax import data
try:
    data.train_iterator
except ImportError as e:
    print(e)
""")
    assert out.strip() == (
        "TensorFlow is needed here (tf.data input pipelines, TensorBoard files, SavedModel): "
        "pip install 'vit_jax[data]'"
    )


def test_tensorflow_start_up_notes_are_kept_off_stderr(tmp_path):
    """A stand-in `tensorflow` writes TensorFlow's start-up lines (and two others) to file
    descriptor 2 as its C++ does: only the others reach stderr."""
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text("""
import os, sys
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written "
            b"to STDERR\\n")
os.write(2, b"I0000 00:00:1795454621.024016   28100 port.cc:153] oneDNN custom operations are on. "
            b"You may see slightly different numerical results.\\n")
os.write(2, b"a C++ warning that matters\\n")
os.write(2, b"To enable the following instructions: AVX2 FMA, in other operations, rebuild "
            b"TensorFlow with the appropriate compiler flags.\\n")
print("a Python warning that matters", file=sys.stderr)
VERSION = "stand-in"
""")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from vit_jax.base import quiet_tf; print(quiet_tf.tensorflow().VERSION)",
        ],
        capture_output=True,
        text=True,
        cwd="/",
        # the stand-in shadows TensorFlow; this checkout's vit_jax, whatever is installed
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT])),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "stand-in\n"
    assert proc.stderr == "a C++ warning that matters\na Python warning that matters\n"
