"""A bucket that stops answering (base/outage.py), against the GCS emulator behind a TCP
relay that the tests cut (`relay.py`: refused and reset connections, no mocks). A short
outage is ridden out bit-exact; a long one stops the run within the window plus a
minute with one line and exit status 75, and the same command resumes bit-exact."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
from helpers import MISSING, assert_npz_equal, needs_embedded_data

from vit_jax.base import outage, store

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # before gcsfs is imported
gcsfs = pytest.importorskip("gcsfs", reason=f"{MISSING} gcsfs (pip install -e '.[gcs]')")
pytest.importorskip("gcp_storage_emulator", reason=f"{MISSING} gcp-storage-emulator")
import gcs_emulator  # noqa: E402  (tests/, after the skip)
from relay import Relay  # noqa: E402
from subprocesses import Run, tiny_flags  # noqa: E402

BUCKET = "bkt"
RUN = {"total_steps": 12, "checkpoint_every": 4, "keep_checkpoints": 2, "log_every": 1}
RUN.update({"eval_every": 0, "model.width": 64, "model.mlp_dim": 256, "model.dropout": 0.1})


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    """(relay, env of a run that reaches the emulator through it, gcsfs straight to it)."""
    from test_object_store import free_port

    port = free_port()
    server = gcs_emulator.serve(port, BUCKET)
    relay = Relay(port)
    tmp = tmp_path_factory.mktemp("outage")
    env = {**gcs_emulator.env(relay.port), "JAX_COMPILATION_CACHE_DIR": str(tmp / "jax_cache")}
    direct = gcsfs.GCSFileSystem(
        endpoint_url=f"http://127.0.0.1:{port}", token="anon", skip_instance_cache=True
    )
    try:
        yield relay, env, direct
    finally:
        relay.close()
        server.kill()
        server.wait()


def started_save(fs, workdir: str, step: int):
    """Whether a save of `step` has written anything yet."""
    return lambda: fs.exists(f"{workdir.removeprefix('gs://')}/checkpoints/{step}")


def fetched(fs, url: str, local) -> str:
    local.write_bytes(fs.cat(url.removeprefix("gs://")))
    return str(local)


def no_traceback(run: Run) -> None:
    assert not any("Traceback" in line for line in run.log), run.tail()


@pytest.mark.slow
@needs_embedded_data
def test_a_short_outage_is_ridden_out_and_a_long_one_stops_with_75(cut, tmp_path):
    relay, env, fs = cut
    with Run(tiny_flags(str(tmp_path / "reference"), **RUN), devices=2, env=env) as ref:
        assert ref.finish() == 0, ref.tail()
    reference = str(tmp_path / "reference" / "final.npz")

    # 30 s without the store from the start of the step-4 save, 15 s at the final save.
    workdir = f"gs://{BUCKET}/short"
    with Run(tiny_flags(workdir, **RUN), devices=2, env=env) as run:
        for step, seconds in ((4, 30.0), (12, 15.0)):
            run.wait_until(started_save(fs, workdir, step), every=0.02)
            relay.down("reset" if step == 4 else "refuse")
            time.sleep(seconds)
            relay.up()
        assert run.finish() == 0, run.tail()
    notices = [line for line in run.log if line.startswith(f"the store at {workdir} did not")]
    assert notices and "retrying for up to 120 s" in notices[0], run.tail()
    assert any(line.startswith("the store answers again, after") for line in run.log)
    assert not any(line.startswith("error:") for line in run.log), run.tail()
    no_traceback(run)
    assert_npz_equal(fetched(fs, f"{workdir}/final.npz", tmp_path / "short.npz"), reference)

    # An outage that lasts, from the step-8 save: stopped within the window plus a minute.
    workdir, window = f"gs://{BUCKET}/long", 15
    flags = tiny_flags(workdir, **RUN, **{"store.retry_seconds": window})
    with Run(flags, devices=2, env=env) as run:
        run.wait_until(started_save(fs, workdir, 8), every=0.02)
        relay.down()
        began = time.monotonic()
        assert run.finish(timeout=window + 120) == outage.EX_TEMPFAIL, run.tail()
        took = time.monotonic() - began
    assert took < window + 60, took
    errors = [line for line in run.log if line.startswith("error:")]
    assert len(errors) == 1 and errors == [run.log[-1]], run.tail()
    assert f"the store at {workdir} did not answer for" in errors[0], errors
    assert "Could not connect" in errors[0] or "Connect" in errors[0], errors
    no_traceback(run)
    print(f"stopped {took:.1f} s after the store went away (store.retry_seconds={window})")

    # The same command, the store away for 10 s as it restores: it waits, then resumes.
    relay.up()
    with Run(flags, devices=2, env=env) as rerun:
        rerun.wait_for(lambda line: line.startswith("ignoring incomplete checkpoint(s) 8"))
        relay.down()
        threading.Timer(10.0, relay.up).start()
        assert rerun.finish() == 0, rerun.tail()
    assert any(line.startswith("resuming from step 4 ") for line in rerun.log), rerun.tail()
    assert any(line.startswith("the store answers again") for line in rerun.log), rerun.tail()
    no_traceback(rerun)
    assert_npz_equal(fetched(fs, f"{workdir}/final.npz", tmp_path / "long.npz"), reference)


class Stopped(Exception):
    pass


def stop(message: str) -> None:
    raise Stopped(message)


def test_transient_failures_are_retried_within_one_window_and_permanent_ones_raised(capsys):
    window = outage.Window("gs://b/run", 3.0, stop=stop)
    via = store.Store(window)
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionResetError("Connection reset by peer")
        return "done"

    assert via.retried(flaky, "writing x") == "done" and len(calls) == 3
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("the store at gs://b/run did not answer (writing x: Connection reset")
    assert out[1].startswith("the store answers again, after") and len(out) == 2
    with pytest.raises(FileNotFoundError):  # a permanent failure: at once, not retried
        via.retried(lambda: (_ for _ in ()).throw(FileNotFoundError("no such bucket")), "x")
    assert window.since is None
    began = time.monotonic()
    with pytest.raises(Stopped, match=r"did not answer for \d+ s \(store.retry_seconds=3\)"):
        via.retried(lambda: (_ for _ in ()).throw(TimeoutError("timed out")), "x")
    assert 3.0 <= time.monotonic() - began < 3.0 + 10.0 * 1.5 + 1  # one backoff past it
    with pytest.raises(TimeoutError):  # no window (PLAIN): tried once
        store.PLAIN.retried(lambda: (_ for _ in ()).throw(TimeoutError("timed out")), "x")


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (ConnectionRefusedError(111, "Connect call failed"), True),
        (OSError("HTTP 503 Service Unavailable"), True),
        (OSError("Error 429: rate limit"), True),
        (ValueError("ABORTED: All 1 retry attempts failed: CURL error Could not connect"), True),
        (ValueError("CURL error Recv failure: Unknown error 104 [curl_code='56']"), True),
        (OSError("HTTP 403 Forbidden"), False),
        (FileNotFoundError("b/run/x"), False),
        (OSError("HTTP 401: login required"), False),
        (ValueError("checksum mismatch"), False),
    ],
)
def test_which_failures_are_transient(error, retried):
    assert store.transient(error) is retried


@pytest.mark.slow
@needs_embedded_data
def test_two_processes_sharing_only_the_bucket_both_stop_with_75(cut, tmp_path):
    """A pair (jax.distributed on loopback) whose bucket goes away at a save: each process
    gives up on its own, both within the window plus a minute, both with status 75."""
    from test_multihost import RUN as PAIR
    from test_multihost import launch_pair

    relay, env, fs = cut
    relay.up()
    workdir, window = f"gs://{BUCKET}/pair", 15
    run = {**PAIR, "total_steps": 12, "checkpoint_every": 4, "store.retry_seconds": window}
    pair = launch_pair(workdir, env, places=(tmp_path / "host0", tmp_path / "host1"), overrides=run)
    try:
        pair[0].wait_until(started_save(fs, workdir, 8), every=0.02)
        relay.down()
        began = time.monotonic()
        statuses = [p.finish(timeout=window + 120) for p in pair]
        took = time.monotonic() - began
    finally:
        for p in pair:
            p.kill()
        relay.up()
    assert statuses == [outage.EX_TEMPFAIL] * 2, [p.tail() for p in pair]
    assert took < window + 60, took
    # Each gives up on its own, or (on a loaded machine, its window not yet passed) follows
    # the one that did (distributed.peers_watched): one error line each, one of them its own.
    errors = [[line for line in p.log if line.startswith("error:")] for p in pair]
    assert [len(e) for e in errors] == [1, 1], [p.tail() for p in pair]
    own = ["did not answer for" in e[0] for e in errors]
    followed = [re.match(r"error: process \d of 2 gave up on the store; ", e[0]) for e in errors]
    assert any(own) and all(o or f for o, f in zip(own, followed, strict=True)), errors
