"""The package outside its checkout: built as a wheel, installed into a fresh virtualenv
(reusing the running environment's dependencies, be it a virtualenv, a conda env or the
system interpreter), run from an empty directory."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile

import pytest
from helpers import MISSING, ROOT, TF_NOISE, needs_embedded_data

from vit_jax.data import crop_decode


def sh(*cmd: str, cwd: str, env: dict | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, " ".join(cmd) + "\n" + proc.stdout[-2000:] + proc.stderr[-3000:]
    # No library start-up noise: nothing imports TensorFlow.
    noise = [line for line in proc.stderr.splitlines() if TF_NOISE.search(line)]
    assert not noise, noise
    return proc.stdout


def environment_site_dirs() -> list[str]:
    """The running environment's site-packages (a virtualenv's, a conda env's or the
    system's, and the user's where Python reads it). A virtualenv may live inside the
    checkout (`.venv/`): its site-packages still holds no source of the checkout's, and
    the editable install's .pth there is not read (the paths are added as plain lines)."""
    dirs = site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory):
    # `pip wheel --no-build-isolation` builds with this environment's setuptools, which a
    # Python 3.12 virtualenv does not have (the test extra installs it).
    pytest.importorskip("setuptools")
    build = tmp_path_factory.mktemp("wheel")
    # From a copy: setuptools builds in the source's build/, where modules since removed
    # would still be found and shipped; the native module an editable install built in
    # place is left behind too, so that the wheel ships one built for it.
    source = build / "source"
    skip = shutil.ignore_patterns(".git", "build", "workdirs", "*.egg-info", "__pycache__", "*.so")
    shutil.copytree(ROOT, source, ignore=skip)
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
       "-w", str(build), str(source), cwd=str(build))  # fmt: skip
    (wheel,) = [str(build / n) for n in os.listdir(build) if n.endswith(".whl")]
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("vit_jax/configs/fashion_mnist.py", "vit_jax/data/imagenet_classes.txt"):
        assert shipped in names
    assert not any(n.startswith(("configs/", "tests/", "benchmarks/")) for n in names)
    # A fresh venv with the wheel alone, its dependencies taken from the running
    # environment. `venv --system-site-packages` would inherit the *base* interpreter's
    # packages, not an active virtualenv's or conda env's: a .pth file of plain paths
    # adds the running environment's site-packages instead. Plain paths only, so the
    # .pth files there (the checkout's editable install among them) are not read.
    venv = tmp_path_factory.mktemp("venv")
    sh(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=str(build))
    python = str(venv / "bin" / "python")
    purelib = sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                 cwd=str(build)).strip()  # fmt: skip
    sh(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
       "--target", purelib, wheel, cwd=str(build))  # fmt: skip
    with open(os.path.join(purelib, "running_environment.pth"), "w") as f:
        f.write("".join(d + "\n" for d in environment_site_dirs()))
    return python, purelib


WHERE = """
import json, sys, absl, vit_jax
finders = [repr(f) for f in sys.meta_path if "editable" in repr(f).lower()]
print(json.dumps({"vit_jax": vit_jax.__file__, "absl": absl.__file__, "path": sys.path,
                  "editable_finders": finders}))
"""


@needs_embedded_data
def test_wheel_runs_a_preset_from_an_empty_directory(venv_python, tmp_path):
    python, purelib = venv_python
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    where = json.loads(sh(python, "-c", WHERE, cwd=str(empty), env=env))
    # The installed wheel, not the checkout, which is nowhere on the path nor a finder's.
    assert where["vit_jax"] == os.path.join(purelib, "vit_jax", "__init__.py"), where
    environment = set(environment_site_dirs())  # may lie inside the checkout (.venv/)
    inside = [p for p in where["path"] if p == ROOT or p.startswith(ROOT + os.sep)]
    assert not [p for p in inside if p not in environment], where
    assert not where["editable_finders"], where
    # The dependencies are the running environment's (this test runs in a venv, a conda
    # env or on the system interpreter alike).
    assert os.path.dirname(os.path.dirname(where["absl"])) in environment_site_dirs(), where
    work = tmp_path / "work"
    out = sh(python, "-m", "vit_jax.main", "--config=fashion_mnist:tiny", f"--workdir={work}",
             "--config.total_steps=4", "--config.checkpoint_every=0", "--config.eval_every=0",
             cwd=str(empty), env=env)  # fmt: skip
    assert "step 4/4" in out and "test accuracy" in out
    summary = json.loads((work / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["model"] == "Ti/4"
    # The commands read the architecture from what the package itself trained.
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("L", (28, 28), 128).save(image)
    out = sh(python, "-m", "vit_jax.infer", f"--checkpoint={work}/final.npz", f"--image={image}",
             "--top_k=2", cwd=str(empty), env=env)  # fmt: skip
    assert out.splitlines()[0] == str(image) and len(out.splitlines()) == 3


CROP = """
import io, numpy as np
from PIL import Image
from vit_jax.data import crop_decode
out = io.BytesIO()
Image.fromarray(np.full((20, 30, 3), 90, np.uint8)).save(out, "JPEG")
print(crop_decode.native().__file__, crop_decode.decode_crop(out.getvalue(), (2, 3, 4, 5)).shape)
"""


def test_wheel_builds_and_ships_the_native_crop_decoder(venv_python, tmp_path):
    """setup.py's extension, built where libjpeg-turbo's headers are (setup.sh installs
    them), is in the wheel and decodes there."""
    if crop_decode.native() is None:
        pytest.skip(f"{MISSING} {crop_decode.MISSING}")
    python, purelib = venv_python
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = sh(python, "-c", CROP, cwd=str(tmp_path), env=env).split()
    assert out[0].startswith(os.path.join(purelib, "vit_jax", "data", "_crop_decode.")), out
    assert out[1:] == ["(4,", "5,", "3)"]
