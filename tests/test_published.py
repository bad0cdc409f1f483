"""The published-checkpoint table, and remote paths (never fetched in tests)."""

import functools
import http.server
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
from etils import epath
from format_helpers import TINY, make
from helpers import ROOT

from vit_jax import weights
from vit_jax.models import get_model
from vit_jax.weights import published, remote

README = Path(ROOT) / "README.md"


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


def test_copy_goes_through_epath_whole_or_not_at_all(tmp_path):
    source = tmp_path / "bucket" / "m.npz"
    source.parent.mkdir()
    source.write_bytes(bytes(range(256)) * 1000)
    local = tmp_path / "cache" / "vit_models" / "m.npz"
    remote.copy(epath.Path(source), local)
    assert local.read_bytes() == source.read_bytes()
    with pytest.raises(FileNotFoundError, match="nothing.npz: no such remote file"):
        remote.copy(tmp_path / "bucket" / "nothing.npz", tmp_path / "cache" / "nothing.npz")
    assert sorted(p.name for p in (tmp_path / "cache" / "vit_models").iterdir()) == ["m.npz"]
    assert not (tmp_path / "cache" / "nothing.npz").exists()


def test_http_path_is_fetched_once_into_the_cache(monkeypatch, tmp_path):
    """From a server on this machine: no network needed."""
    model, params, _ = make(TINY)
    served = tmp_path / "served"
    (served / "x").mkdir(parents=True)
    weights.save_npz(served / "x" / "m.npz", params)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("VIT_JAX_CACHE", str(tmp_path / "cache"))
    checked = []
    monkeypatch.setattr(remote, "check_network", checked.append)
    url = f"http://127.0.0.1:{server.server_port}/x/m.npz"
    try:
        local = remote.fetch(url)
        with pytest.raises(FileNotFoundError, match="other.npz: no such remote file"):
            remote.fetch(url.replace("m.npz", "other.npz"))
    finally:
        server.shutdown()
        server.server_close()
    assert local == tmp_path / "cache" / f"127.0.0.1:{server.server_port}" / "x" / "m.npz"
    assert local.read_bytes() == (served / "x" / "m.npz").read_bytes()
    assert remote.fetch(url) == local  # the server is gone: the cached copy
    assert checked == [url, url.replace("m.npz", "other.npz")]
    np.testing.assert_array_equal(weights.read_checkpoint(url)["cls"], params["cls"])
