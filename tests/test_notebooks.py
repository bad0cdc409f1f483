"""The notebooks run top to bottom offline, and say what they should."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")


def execute(name, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # one CPU device, as a user's kernel has
    nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}
    ).execute()
    return nb


def text_of(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


pytestmark = pytest.mark.slow  # minutes each: CI runs them with -m slow


def test_tour(monkeypatch):
    nb = execute("vit_jax.ipynb", monkeypatch)
    text = text_of(nb)
    assert "ViT-H_14" in text and "632,045,800 parameters" in text
    accuracy = float(text.split("fine-tuned test accuracy: ")[1].split()[0])
    assert accuracy > 0.4  # five classes: chance is 0.2
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 2


def test_inspect(monkeypatch):
    nb = execute("inspect.ipynb", monkeypatch)
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
