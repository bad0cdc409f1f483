"""`hf-hub:ORG/NAME[@REVISION]` names, read from a Hugging Face hub cache built here in the
hub's own layout, offline: by name, branch and commit; a name that is not there, and a
gated repository (a hub on loopback answering 401), each in one line. Nothing here
reaches the network: HF_ENDPOINT points at loopback throughout."""

import hashlib
import http.server
import json
import threading

import numpy as np
import pytest
from format_helpers import TINY, make
from helpers import images, logits

from vit_jax import weights
from vit_jax.weights import CheckpointError, convert, read

# Its constants are read at its import: here, before any test sets HF_HUB_OFFLINE.
hub_constants = pytest.importorskip("huggingface_hub.constants")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONFIG = dict(  # as timm's save_for_hf writes it
    architecture="vit_tiny_patch16_224",
    num_classes=7,
    num_features=32,
    global_pool="token",
    model_args=dict(num_classes=7, in_chans=3, global_pool="token", img_size=[32, 32]),
    pretrained_cfg=dict(input_size=[3, 32, 32], interpolation="bicubic", num_classes=7),
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A hub cache holding org/name at COMMIT (refs/main), files as blobs linked from the
    snapshot; the environment offline, its endpoint on a closed loopback port."""
    _, params, _ = make(TINY)
    weights.save_npz(tmp_path / "a.npz", params)
    convert.convert(tmp_path / "a.npz", "timm", tmp_path / "model.safetensors")
    files = {
        "config.json": json.dumps(CONFIG).encode(),
        "model.safetensors": (tmp_path / "model.safetensors").read_bytes(),
    }
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (repo / "snapshots" / COMMIT / name).symlink_to(f"../../blobs/{blob}")
    for k in ("HF_HOME", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: no network
    return tmp_path / "hub"


def test_a_hub_name_loads_from_the_cache_by_name_branch_and_commit(cache, monkeypatch):
    """By name, @main and @COMMIT: the snapshot's timm folder, read as the folder itself
    is; with HF_HOME instead of HF_HUB_CACHE, the same."""
    folder = cache / "models--org--name" / "snapshots" / COMMIT
    m, p, size = weights.load_model(folder)
    want = logits(m, p, images(32))
    assert read.detect_format("hf-hub:org/name") == "timm_folder"
    assert read.read_meta("hf-hub:org/name").architecture == "vit_tiny_patch16_224"
    for name in ("hf-hub:org/name", "hf-hub:org/name@main", f"hf-hub:org/name@{COMMIT}"):
        m2, p2, size2 = weights.load_model(name)
        assert (m2, size2) == (m, size), name
        np.testing.assert_array_equal(logits(m2, p2, images(32)), want, err_msg=name)
    home = cache.parent / "home"
    home.mkdir()
    (home / "hub").symlink_to(cache)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(home))
    np.testing.assert_array_equal(
        logits(m, weights.load_model("hf-hub:org/name")[1], images(32)), want
    )


def test_a_name_missing_offline_is_one_line_with_the_cache_and_the_command(cache):
    for name, fetch in [
        ("hf-hub:org/other", "`hf download org/other`"),
        ("hf-hub:org/name@v2", "`hf download org/name --revision v2`"),
    ]:
        with pytest.raises(FileNotFoundError) as e:
            weights.load_model(name)
        line = str(e.value)
        assert "\n" not in line and f"not in the hub cache {cache} and HF_HUB_OFFLINE" in line
        assert fetch in line, line
    with pytest.raises(CheckpointError, match="expected hf-hub:ORG/NAME"):
        weights.load_model("hf-hub:name-without-org")


class GatedHub(http.server.BaseHTTPRequestHandler):
    """The hub's answer to a gated repository's request without a token."""

    asked: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        GatedHub.asked.append(self.path)
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to model org/gated is restricted.")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_a_gated_repository_without_a_token_is_one_line_naming_the_login(cache, monkeypatch):
    """huggingface_hub asks the hub (here on loopback, answering as the hub does for a
    gated repository without a token: 401, X-Error-Code GatedRepo): one line, how to log in."""
    if hub_constants.HF_HUB_OFFLINE:
        pytest.skip("huggingface_hub was imported with HF_HUB_OFFLINE=1: it makes no request")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    try:
        with pytest.raises(CheckpointError) as e:
            weights.load_model("hf-hub:org/gated")
    finally:
        server.shutdown()
    line = str(e.value)
    assert "\n" not in line and line.startswith("hf-hub:org/gated: the hub answered 401")
    assert "`hf auth login`, or set HF_TOKEN" in line
    assert any("org/gated" in p for p in GatedHub.asked), GatedHub.asked
