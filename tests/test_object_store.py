"""A run's workdir and its data on an object store, against a real GCS server on loopback
(gcp-storage-emulator, `gcs_emulator.py`) and moto's S3 server: no mocks. The clients
reach them as they reach the real stores: gcsfs through STORAGE_EMULATOR_HOST, TensorStore
(Orbax's arrays) through TENSORSTORE_GCS_HTTP_URL, s3fs through an endpoint URL.

What a pod needs: nothing of the run is written to local disk, everything it keeps is on
the store (checkpoints with their records, the lock, events, summary.json, final.npz),
a rerun of a finished workdir is a no-op, a damaged checkpoint is set aside, the commands
read checkpoints from the store and write their outputs there."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from unittest import mock

import jax
import numpy as np
import pytest
from helpers import (
    MISSING,
    ROOT,
    assert_npz_equal,
    needs_embedded_data,
    python_m,
    read_scalars,
    run_command,
    tiny_config,
)

from vit_jax.base import store
from vit_jax.training import report, train
from vit_jax.workdir import lock, verify
from vit_jax.workdir.checkpoints import Checkpoints

# gcsfs decides at import whether to probe each bucket's type over gRPC, which the
# emulator does not serve (60 s per filesystem object): off, before it is imported.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
gcsfs = pytest.importorskip("gcsfs", reason=f"{MISSING} gcsfs (pip install -e '.[gcs]')")
pytest.importorskip("gcp_storage_emulator", reason=f"{MISSING} gcp-storage-emulator")

import gcs_emulator  # noqa: E402  (tests/, after the skip)

BUCKET = "bkt"
# 12 steps, a checkpoint every 4 (2 kept), dropout on: what is restored matters.
RUN = {"total_steps": 12, "checkpoint_every": 4, "keep_checkpoints": 2, "eval_every": 6}
RUN.update({"log_every": 4, "model.dropout": 0.1})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The GCS emulator in a subprocess, and the environment that points clients at it."""

    def __init__(self, data_dir: str | None = None):
        self.port, self.data_dir = free_port(), data_dir
        self.env = gcs_emulator.env(self.port)
        self.proc = gcs_emulator.serve(self.port, BUCKET, data_dir)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def start_again(self) -> None:
        self.proc = gcs_emulator.serve(self.port, BUCKET, self.data_dir)


@pytest.fixture(scope="module")
def gcs():
    """The emulator for this module's tests, and the clients of this process pointed at
    it (a cached gcsfs instance of another server is dropped)."""
    server = Server()
    try:
        with gcs_emulator.clients_at(server.port):
            yield server
    finally:
        server.stop()


def fs():
    return gcsfs.GCSFileSystem()


def objects(prefix: str) -> dict[str, tuple[int, str]]:
    """{path below prefix: (size, generation)} of every object under gs://prefix."""
    found = fs().find(prefix.removeprefix("gs://"), detail=True)
    root = prefix.removeprefix("gs://").rstrip("/") + "/"
    return {k[len(root) :]: (int(v["size"]), str(v.get("generation"))) for k, v in found.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same run on local disk: what the store's runs must equal, bit for bit."""
    workdir = str(tmp_path_factory.mktemp("local") / "run")
    train.run(tiny_config(**RUN), workdir)
    return workdir


@needs_embedded_data
def test_a_run_on_gs_keeps_everything_there_and_a_rerun_is_a_no_op(
    gcs, reference, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # where a mangled path ('gs:/bkt/...') would land
    workdir = f"gs://{BUCKET}/run"
    summary = train.run(tiny_config(**RUN), workdir)
    out = capsys.readouterr().out
    assert f"step 4: saving checkpoint {workdir}/checkpoints/4" in out, out
    assert os.listdir(tmp_path) == []  # nothing local: no 'gs:' directory, no temporary
    kept = objects(workdir)
    names = set(kept)
    assert {"summary.json", "final.npz"} <= names
    assert {n.split("/")[1] for n in names if n.startswith("checkpoints/")} == {"8", "12"}
    for step in ("8", "12"):  # Orbax's commit file and the integrity record, on the store
        assert {f"checkpoints/{step}/commit_success.txt",
                f"checkpoints/{step}/integrity.json"} <= names  # fmt: skip
    assert not any(n.startswith(lock.NAME) for n in names)  # released
    assert json.loads(fs().cat(f"{BUCKET}/run/summary.json"))["steps"] == 12
    assert summary["steps"] == 12
    # TensorBoard's scalars, read back from the bucket (the file uploaded whole).
    scalars = read_scalars(workdir)
    assert [s for s, _ in scalars["loss"]] == [1, 4, 8, 12]
    assert [s for s, _ in scalars["eval/accuracy"]] == [6, 12]
    # Bit for bit the run on local disk: final.npz read from the bucket.
    local = tmp_path.parent / "from_store.npz"
    local.write_bytes(fs().cat(f"{BUCKET}/run/final.npz"))
    assert_npz_equal(str(local), f"{reference}/final.npz")
    local.unlink()
    # A rerun: one line, the stored results, and no object written again.
    train.run(tiny_config(**RUN), workdir)
    out = capsys.readouterr().out
    assert out.startswith(f"{workdir}: finished at step 12 (summary.json); nothing to do"), out
    assert objects(workdir) == kept  # sizes and generations alike
    assert os.listdir(tmp_path) == []


@needs_embedded_data
def test_a_damaged_checkpoint_on_gs_is_set_aside_and_the_one_before_restored(
    gcs, reference, capsys
):
    workdir = f"gs://{BUCKET}/damaged"
    train.run(tiny_config(**RUN), workdir)
    data = sorted(n for n in objects(workdir) if n.startswith("checkpoints/12/") and "/d/" in n)
    for name in data:  # 64 bytes flipped in every array file of the newest checkpoint
        path = f"{BUCKET}/damaged/{name}"
        blob = bytearray(fs().cat(path))
        mid = len(blob) // 2
        blob[mid - 32 : mid + 32] = bytes(b ^ 0xFF for b in blob[mid - 32 : mid + 32])
        fs().pipe_file(path, bytes(blob))
    rows = dict(verify.verify(Checkpoints(f"{workdir}/checkpoints", read_only=True)))
    assert rows["8"] == "verifies" and rows["12"].startswith("DAMAGED: "), rows
    fs().rm(f"{BUCKET}/damaged/summary.json")  # so that the run is not finished
    capsys.readouterr()
    train.run(tiny_config(**RUN), workdir)
    out = capsys.readouterr().out
    assert f"checkpoint {workdir}/checkpoints/12 is damaged: " in out, out
    assert f"Set aside as {workdir}/damaged/12 (nothing deleted)" in out
    assert "resuming from step 8 " in out
    names = set(objects(workdir))
    assert {"damaged/12/commit_success.txt", "damaged/12/integrity.json"} <= names
    # The resumed run saved step 12 anew, and that one verifies.
    rows = dict(verify.verify(Checkpoints(f"{workdir}/checkpoints", read_only=True)))
    assert rows == {"8": "verifies", "12": "verifies", "damaged/12": rows["damaged/12"]}, rows
    local = os.path.join(os.path.dirname(reference), "damaged.npz")
    with open(local, "wb") as f:
        f.write(fs().cat(f"{BUCKET}/damaged/final.npz"))
    assert_npz_equal(local, f"{reference}/final.npz")


def test_verify_calls_a_bucket_that_does_not_answer_an_outage_and_a_disk_damage(
    gcs, tmp_path, monkeypatch
):
    """`checkpoints verify` outside a run (no window to ride an outage out): a restore from
    the bucket that fails as TensorStore fails once its retries have (test_outage's texts)
    raises that error, never DAMAGED; the same words from a local disk, which has no
    outage (a path may hold 'reset' or 'timeout'), are damage. The failure is put into
    Orbax's restore: the emulator cannot be stopped between the record's read and it."""
    said = ValueError("ABORTED: All 32 retry attempts failed: CURL error Could not connect")
    for where in (f"gs://{BUCKET}/verify_outage", f"{tmp_path}/connect_reset"):
        kept = Checkpoints(f"{where}/checkpoints")
        kept.save(4, jax.device_put({"w": np.ones((2, 3), np.float32)}))
        kept.wait()
        assert verify.verify(kept) == [("4", "verifies")]
        monkeypatch.setattr(kept.manager, "restore", mock.Mock(side_effect=said))
        if where.startswith("gs://"):
            with pytest.raises(ValueError, match="CURL error Could not connect"):
                verify.verify(kept)
        else:
            assert verify.verify(kept) == [("4", "DAMAGED: it is unreadable (ABORTED)")]


def test_the_lock_on_gs_is_a_create_if_absent_by_the_store(gcs, capsys):
    """Two writers racing for the lock: the store's precondition (ifGenerationMatch=0)
    lets one win, never both; a live holder refuses a second run, a stale one is taken
    over."""
    path = f"gs://{BUCKET}/locked/{lock.NAME}"
    assert store.PLAIN.create_new(path, b"first") is True
    assert store.PLAIN.create_new(path, b"second") is False
    assert fs().cat(path.removeprefix("gs://")) == b"first"
    fs().rm(path.removeprefix("gs://"))
    workdir = f"gs://{BUCKET}/locked"
    with lock.held(workdir):
        holder = json.loads(fs().cat(path.removeprefix("gs://")))
        assert holder["pid"] == os.getpid()
        elsewhere = dict(holder, host="another-host", pid=1, started="then")
        again = lock.acquire(workdir)  # this very process's lock (host, pid, start): its own
        assert lock.ours(again, holder) and lock.ours(holder, again)
        assert json.loads(fs().cat(path.removeprefix("gs://"))) == again
    assert not fs().exists(path.removeprefix("gs://"))  # released
    fs().pipe_file(path.removeprefix("gs://"), json.dumps(elsewhere).encode())
    with pytest.raises(lock.WorkdirLocked, match=f"lock {path}, heartbeat"):
        lock.acquire(workdir)  # another host, beating now: refused, nothing changed
    stale = dict(elsewhere, beat_at=time.time() - 2 * lock.STALE_SECONDS)
    fs().pipe_file(path.removeprefix("gs://"), json.dumps(stale).encode())
    with lock.held(workdir):
        pass
    assert "taking over the lock of gs://bkt/locked from host another-host" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("runs", [2, 3])
def test_runs_racing_for_one_stale_lock_on_gs_exactly_one_holds_it(gcs, monkeypatch, capsys, runs):
    """Every run has judged the lock stale and reached its removal before any removes it,
    then they go on one at a time: the removal is conditional on the generation judged
    (ifGenerationMatch), so only the first removes it; the others find its lock."""
    import fsspec.asyn
    from test_lock import GONE, assert_one_holds, race

    workdir = f"gs://{BUCKET}/race{runs}"
    key = f"{BUCKET}/race{runs}/{lock.NAME}"
    stale = dict(GONE, beat_at=time.time() - 2 * lock.STALE_SECONDS)
    fs().pipe_file(key, json.dumps(stale).encode())

    def hook(at_removal) -> None:
        real = fsspec.asyn.sync

        def sync(loop, func, *args, **kwargs):  # every gcsfs call of a thread goes here
            name, target = getattr(func, "__name__", ""), "/".join(map(str, args[-2:]))
            deleting = name == "_call" and args[:1] == ("DELETE",) and target == key
            if deleting or (name.startswith("_rm") and key in str(args[:1])):
                at_removal()
            return real(loop, func, *args, **kwargs)

        monkeypatch.setattr(fsspec.asyn, "sync", sync)

    results = race(workdir, runs, monkeypatch, hook)
    monkeypatch.undo()
    assert_one_holds(results, json.loads(fs().cat(key)), capsys)
    assert objects(workdir) == {lock.NAME: objects(workdir)[lock.NAME]}


def test_a_heartbeat_on_gs_never_overwrites_a_lock_taken_over(gcs):
    workdir = f"gs://{BUCKET}/beaten"
    key = f"{BUCKET}/beaten/{lock.NAME}"
    mine = lock.acquire(workdir)
    lock.beat(store.path(f"gs://{key}"), mine)  # its own: rewritten, a new generation
    assert json.loads(fs().cat(key))["beat_at"] > mine["beat_at"]
    other = json.dumps(dict(mine, host="other", beat_at=time.time())).encode()
    fs().rm(key)
    fs().pipe_file(key, other)  # another run took it over
    with pytest.raises(lock.LockLost, match=f"the lock gs://{key} was taken over by another"):
        lock.beat(store.path(f"gs://{key}"), mine)
    lock.release(workdir, mine)
    assert fs().cat(key) == other  # neither rewritten nor removed


def test_an_empty_lock_on_gs_ages_by_the_objects_updated_time(gcs, capsys):
    workdir = f"gs://{BUCKET}/empty"
    fs().pipe_file(f"{BUCKET}/empty/{lock.NAME}", b"")  # died between create and write
    with pytest.raises(lock.WorkdirLocked, match="heartbeat 0s ago"):
        lock.acquire(workdir, stale_after=2.0)
    time.sleep(2.5)
    mine = lock.acquire(workdir, stale_after=2.0)
    assert json.loads(fs().cat(f"{BUCKET}/empty/{lock.NAME}")) == mine
    assert "taking over the lock of gs://bkt/empty from host None" in capsys.readouterr().out


@needs_embedded_data
def test_the_commands_read_a_checkpoint_on_gs_and_write_their_outputs_there(gcs, reference, capsys):
    """evaluate, fewshot, infer, figures and convert, each with --checkpoint on the store
    (a run's final.npz uploaded there) and, where they write, --out on the store."""
    from PIL import Image

    from vit_jax import convert, evaluate, fewshot, figures, infer

    fs().put_file(f"{reference}/final.npz", f"{BUCKET}/cmd/final.npz")
    checkpoint = f"gs://{BUCKET}/cmd/final.npz"
    picture = io.BytesIO()
    Image.fromarray(np.full((28, 28), 128, np.uint8)).save(picture, format="PNG")
    fs().pipe_file(f"{BUCKET}/cmd/image.png", picture.getvalue())

    capsys.readouterr()
    assert run_command(evaluate, f"--checkpoint={checkpoint}", "--dataset=fashion_mnist",
                       "--split=test[:64]", "--noprogress") == 0  # fmt: skip
    assert "on fashion_mnist test[:64] (64 images): top-1 " in capsys.readouterr().out
    assert run_command(fewshot, f"--checkpoint={checkpoint}", "--shots=1",
                       "--test_split=test[:64]") == 0  # fmt: skip
    assert "1-shot" in capsys.readouterr().out
    assert run_command(infer, f"--checkpoint={checkpoint}", f"--image=gs://{BUCKET}/cmd/image.png",
                       "--top_k=2") == 0  # fmt: skip
    assert "image.png" in capsys.readouterr().out
    assert run_command(figures, f"--checkpoint={checkpoint}", f"--out=gs://{BUCKET}/cmd/figs",
                       "--num_images=2") == 0  # fmt: skip
    written = set(objects(f"gs://{BUCKET}/cmd/figs"))
    assert {"attention_rollout.png", "inspect.json"} <= written, written
    for fmt, out in (("npz", "model.npz"), ("hf", "hf")):
        code = run_command(convert, f"--checkpoint={checkpoint}", f"--format={fmt}",
                           f"--out=gs://{BUCKET}/cmd/{out}")  # fmt: skip
        assert code == 0, capsys.readouterr().err
    written = set(objects(f"gs://{BUCKET}/cmd"))
    assert "model.npz" in written and "hf/config.json" in written, written
    local = os.path.join(os.path.dirname(reference), "converted.npz")
    with open(local, "wb") as f:
        f.write(fs().cat(f"{BUCKET}/cmd/model.npz"))
    assert_npz_equal(local, f"{reference}/final.npz")


def test_an_image_folder_on_gs_trains_and_evaluates(gcs, tmp_path, capsys):
    """DIR/<split>/<class>/*.png on the bucket: listed once, read by path, nothing cached."""
    from PIL import Image

    from vit_jax import evaluate

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("test", 6)):
        for c, name in enumerate(("circle", "square")):
            for i in range(n):
                pixels = rng.integers(0, 60, (20, 20, 3)) + 150 * c
                buffer = io.BytesIO()
                Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
                fs().pipe_file(f"{BUCKET}/folder/{split}/{name}/{i}.png", buffer.getvalue())
    root, workdir = f"gs://{BUCKET}/folder", f"gs://{BUCKET}/folder_run"
    config = tiny_config(total_steps=4, checkpoint_every=4, eval_every=4, batch_size=8,
                         eval_batch_size=8, image_size=16)  # fmt: skip
    config.dataset.update(source="folder", data_dir=root, name="shapes", num_classes=2,
                          train_split="train", test_split="test")  # fmt: skip
    config.model.patch_size = 4
    config.fewshot.enabled = False
    summary = train.run(config, workdir)
    assert summary["steps"] == 4
    capsys.readouterr()
    assert run_command(evaluate, f"--checkpoint={workdir}/final.npz", "--source=folder",
                       f"--data_dir={root}", "--noprogress") == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "12 images" in out or "accuracy" in out, out
    assert os.listdir(tmp_path) == []


def test_a_tfds_data_dir_on_a_store_is_one_line_naming_what_works():
    """ArrayRecord cannot read a bucket: refused up front, with the two ways that work."""
    from vit_jax.training import check

    config = tiny_config()
    config.dataset.update(source="tfds", name="cifar10", data_dir="gs://bkt/tfds")
    with pytest.raises(ValueError) as error:
        check.check(config)
    line = str(error.value)
    assert "dataset.data_dir='gs://bkt/tfds'" in line
    assert "mount the bucket" in line and "copy the prepared dataset to a local disk" in line


@needs_embedded_data
def test_a_workdir_on_a_missing_bucket_is_one_line_and_leaves_nothing(gcs, tmp_path):
    done = python_m(
        "vit_jax.main",
        "--config=fashion_mnist:tiny",
        "--workdir=gs://no-such-bucket/run",
        env={**gcs.env, "PYTHONPATH": ROOT},
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert lines == [
        "error: workdir gs://no-such-bucket/run is not writable (no such bucket or object: "
        "check the bucket name (create the bucket first)): choose another workdir",
        "(for the Python traceback, set VIT_JAX_DEBUG=1)",
    ]
    assert not os.path.exists(os.path.join(ROOT, "gs:"))


def test_an_event_file_the_bucket_refuses_leaves_no_staging_copy(gcs, tmp_path, monkeypatch):
    """The event file of a gs:// workdir is staged in a local temporary directory; when the
    store refuses the upload, the error names the bucket and the staging copy is gone all the
    same (it was left in /tmp at every such exit: a refusal, an outage)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logdir = f"gs://{gcs_emulator.DENIED}bkt/run"
    resume = lambda: "Run the same command again to resume."  # noqa: E731
    with pytest.raises(OSError) as error, report.EventWriter(logdir, resume) as writer:
        assert [n[:15] for n in os.listdir(tmp_path)] == ["vit_jax_events_"]
        writer.write_scalars(1, {"loss": 0.5})  # the first write uploads at once
    assert str(error.value) == (
        f"could not write TensorBoard events in {logdir}: permission denied: the account needs "
        "read and write access to the bucket. Run the same command again to resume."
    )
    assert os.listdir(tmp_path) == []


def test_a_denied_write_and_missing_credentials_are_one_line_each(gcs, tmp_path):
    """A bucket this account may only read (the server answers 403): the run stops before
    training with one line; a client without credentials gets the way to provide them."""
    from vit_jax.workdir.workdir import Workdir

    with pytest.raises(OSError) as error:
        Workdir.at(f"gs://{gcs_emulator.DENIED}bkt/run").check_writable()
    assert str(error.value) == (
        f"workdir gs://{gcs_emulator.DENIED}bkt/run is not writable (permission denied: the "
        "account needs read and write access to the bucket): choose another workdir"
    )
    # What gcsfs raises when Google's auth finds no credentials, and a 401 from the store.
    from google.auth.exceptions import DefaultCredentialsError

    for raised in (DefaultCredentialsError("Your default credentials were not found."),
                   gcsfs.retry.HttpError({"code": 401, "message": "Unauthorized"})):  # fmt: skip
        assert store.explain(raised, "gs://b/run").startswith(
            "no credentials for the store: run `gcloud auth application-default login`"
        ), raised


def test_tensorflow_does_not_change_the_backend(gcs):
    """With TensorFlow importable, etils would send gs:// through tf.io.gfile; the package
    keeps one backend (fsspec), so the two installs behave alike."""
    pytest.importorskip("tensorflow", reason=f"{MISSING} tensorflow (the [tf] extra)")
    code = (
        "import tensorflow, sys\n"
        "from vit_jax.base import store\n"
        "from etils.epath import backend\n"
        "p = store.path('gs://bkt/tf/x.txt')\n"
        "p.write_text('written')\n"
        "print(p._backend is backend.fsspec_backend, p.read_text())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **gcs.env}, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "written"]
    assert fs().cat(f"{BUCKET}/tf/x.txt") == b"written"


@contextlib.contextmanager
def moto_server():
    """moto's S3 server on loopback; yields its endpoint."""
    pytest.importorskip("moto.server", reason=f"{MISSING} moto[server]")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_s3_create_if_absent_and_whole_files(monkeypatch):
    """The same path layer on s3:// (s3fs; If-None-Match for the lock)."""
    s3fs = pytest.importorskip("s3fs", reason=f"{MISSING} s3fs (pip install -e '.[s3]')")
    from vit_jax.base import files

    with moto_server() as url:
        keys = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
        for k, v in {**keys, "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url}.items():
            monkeypatch.setenv(k, v)
        s3fs.S3FileSystem.clear_instance_cache()
        s3 = s3fs.S3FileSystem()
        s3.mkdir("bkt")
        assert store.PLAIN.create_new("s3://bkt/run/run.lock", b"one") is True
        assert store.PLAIN.create_new("s3://bkt/run/run.lock", b"two") is False
        assert s3.cat("bkt/run/run.lock") == b"one"
        with files.atomic_write("s3://bkt/run/summary.json", "w") as f:
            f.write("{}")
        with pytest.raises(RuntimeError), files.atomic_write("s3://bkt/run/x.json", "w") as f:
            f.write("half")
            raise RuntimeError("a full disk")
        assert store.PLAIN.walk_files("s3://bkt/run") == {"run.lock": 3, "summary.json": 2}
        s3fs.S3FileSystem.clear_instance_cache()


@needs_embedded_data
def test_a_workdir_on_s3_is_refused_in_one_line_before_any_work(tmp_path):
    """Orbax 0.12.8 saves arrays to gs:// or a local path only (an s3:// run failed at its
    first checkpoint): refused before anything is written, naming what works; the commands
    that read a run's workdir refuse it alike."""
    pytest.importorskip("s3fs", reason=f"{MISSING} s3fs (pip install -e '.[s3]')")
    from vit_jax.workdir.workdir import Workdir

    with moto_server() as url:
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
        env.update(AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=url, PYTHONPATH=ROOT)
        s3 = [sys.executable, "-c", "import s3fs, sys; fs = s3fs.S3FileSystem(); "
              "fs.mkdir('bkt') if sys.argv[1] == 'make' else print(fs.find('bkt'))"]  # fmt: skip
        subprocess.run([*s3, "make"], env={**os.environ, **env}, check=True, timeout=60)
        done = python_m(
            "vit_jax.main", "--config=fashion_mnist:tiny", "--workdir=s3://bkt/run", env=env
        )
        listed = subprocess.run([*s3, "list"], env={**os.environ, **env}, timeout=60,
                                capture_output=True, text=True, check=True)  # fmt: skip
    line = store.NO_S3_WORKDIR.format(p="s3://bkt/run")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {line}",
        "(for the Python traceback, set VIT_JAX_DEBUG=1)",
    ]
    assert "use a gs:// workdir or a local or NFS path" in line
    assert listed.stdout.strip() == "[]"  # nothing written: no lock, no probe
    assert not os.path.exists(os.path.join(ROOT, "s3:"))
    for opened in (Workdir.at, lambda p: Checkpoints(f"{p}/checkpoints", read_only=True)):
        with pytest.raises(ValueError, match="^workdir s3://bkt/run"):
            opened("s3://bkt/run")


def test_a_save_failing_not_by_the_store_does_not_blame_it(gcs, tmp_path):
    """A save that failed on a bad path or a format's limit (an s3:// path once met Orbax's
    'should be absolute') says to fix it, not to wait for the store; a denied write still
    waits for the store to let the account write."""
    limit = ValueError("Checkpoint path should be absolute. Got s3:/bkt/run/checkpoints/4")
    denied = PermissionError("403 Forbidden")
    for directory in (f"gs://{BUCKET}/blame/checkpoints", str(tmp_path)):
        saver = Checkpoints(directory, read_only=True)
        for error, stores in ((limit, False), (denied, True)):
            with pytest.raises(OSError) as raised:
                saver.failed(4, error)
            line = str(raised.value)
            assert line.startswith(f"could not save checkpoint step 4 in {directory}: "), line
            assert ("once the store answers" in line) is (stores and directory[:5] == "gs://")
            assert ("not the store's failure: fix it" in line) is not stores, line
        saver.close()


# ---------------------------------------------------------------- slow: kills, two hosts

# 4 devices, FSDP over 2 (the MLP kernels split), dropout on, a checkpoint every 4.
KILL_RUN = {"total_steps": 16, "checkpoint_every": 4, "keep_checkpoints": 2, "log_every": 1}
KILL_RUN.update({"eval_every": 0, "mesh.fsdp": 2, "model.width": 64, "model.mlp_dim": 256})
KILL_RUN.update({"model.dropout": 0.1})


def saves(prefix: str) -> dict[int, bool]:
    """{step: complete} of the checkpoints under gs://prefix/checkpoints (complete: with
    Orbax's commit file)."""
    found = objects(f"{prefix}/checkpoints") if fs().exists(f"{prefix}/checkpoints") else {}
    steps = {}
    for name in found:
        head, _, rest = name.partition("/")
        if head.isdigit():
            steps[int(head)] = steps.get(int(head), False) or rest == "commit_success.txt"
    return steps


def final_npz(url: str, local: str) -> str:
    with open(local, "wb") as f:
        f.write(fs().cat(url.removeprefix("gs://")))
    return local


@pytest.mark.slow
@needs_embedded_data
def test_killed_during_a_save_on_gs_the_rerun_ends_bit_identical(gcs, tmp_path):
    from subprocesses import Run, tiny_flags

    # TMPDIR of its own: a killed run leaves its TensorBoard staging copy there.
    (tmp_path / "tmp").mkdir()
    cache = {**gcs.env, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    cache["TMPDIR"] = str(tmp_path / "tmp")
    reference, workdir = str(tmp_path / "reference"), f"gs://{BUCKET}/killed"
    with Run(tiny_flags(reference, **KILL_RUN), devices=4, env=cache) as ref:
        assert ref.finish() == 0, ref.tail()
    caught = False
    for _ in range(3):  # a save that completes between two polls is no kill during a save
        before = saves(workdir)
        with Run(tiny_flags(workdir, **KILL_RUN), devices=4, env=cache) as run:
            run.wait_for(lambda line: line.startswith("step 1/16"))
            new_partial = lambda before=before: any(
                not done and step not in before for step, done in saves(workdir).items()
            )
            run.wait_until(new_partial, every=0.02)
            run.kill()
        after = saves(workdir)
        complete = [s for s, done in after.items() if done]
        partial = [s for s, done in after.items() if not done]
        if partial and min(partial) > max(complete, default=0):
            caught = True
            break
    assert caught, after  # the kill left a save half-written on the bucket
    with Run(tiny_flags(workdir, **KILL_RUN), devices=4, env=cache) as rerun:
        assert rerun.finish() == 0, rerun.tail()
    log = "\n".join(rerun.log)
    assert f"ignoring incomplete checkpoint(s) {', '.join(map(str, sorted(partial)))}" in log
    if complete:
        assert f"resuming from step {max(complete)} " in log, log
    assert "step 16/16" in log
    got = final_npz(f"{workdir}/final.npz", str(tmp_path / "killed.npz"))
    assert_npz_equal(got, f"{reference}/final.npz")


@pytest.mark.slow
@needs_embedded_data
def test_two_hosts_sharing_only_the_bucket_are_killed_and_resume_bit_exactly(gcs, tmp_path):
    """Two processes (jax.distributed on loopback), each in its own directory with its own
    TMPDIR, the workdir on the bucket: an uninterrupted pair, and a pair killed after its
    first checkpoint then started again, end with the same final.npz. While a pair runs,
    a third process on the same workdir is refused by the lock."""
    from subprocesses import Run, tiny_flags
    from test_multihost import RUN as PAIR
    from test_multihost import finish_pair, launch_pair

    cache = {**gcs.env, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache")}
    run = {**PAIR, "total_steps": 12, "checkpoint_every": 4}
    hosts = (tmp_path / "host0", tmp_path / "host1")
    reference = f"gs://{BUCKET}/pair_reference"
    finish_pair(launch_pair(reference, cache, places=hosts, overrides=run))
    workdir = f"gs://{BUCKET}/pair"
    pair = launch_pair(workdir, cache, places=hosts, overrides=run)
    try:
        pair[0].wait_until(lambda: saves(workdir).get(4), every=0.02)
        for p in pair:  # paused, alive: its lock stands while a third run tries
            os.killpg(p.proc.pid, signal.SIGSTOP)
        assert not saves(workdir).get(12)
        third = Run(tiny_flags(workdir, **run), devices=8, env=cache, cwd=str(tmp_path))
        assert third.finish() == 1
        assert any(f"error: workdir {workdir} is in use by another run" in line
                   for line in third.log), third.tail()  # fmt: skip
    finally:
        for p in pair:
            p.kill()
    assert saves(workdir).get(4) and not saves(workdir).get(12)
    logs = finish_pair(launch_pair(workdir, cache, places=hosts, overrides=run))
    assert "resuming from step" in logs[0] and "step 12/12" in logs[0], logs[0]
    for host in hosts:  # nothing of the run on either host's disk but, after the SIGKILL,
        # the killed lead's local staging copy of its TensorBoard file (uploaded whole)
        assert sorted(os.listdir(host)) == ["tmp"]
        left = [n for n in os.listdir(host / "tmp") if not n.startswith("vit_jax_events_")]
        assert left == [], left
    assert_npz_equal(
        final_npz(f"{workdir}/final.npz", str(tmp_path / "pair.npz")),
        final_npz(f"{reference}/final.npz", str(tmp_path / "reference.npz")),
    )


def test_a_number_in_a_path_or_port_is_not_a_status():
    """A bare 401 or 403 in a URL's port or a checkpoint step is not the store's answer:
    a missing bucket behind port 40123 once read as missing credentials (a flaky CI run:
    the emulator's port is random)."""
    missing = FileNotFoundError("b/run/checkpoints/401 at http://127.0.0.1:40123/b: not found")
    assert store.explain(missing, "gs://b/run").startswith("no such bucket or object")
    denied = OSError("Forbidden: http://127.0.0.1:40123/upload/storage/v1/b/x/o")
    assert store.explain(denied, "gs://x/run").startswith("permission denied")
    assert store.explain(OSError("HTTP 401: login required"), "gs://x").startswith("no credentials")
    assert store.explain(OSError("Error 503 (backend)"), "gs://x").startswith("the store did not")
    assert store.explain(OSError("403 Forbidden"), "s3://x").startswith("permission denied")
    for raised in (gcsfs.retry.HttpError({"code": 404, "message": "No such object: 401"}),):
        assert store.explain(raised, "gs://b/401").startswith("no such bucket or object")


def test_a_move_retried_after_a_partial_try_finishes_it_without_nesting(gcs):
    """Store.move on a bucket, file by file: a second try after a first that moved part of
    a checkpoint (two files copied and gone from the source, as a try cut off leaves them)
    moves the rest to the same places; fsspec's mv of the whole would have nested them
    under damaged/7/7. A move already done is done; one of nothing is refused."""
    root = f"{BUCKET}/moves"
    for name in ("a", "b", "c", "d/e"):
        fs().pipe_file(f"{root}/checkpoints/7/{name}", name.encode())
    for name in ("a", "d/e"):  # the partial first try
        fs().copy(f"{root}/checkpoints/7/{name}", f"{root}/damaged/7/{name}")
        fs().rm(f"{root}/checkpoints/7/{name}")
    source, dest = f"gs://{root}/checkpoints/7", f"gs://{root}/damaged/7"
    store.Store().move(source, dest)
    assert sorted(objects(f"gs://{root}")) == [f"damaged/7/{n}" for n in ("a", "b", "c", "d/e")]
    assert all(fs().cat(f"{root}/damaged/7/{n}") == n.encode() for n in ("a", "b", "c", "d/e"))
    store.Store().move(source, dest)  # the answer of a finished move lost: done
    assert len(objects(f"gs://{root}")) == 4
    with pytest.raises(FileNotFoundError, match="nothing to move"):
        store.Store().move(f"gs://{root}/checkpoints/8", f"gs://{root}/damaged/8")
