"""Independent evaluation steps in flight at once against chained ones: how long each
runs on emulated CPU devices before XLA's CPU collectives deadlock and abort.

    python benchmarks/collectives.py [--seconds=600] [--repeats=2] [--hogs=3]

Each mode runs in a child process with 8 emulated CPU devices and --hogs threads of
NumPy matrix products beside it (a loaded machine: the other tests, the input pipeline),
and evaluates batches in the two ways the training loop once chose between:

independent  each batch: host data -> global arrays, a jitted step that reduces over
             the batch (an all-reduce), its sums added to a running total outside the
             step: many steps in flight, none depending on another
chained      each step takes the running sums as an input (the training loop's
             evaluation did, before it fetched each batch's outputs before sending the
             next: evaluation/batched.py): every device runs the steps in dispatch order

A child that XLA aborts (its rendezvous waits 40 s for devices that took up another
step: 'Termination timeout ... only 6 of them arrived') is reported with the time it
ran; one still running after --seconds is stopped. Prints one line per run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

CHILD = """
import os, sys, threading, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

chained, hogs = sys.argv[1] == "chained", int(sys.argv[2])
mesh = Mesh(np.array(jax.devices()), ("d",))
split, whole = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
w = jax.device_put(np.random.default_rng(0).random((512, 64), np.float32), whole)

def sums(w, x, y):
    logits = x @ w
    return {"loss": jnp.sum(jax.nn.logsumexp(logits, -1)),
            "correct": jnp.sum(jnp.argmax(logits, -1) == y).astype(jnp.float32)}

independent = jax.jit(sums, out_shardings=whole)
add = jax.jit(lambda w, x, y, total: jax.tree.map(jnp.add, total, sums(w, x, y)),
              out_shardings=whole, donate_argnums=3)

def hog():
    a = np.random.rand(200, 200)
    while True:
        a @ a

for _ in range(hogs):
    threading.Thread(target=hog, daemon=True).start()
rng, steps, start = np.random.default_rng(1), 0, time.time()
while True:
    total = jax.device_put({"loss": np.float32(0), "correct": np.float32(0)}, whole)
    for _ in range(16):
        x = jax.make_array_from_process_local_data(split, rng.random((64, 512), np.float32))
        y = jax.make_array_from_process_local_data(split, rng.integers(0, 64, 64))
        if chained:
            total = add(w, x, y, total)
        else:
            total = jax.tree.map(jnp.add, total, independent(w, x, y))
        steps += 1
    jax.device_get(total)
    print(steps, f"{time.time() - start:.1f}", flush=True)
"""


def run(mode: str, seconds: float, hogs: int) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(hogs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    start = time.time()
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        steps = out.strip().splitlines()[-1].split()[0] if out.strip() else "0"
        return f"{mode:<12} still running after {seconds:.0f} s ({steps} steps): stopped"
    took = time.time() - start
    steps = out.strip().splitlines()[-1].split()[0] if out.strip() else "0"
    why = re.search(r"(Termination timeout for .*?exceeded).*?(only \d+ of them arrived)", err)
    reason = f"{why[1]}; {why[2]}" if why else (err.strip().splitlines() or ["?"])[-1][:160]
    return f"{mode:<12} exited {proc.returncode} after {took:.0f} s ({steps} steps): {reason}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hogs", type=int, default=3)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, 8 emulated devices, {args.hogs} busy threads beside")
    for _ in range(args.repeats):
        for mode in ("independent", "chained"):
            print(run(mode, args.seconds, args.hogs), flush=True)


if __name__ == "__main__":
    main()
