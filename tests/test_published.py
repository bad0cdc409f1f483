"""The published-checkpoint table, and remote paths (never fetched in tests)."""

import socket
from pathlib import Path

import numpy as np
import pytest
from format_helpers import TINY, make

from vit_jax import weights
from vit_jax.models import get_model
from vit_jax.weights import published, remote

README = Path(__file__).resolve().parents[1] / "README.md"


def test_table_is_complete_and_in_the_readme():
    rows = published.checkpoints()
    assert len(rows) >= 10
    for c in rows:
        get_model(c["name"], 1000)  # every name is a variant
        assert c["path"].startswith("gs://vit_models/") and c["path"].endswith(".npz")
        assert c["resolution"] in (224, 384)
        assert c["accuracy"] is None or 50 < c["accuracy"] < 100
    assert published.markdown() in README.read_text()


def test_remote_path_offline_fails_at_once(monkeypatch, tmp_path):
    monkeypatch.setenv("VIT_JAX_CACHE", str(tmp_path / "cache"))

    def offline(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", offline)
    path = "gs://vit_models/imagenet21k/ViT-B_16.npz"
    with pytest.raises(OSError, match="storage.googleapis.com.*no network access"):
        weights.read_checkpoint(path)
    with pytest.raises(OSError, match="no network access"):
        weights.load_pretrained(path, get_model("ViT-B_16", 10), 224)


def test_remote_path_reads_its_cached_copy(monkeypatch, tmp_path):
    monkeypatch.setenv("VIT_JAX_CACHE", str(tmp_path))
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("network"))
    model, params, _ = make(TINY)
    local = tmp_path / "vit_models" / "x" / "m.npz"
    local.parent.mkdir(parents=True)
    weights.save_npz(local, params)
    assert remote.fetch("gs://vit_models/x/m.npz") == local
    got = weights.read_checkpoint("gs://vit_models/x/m.npz")
    np.testing.assert_array_equal(got["cls"], params["cls"])
