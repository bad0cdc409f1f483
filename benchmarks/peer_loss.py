"""What losing a process of a multi-process run costs: seconds from the loss to the exit.

    python benchmarks/peer_loss.py [--peer_timeout=60] [--step=6] [--case=NAME ...]

Two real processes on loopback (jax.distributed, 4 emulated CPU devices each: the pair of
tests/test_multihost.py and tests/test_peer_loss.py, the tiny Fashion-MNIST run with FSDP
over 8 devices, a checkpoint every 4 steps). Once process 0 has logged step --step, one
process is lost, one case per pair:

worker killed        SIGKILL to process 1
worker frozen        SIGSTOP to process 1 (a hung host: its sockets stay open)
coordinator killed   SIGKILL to process 0 (JAX's client aborts the others at once)
worker killed in a save  SIGKILL to process 1 once a save is being written (a step's
                     directory without its commit file), not at --step

Each row: seconds from os.kill to the survivor's exit (interpreter shutdown included),
its exit status (75 expected), and whether its last output line is its one `error:` line.
The peer timeout is distributed.peer_timeout_seconds: its default unless --peer_timeout
is given (a quick run); a lost worker is seen within one heartbeat (min(5 s, timeout / 4))
of it. The pairs share a JAX compilation cache in a temporary directory under --dir.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_multihost import RUN, launch_pair  # noqa: E402
from test_resume import partial_saves  # noqa: E402

from vit_jax.configs import fashion_mnist  # noqa: E402

CASES = [
    ("worker killed", 1, signal.SIGKILL),
    ("worker frozen", 1, signal.SIGSTOP),
    ("coordinator killed", 0, signal.SIGKILL),
    ("worker killed in a save", 1, signal.SIGKILL),
]


def lose_one(workdir: str, cache: dict, victim: int, how: signal.Signals, step: int,
             overrides: dict, timeout: float) -> tuple[float, int, list[str]]:  # fmt: skip
    """Starts a pair, sends `how` to process `victim` once process 0 logged `step`: the
    seconds from the signal to the survivor's exit, its status and its output lines."""
    runs = launch_pair(workdir, cache, overrides=overrides)
    survivor = runs[1 - victim]
    try:
        if step:
            runs[0].wait_for(lambda line: line.startswith(f"step {step}/"), timeout=600)
        else:  # in a save: its step directory there, its commit file not yet
            runs[0].wait_for(lambda line: line.startswith("step 1/"), timeout=600)
            runs[0].wait_until(lambda: partial_saves(workdir))
        os.kill(runs[victim].proc.pid, how)
        sent = time.monotonic()
        status = survivor.finish(timeout=timeout)
        return time.monotonic() - sent, status, survivor.log
    finally:
        for run in runs:
            run.kill()  # SIGKILL to the group: a frozen process too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peer_timeout",
        type=int,
        default=None,
        help="distributed.peer_timeout_seconds (default: the config's)",
    )
    parser.add_argument("--step", type=int, default=6, help="the step at which to signal")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--case", action="append", help="a case's name (default: all)")
    args = parser.parse_args()
    default = fashion_mnist.get_config("tiny").distributed.peer_timeout_seconds
    peer = default if args.peer_timeout is None else args.peer_timeout
    # Steps enough that no process finishes before the signal.
    overrides = {**RUN, "checkpoint_every": 4, "total_steps": args.step + 100}
    if args.peer_timeout is not None:
        overrides["distributed.peer_timeout_seconds"] = args.peer_timeout
    root = tempfile.mkdtemp(prefix="peer_loss_", dir=args.dir)
    cache = {"JAX_COMPILATION_CACHE_DIR": os.path.join(root, "jax_cache")}
    rows = []
    try:
        for i, (name, victim, how) in enumerate(CASES):
            if args.case and name not in args.case:
                continue
            workdir, step = os.path.join(root, f"pair{i}"), 0 if "save" in name else args.step
            took, status, log = lose_one(workdir, cache, victim, how, step, overrides,
                                         timeout=peer + 30 + 300)  # fmt: skip
            errors = [line for line in log if line.startswith("error:")]
            one = len(errors) == 1 and bool(log) and log[-1] == errors[0]
            last = log[-1] if log else ""
            rows.append((name, how.name, f"proc {victim}", took, status, one, last))
            print(f"{name}: {took:.1f} s, exit {status}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    said = "the default" if args.peer_timeout is None else f"default {default:g} s"
    print(f"peer timeout {peer:g} s ({said}), signal at step {args.step}, {os.cpu_count()} CPUs")
    head = f"{'case':<25}{'signal':<9}{'lost':<9}{'loss to exit':>14}{'status':>8}"
    print(head + "  last line the one error:")
    for name, sig, victim, took, status, one, _ in rows:
        print(f"{name:<25}{sig:<9}{victim:<9}{took:>12.1f} s{status:>8}  "
              f"{'yes' if one else 'no'}")  # fmt: skip
    for name, *_, last in rows:
        print(f"{name}: {last}")


if __name__ == "__main__":
    main()
