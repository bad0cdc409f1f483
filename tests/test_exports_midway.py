"""Exports that fail midway leave nothing half-written: the convert command's ONNX writer
is made to fail after writing part of its output (a full disk), and neither --out nor a
temporary file beside it is left."""

from __future__ import annotations

import errno
import os

import pytest
from format_helpers import TINY, make
from helpers import run_command

from vit_jax import convert, weights
from vit_jax.weights import onnx_export

FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def checkpoint(tmp_path):
    _, params, _ = make(TINY)
    path = tmp_path / "in" / "m.npz"
    path.parent.mkdir()
    weights.save_npz(path, params)
    return str(path)


def fails_midway(tmp_path, capsys, fmt: str, out: str) -> str:
    """Runs the convert command; its one error line."""
    code = run_command(convert, f"--checkpoint={tmp_path}/in/m.npz", f"--format={fmt}",
                       f"--out={out}")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert "No space left on device" in err
    return err


@pytest.mark.parametrize("external", [False, True], ids=["one_file", "external_data"])
def test_onnx_export_that_fails_midway_leaves_nothing(
    checkpoint, tmp_path, capsys, monkeypatch, external
):
    onnx = pytest.importorskip("onnx")
    save_model, written = onnx.save_model, []

    def save_then_fail(proto, path, **kwargs):  # the whole graph (and data), then a failure
        save_model(proto, path, **kwargs)
        written.extend(sorted(os.listdir(os.path.dirname(path))))
        raise FULL

    monkeypatch.setattr(onnx, "save_model", save_then_fail)
    if external:  # every weight into m.onnx.data beside the graph
        monkeypatch.setattr(onnx_export, "EXTERNAL_ABOVE", 0)
    out = tmp_path / "out"
    out.mkdir()
    fails_midway(tmp_path, capsys, "onnx", str(out / "m.onnx"))
    assert written == (["m.onnx", "m.onnx.data"] if external else ["m.onnx"])
    assert os.listdir(out) == []
