"""The published-checkpoint table, and remote paths (never fetched in tests)."""

import functools
import http.server
import os
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
from format_helpers import TINY, make
from helpers import ROOT

from vit_jax import weights
from vit_jax.models import get_model
from vit_jax.weights import published, remote

README = Path(ROOT) / "README.md"


# Typed from the original release (google-research/vision_transformer README): the files in
# gs://vit_models, and for the fine-tuned ones the ImageNet top-1 of its "Expected results"
# table (two runs of its fine-tuning code each: the table holds their mean, to 2 decimals)
# or, for the -224 files, the accuracy its update of 29.10.2020 states.
RUNS = {"B_16": (84.62, 84.61), "B_32": (81.79, 81.79), "L_16": (85.07, 85.05)}
RUNS |= {"L_32": (81.78, 82.01)}
FILES = [f"imagenet21k/ViT-{v}.npz" for v in ("B_16", "B_32", "L_16", "L_32", "H_14")]
FILES += [f"imagenet21k+imagenet2012/ViT-{v}.npz" for v in RUNS]
FILES += ["imagenet21k+imagenet2012/ViT-B_16-224.npz", "imagenet21k+imagenet2012/ViT-L_16-224.npz"]
STATED_224 = {"ViT-B_16": 81.2, "ViT-L_16": 82.7}


def expected_row(file: str) -> tuple:
    """(name, pretraining, fine-tuned on, resolution, path, top-1) of a released file."""
    folder, base = file.split("/")
    name, fine_tuned = base.removesuffix(".npz").removesuffix("-224"), "+" in folder
    resolution = 224 if not fine_tuned or base.endswith("-224.npz") else 384
    accuracy = None
    if fine_tuned:
        runs = RUNS[name.removeprefix("ViT-")]
        accuracy = STATED_224[name] if resolution == 224 else round(sum(runs) / 2 + 1e-9, 2)
    tuned = "imagenet2012" if fine_tuned else None
    return name, "imagenet21k", tuned, resolution, f"gs://vit_models/{file}", accuracy


def test_table_holds_the_released_files_and_their_reported_accuracy():
    want = [expected_row(f) for f in FILES]
    keys = ("name", "pretraining", "fine_tuned_on", "resolution", "path", "accuracy")
    assert [tuple(c[k] for k in keys) for c in published.checkpoints()] == want
    assert [w[-1] for w in want if w[-1]] == [84.62, 81.79, 85.06, 81.9, 81.2, 82.7]
    for name, *_ in want:
        get_model(name, 1000)  # every name is a variant


def test_readme_table_is_the_released_files():
    """The README's rows read back cell by cell against the independent list above."""
    lines = README.read_text().splitlines()
    start = lines.index("| model | pretraining | fine-tuned on | resolution | file | top-1 (%) |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    want = [
        [n, p, t or "-", str(r), f"`{path}`", "-" if a is None else f"{a:.2f}"]
        for n, p, t, r, path, a in map(expected_row, FILES)
    ]
    assert rows == want


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
    assert str(remote.resolve("gs://vit_models/x/m.npz")) == str(local)
    got = weights.read_checkpoint("gs://vit_models/x/m.npz")
    np.testing.assert_array_equal(got["cls"], params["cls"])


def test_a_published_gs_path_is_its_public_https_address():
    """The bucket is public: no credentials, no gcsfs, no TensorFlow for the published
    files. Any other gs:// path is read in place (not cached: it may change)."""
    assert remote.url("gs://vit_models/imagenet21k/ViT-B_16.npz") == (
        "https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz"
    )
    assert remote.url("https://example.com/m.npz") == "https://example.com/m.npz"
    assert remote.url("gs://my_bucket/run/final.npz") is None
    assert str(remote.resolve("gs://my_bucket/run/final.npz")) == "gs://my_bucket/run/final.npz"


class Served:
    """A local stand-in for storage.googleapis.com: a directory over HTTP. With `broken`,
    a response sends half the file and closes the connection."""

    def __init__(self, root: Path):
        self.root, self.broken, self.seen = root, False, []
        served = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(served.root), **kwargs)

            def log_message(self, *args):
                pass

            def do_GET(self):
                served.seen.append(self.path)
                path = served.root / self.path.lstrip("/")
                if not served.broken or not path.is_file():
                    return super().do_GET()
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])  # then the connection drops

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_gs_path_is_copied_whole_over_https(monkeypatch, tmp_path):
    bucket = tmp_path / "served" / "vit_models" / "x"
    bucket.mkdir(parents=True)
    source = bucket / "m.npz"
    source.write_bytes(bytes(range(256)) * 1000)
    served = Served(tmp_path / "served")
    monkeypatch.setattr(remote, "PUBLIC_URL", served.url)  # storage.googleapis.com, here
    checked = []
    monkeypatch.setattr(remote, "check_network", checked.append)
    monkeypatch.setenv("VIT_JAX_CACHE", str(tmp_path / "cache"))
    local = tmp_path / "cache" / "vit_models" / "x" / "m.npz"
    try:
        # A copy broken off midway: nothing at the cache path, nothing half-written beside.
        served.broken = True
        with pytest.raises(ConnectionError, match="broke off after 128000 of 256000 bytes"):
            remote.resolve("gs://vit_models/x/m.npz")
        assert not local.parent.exists() or list(local.parent.iterdir()) == []
        # Whole: put in place only when complete; then read from the cache, no network.
        served.broken = False
        assert str(remote.resolve("gs://vit_models/x/m.npz")) == str(local)
        assert local.read_bytes() == source.read_bytes() and os.listdir(local.parent) == ["m.npz"]
        assert str(remote.resolve("gs://vit_models/x/m.npz")) == str(local)
        assert served.seen == ["/vit_models/x/m.npz"] * 2
        with pytest.raises(FileNotFoundError) as error:
            remote.resolve("gs://vit_models/x/other.npz")
    finally:
        served.close()
    assert str(error.value) == (
        f"{served.url}vit_models/x/other.npz: no such remote file (see the published checkpoints)"
    )
    assert sorted(os.listdir(local.parent)) == ["m.npz"]
    assert checked == [f"{served.url}vit_models/x/{n}" for n in ("m.npz", "m.npz", "other.npz")]


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
    url = f"http://127.0.0.1:{server.server_port}/x/m.npz"
    try:
        remote.check_network(url)  # the URL's own port, not 443
        local = Path(remote.resolve(url))
        with pytest.raises(FileNotFoundError, match="other.npz: no such remote file"):
            remote.resolve(url.replace("m.npz", "other.npz"))
    finally:
        server.shutdown()
        server.server_close()
    assert local == tmp_path / "cache" / f"127.0.0.1:{server.server_port}" / "x" / "m.npz"
    assert local.read_bytes() == (served / "x" / "m.npz").read_bytes()
    assert Path(remote.resolve(url)) == local  # the server is gone: the cached copy
    np.testing.assert_array_equal(weights.read_checkpoint(url)["cls"], params["cls"])


def test_check_network_tries_the_urls_own_port():
    """Reachability is the URL's own port: a closed one on loopback is named, an open one
    passes (a fixed 443 failed every http:// server on another port)."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(OSError, match=f"cannot reach 127.0.0.1 for http://127.0.0.1:{port}/m"):
        remote.check_network(f"http://127.0.0.1:{port}/m.npz", timeout=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        remote.check_network(f"http://127.0.0.1:{sock.getsockname()[1]}/m.npz", timeout=2)
