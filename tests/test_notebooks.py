"""The notebooks run top to bottom offline, say what they should, and leave nothing
behind in the temporary directory."""

import os
import re

import pytest
from helpers import ROOT

# What running a notebook needs (the notebooks extra): without it these tests skip, and
# fail under CI=true (conftest.py).
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = os.path.join(ROOT, "notebooks")


def execute(name, monkeypatch, tmp_path):
    """Runs the notebook with a temporary directory of its own (TMPDIR) and checks that
    it is empty afterwards; the kernel's shutdown (atexit) is part of the run."""
    monkeypatch.setenv("XLA_FLAGS", "")  # one CPU device, as a user's kernel has
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}
    ).execute()
    # The last cell removed the notebook's work directory, which was under TMPDIR.
    (work,) = re.findall(r"^removed (\S+): True$", text_of(nb), re.MULTILINE)
    assert os.path.dirname(work) == str(temp), work
    # Not the system temporary directory: the kernel's is TMPDIR, and the tests running
    # beside this one (pytest-xdist) make and remove vit_* there while the notebook runs.
    assert os.listdir(temp) == []
    return nb


def text_of(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


pytestmark = pytest.mark.slow  # minutes each: CI runs them with -m slow


def published_b16(path):
    """A file in the layout of gs://vit_models/imagenet21k/ViT-B_16.npz: ViT-B/16 with its
    768-wide pre_logits layer and 21,843-class head (random weights)."""
    from helpers import random_params

    from vit_jax import weights
    from vit_jax.models import get_model

    model = get_model("ViT-B_16", 21843, representation_size=768)
    weights.save_npz(path, random_params(model, 224))


def prepare_tiny_cifar10(root):
    """A prepared TFDS 'cifar10' (ArrayRecord) of 48 train and 16 test images, in the
    layout tfds.builder('cifar10', data_dir=root) finds: its download_and_prepare is a no-op."""
    tfds = pytest.importorskip("tensorflow_datasets")
    pytest.importorskip("tensorflow")  # preparing a TFDS dataset needs it
    import numpy as np
    from tensorflow_datasets.image_classification import cifar

    with tfds.core.registered.skip_registration():

        class TinyCifar10(cifar.Cifar10):
            name = "cifar10"

            def _split_generators(self, dl_manager):
                return {"train": self._examples(0, 48), "test": self._examples(48, 64)}

            def _examples(self, lo, hi):
                rng = np.random.default_rng(lo)
                for i in range(lo, hi):
                    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                    yield i, {"id": f"x_{i}", "image": image, "label": i % 10}

    skip = tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP)
    TinyCifar10(data_dir=str(root), file_format="array_record").download_and_prepare(
        download_config=skip
    )


def test_tour(monkeypatch, tmp_path):
    """The whole tour, its online section included: a published-layout ViT-B/16 served over
    HTTP on loopback, a tiny prepared CIFAR-10, 2 steps at batch 8 and 64 px."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    published_b16(served / "ViT-B_16.npz")
    prepare_tiny_cifar10(tmp_path / "tfds")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/ViT-B_16.npz"
    for key, value in {
        "CHECKPOINT": url,
        "TFDS_DIR": str(tmp_path / "tfds"),
        "STEPS": "2",
        "BATCH": "8",
        "IMAGE_SIZE": "64",
    }.items():
        monkeypatch.setenv(f"VIT_JAX_TOUR_{key}", value)
    monkeypatch.setenv("VIT_JAX_CACHE", str(tmp_path / "cache"))
    try:
        nb = execute("vit_jax.ipynb", monkeypatch, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    text = text_of(nb)
    assert (tmp_path / "cache" / f"127.0.0.1:{server.server_port}" / "ViT-B_16.npz").is_file()
    found = re.search(r"CIFAR-10 test accuracy after 2 steps: ([0-9.]+) \(", text)
    assert found and 0.0 <= float(found[1]) <= 1.0, text[-2000:]
    assert "skipped itself" not in text
    assert "ViT-H_14" in text and "632,045,800 parameters" in text
    accuracy = float(text.split("fine-tuned test accuracy: ")[1].split()[0])
    assert accuracy > 0.4  # five classes: chance is 0.2
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 2


def test_inspect(monkeypatch, tmp_path):
    nb = execute("inspect.ipynb", monkeypatch, tmp_path)
    text = text_of(nb)
    assert "similarity of each embedding with itself: True" in text
    distances = [
        float(v)
        for line in text.splitlines()
        if line.startswith("layer ")
        for v in line.split(":")[1].split()[:-1]
    ]
    assert len(distances) == 4 * 4 and all(0.0 < d < 28 * 1.5 for d in distances)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # the relevance maps' figure too
    (line,) = [x for x in text.splitlines() if x.startswith("correlation of each image's two")]
    corr = [float(v) for v in line.split("[")[1].rstrip("]").split()]
    assert len(corr) == 6 and all(-1 <= c <= 1 for c in corr) and min(corr) < 0.99  # differ


def test_tour_online_section_skips_itself_offline(monkeypatch, capsys):
    """Section 5's cell with its checkpoint on a port nothing listens on: one line saying
    it skipped itself and why, and no training (run without a kernel: the cell's source
    in a namespace with what the earlier cells define)."""
    import json
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("VIT_JAX_TOUR_CHECKPOINT", f"http://127.0.0.1:{port}/ViT-B_16.npz")
    with open(os.path.join(NOTEBOOKS, "vit_jax.ipynb")) as f:
        cells = json.load(f)["cells"]
    (source,) = ["".join(c["source"]) for c in cells if "CHECKPOINT_URL" in "".join(c["source"])]

    class NoTraining:
        def run(self, *args, **kwargs):
            raise AssertionError("trained while offline")

    exec(source, {"os": os, "train": NoTraining(), "WORK": "/nonexistent"})  # noqa: S102
    out = capsys.readouterr().out
    assert out.startswith("section 5 skipped itself: offline (cannot reach 127.0.0.1"), out
    assert len(out.splitlines()) == 1
