"""What a bucket that stops answering costs: a save's extra seconds, and the time to stop.

    python benchmarks/outage.py [--outages=0,10,30] [--window=30]

The tiny Fashion-MNIST run (12 steps, a checkpoint every 4) with its workdir on the GCS
emulator behind a TCP relay (tests/gcs_emulator.py, tests/relay.py), one run per figure:

ridden out   the relay refuses and resets connections for N s from the moment the step-4
             save starts: the run's wall time minus the uninterrupted run's (N = 0) is
             what the outage cost; an outage shorter than store.retry_seconds costs
             about its own length, the save's retries finishing within seconds of the
             store's return
stop         the relay stays down from the step-8 save, store.retry_seconds = --window:
             seconds from the cut to the run's exit (status 75), against the window plus
             the minute allowed
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

import gcs_emulator  # noqa: E402
import gcsfs  # noqa: E402
from relay import Relay  # noqa: E402

RUN = {"total_steps": 12, "checkpoint_every": 4, "keep_checkpoints": 2, "log_every": 4}
RUN.update({"eval_every": 0, "model.width": 64, "model.mlp_dim": 256})


def one_run(relay, env, fs, name: str, cut_at: int, seconds: float | None, window: float):
    """(wall seconds of the run, seconds from the cut to its exit, exit status)."""
    flags = [f"--config.{k}={v}" for k, v in {**RUN, "store.retry_seconds": window}.items()]
    cmd = [sys.executable, "-m", "vit_jax.main", "--config=fashion_mnist:tiny",
           f"--workdir=gs://bkt/{name}", *flags]  # fmt: skip
    began, log = time.monotonic(), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    cut = None
    if seconds != 0:
        while not fs.exists(f"bkt/{name}/checkpoints/{cut_at}") and proc.poll() is None:
            time.sleep(0.02)
        relay.down("reset")
        cut = time.monotonic()
        if seconds is not None:
            threading.Timer(seconds, relay.up).start()
    status = proc.wait()
    ended = time.monotonic()
    relay.up()
    if status not in (0, 75):
        log.seek(0)
        raise RuntimeError(f"{name}: exit status {status}\n" + "".join(log.readlines()[-5:]))
    return ended - began, None if cut is None else ended - cut, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", default="0,10,30", help="seconds, comma-separated")
    parser.add_argument("--window", type=float, default=30.0, help="store.retry_seconds")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = gcs_emulator.serve(port, "bkt")
    relay = Relay(port)
    fs = gcsfs.GCSFileSystem(endpoint_url=f"http://127.0.0.1:{port}", token="anon",
                             skip_instance_cache=True)  # fmt: skip
    cache = tempfile.mkdtemp(prefix="vit_jax_outage_cache_")
    env = dict(os.environ, **gcs_emulator.env(relay.port), JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=cache, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    try:
        one_run(relay, env, fs, "warmup", 4, 0, args.window)  # fills the compilation cache
        base = None
        print("outage at the step-4 save | run wall s | extra s | status")
        for n in (float(x) for x in args.outages.split(",")):
            wall, _, status = one_run(relay, env, fs, f"ride{n:g}", 4, n, 120.0)
            base = wall if base is None else base
            print(f"{n:>25g} | {wall:10.1f} | {wall - base:7.1f} | {status}", flush=True)
        _, stop, status = one_run(relay, env, fs, "stop", 8, None, args.window)
        print(f"outage that lasts, store.retry_seconds={args.window:g}: exit {status} "
              f"{stop:.1f} s after the cut (allowed: {args.window + 60:g} s)")  # fmt: skip
    finally:
        relay.close()
        server.kill()


if __name__ == "__main__":
    main()
