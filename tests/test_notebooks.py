"""The notebooks run top to bottom offline, say what they should, and leave nothing
behind in the temporary directory."""

import glob
import os
import re
import tempfile

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
    system_temp = tempfile.gettempdir()  # where the notebooks used to leave vit_* behind
    before = set(glob.glob(os.path.join(system_temp, "vit_*")))
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
    assert os.listdir(temp) == []
    assert set(glob.glob(os.path.join(system_temp, "vit_*"))) <= before
    return nb


def text_of(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


pytestmark = pytest.mark.slow  # minutes each: CI runs them with -m slow


def test_tour(monkeypatch, tmp_path):
    nb = execute("vit_jax.ipynb", monkeypatch, tmp_path)
    text = text_of(nb)
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
    assert len(images) >= 4
