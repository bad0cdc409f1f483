"""Training, evaluation, the input pipeline, the commands and the benchmarks run where
TensorFlow is absent (accelerator machines often lack it): each runs in a subprocess in
which TensorFlow cannot be found (find_spec says None, the import fails), as where it is
not installed. The library never imports TensorFlow."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, random_params
from PIL import Image

from vit_jax import weights
from vit_jax.data.config import DEFAULT_IDX_DIR
from vit_jax.models import get_model

BLOCK = """
import importlib.machinery, sys
class NoTensorFlow(importlib.machinery.PathFinder):  # sys.path without tensorflow
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = NoTensorFlow
"""
RUN = """
import runpy, sys
sys.argv = sys.argv[:1] + sys.argv[2:]
try:
    runpy.run_module(sys.argv.pop(0) if False else {module!r}, run_name="__main__")
except SystemExit as e:
    assert not e.code, f"exit {{e.code}}"
print("tensorflow imported:", "tensorflow" in sys.modules)
"""


def run_module_without_tf(module: str, *args: str, cwd: str = "/") -> str:
    """`python -m MODULE ARGS` with TensorFlow absent; asserts it was never imported."""
    out = run_without_tf(RUN.format(module=module), "-", *args, cwd=cwd)
    assert out.splitlines()[-1] == "tensorflow imported: False", out[-2000:]
    return out


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
        "import importlib.util\nprint(importlib.util.find_spec('tensorflow'))\n"
        "try:\n    import tensorflow\nexcept ImportError as e:\n    print('blocked:', e)"
    )
    assert out.splitlines() == ["None", "blocked: No module named 'tensorflow'"]


def test_library_and_train_step_without_tensorflow():
    out = run_without_tf("""
import jax, numpy as np
from vit_jax import weights
from vit_jax.training import state, step
from vit_jax.parallel import sharding
from vit_jax.configs import fashion_mnist
from vit_jax.models import get_model
c = fashion_mnist.get_config("tiny")
model = state.build_model(c.model, 10)
tx, lr = state.make_optimizer(c.optimizer, c.total_steps)
mesh = sharding.make_mesh(devices=jax.devices()[:1])
s, shardings = state.create_state(state.Start(c.seed, c.image_size), model, tx, mesh)
step, _ = step.jit_steps(model, tx, lr, mesh, shardings, 1)
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


def test_main_job_and_evaluations_without_tensorflow(tmp_path):
    """The main job's tiny preset end to end, then few-shot, `evaluate` on the idx data
    and on an image folder, and the figures on a dataset sample."""
    if not os.path.isdir(DEFAULT_IDX_DIR):
        pytest.skip(
            f"no embedded dataset in {DEFAULT_IDX_DIR} (apt-get install dataset-fashion-mnist)"
        )
    work = str(tmp_path / "run")
    out = run_module_without_tf(
        "vit_jax.main", "--config=fashion_mnist:tiny", f"--workdir={work}", cwd=str(tmp_path)
    )
    assert "step 20: test accuracy" in out
    summary = json.loads(open(os.path.join(work, "summary.json")).read())
    assert summary["steps"] == 20 and 0.0 <= summary["accuracy"] <= 1.0
    assert glob.glob(os.path.join(work, "events.out.tfevents.*"))  # TensorBoard, no TF
    final = os.path.join(work, "final.npz")
    out = run_module_without_tf(
        "vit_jax.fewshot", f"--checkpoint={final}", "--shots=1,2", "--test_split=test[:200]"
    )
    assert "2-shot" in out or "2 shot" in out, out
    out = run_module_without_tf(
        "vit_jax.evaluate",
        f"--checkpoint={final}",
        "--dataset=fashion_mnist",
        "--source=idx",
        "--split=test[:100]",
        "--progress=false",
    )
    assert json.loads(out.splitlines()[-2])["examples"] == 100
    folder = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for i in range(6):
        os.makedirs(folder / "test" / f"c{i % 3}", exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), np.uint8)).save(
            folder / "test" / f"c{i % 3}" / f"{i}.jpg"
        )
    out = run_module_without_tf(
        "vit_jax.evaluate",
        f"--checkpoint={final}",
        "--dataset=mine",
        "--source=folder",
        f"--data_dir={folder}",
        "--classes=0,1,2",
        "--progress=false",
    )
    assert json.loads(out.splitlines()[-2])["examples"] == 6
    figures = tmp_path / "figures"
    run_module_without_tf(
        "vit_jax.figures", f"--checkpoint={final}", f"--out={figures}", "--num_images=2"
    )
    assert sorted(p.suffix for p in figures.iterdir()) and any(
        p.suffix == ".png" for p in figures.iterdir()
    )
