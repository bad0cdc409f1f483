"""What a checkpoint costs: hashing, saving and restoring the TrainState, on a local disk
or an object store, and whether a save in flight slows training down.

    python benchmarks/integrity.py [--model=ViT-B_16] [--image_size=224] [--repeats=3] \\
        [--dir=DIR or gs://BUCKET/PATH] [--steps=3 --batch=8]

Builds the model's TrainState with Adam (parameters and two float32 moments) on one
device and times, each the median of --repeats:
  hash          CRC-32 of every shard on the host (`checkpoints.checksums`, on a thread pool
                of os.cpu_count() threads), alone
  save, plain   an Orbax save alone (commit-file mode): the blocking part (until training
                may go on) and the whole (until the checkpoint is complete)
  save, record  `Checkpoints.save`: hashing, Orbax's save, the record written before
                the commit
  restore       plain (Orbax alone) and verified (`Checkpoints.check`: file sizes,
                restore, every array's CRC, finiteness), once each
  step          with --steps: the train step's time alone, and right after a save was
                started (the save in flight), batch --batch
The checkpoints go to a temporary directory under --dir (default: the system's); a
gs:// --dir is used as it is (point STORAGE_EMULATOR_HOST and TENSORSTORE_GCS_HTTP_URL
at an emulator to measure one) and emptied afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import sys
import tempfile
import time
import uuid

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import concurrent.futures  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from bound import machine, timeit  # noqa: E402

from vit_jax.base import store  # noqa: E402
from vit_jax.configs.common import base  # noqa: E402
from vit_jax.parallel import sharding  # noqa: E402
from vit_jax.training import state as state_lib  # noqa: E402
from vit_jax.training import step as step_lib  # noqa: E402
from vit_jax.training.state import build_model, create_state  # noqa: E402
from vit_jax.workdir import (
    shards,  # noqa: E402
    verify,  # noqa: E402
)
from vit_jax.workdir.checkpoints import COMMIT, Checkpoints  # noqa: E402
from vit_jax.workdir.workdir import Plan, tree_bytes  # noqa: E402


def make_state(model_name: str, image_size: int):
    c = base(model_name)
    c.image_size = image_size
    c.optimizer.update(name="adam", lr=1e-3)
    model = build_model(c.model, 1000)
    tx, lr = state_lib.make_optimizer(c.optimizer, c.total_steps)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    state, shardings = create_state(state_lib.Start.of(c), model, tx, mesh)
    step, _ = step_lib.jit_steps(model, tx, lr, mesh, shardings, 1)
    return c, jax.block_until_ready(state), step, mesh


def step_times(state, step, mesh, batch: int, size: int, n: int, saver=None, at: int = 0):
    """`n` timed train steps (after one to compile); with `saver`, a save of the state
    is started before them (it runs in flight while they do)."""
    rng = np.random.default_rng(0)
    local = {
        "image": rng.uniform(-1, 1, (batch, size, size, 3)).astype(np.float32),
        "label": np.eye(1000, dtype=np.float32)[rng.integers(0, 1000, batch)],
    }
    data = sharding.global_batch(local, mesh)
    state, m = step(state, data)
    jax.block_until_ready(m)
    if saver is not None:
        saver.save(at, state)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        state, m = step(state, data)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - start)
    if saver is not None:
        saver.wait()
    return state, statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="ViT-B_16")
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    config, state, step, mesh = make_state(args.model, args.image_size)
    gib = tree_bytes(state) / 2**30
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        hash_s = timeit(lambda: shards.checksums(state, pool),
                        warmup=0, repeats=args.repeats, min_time=0)  # fmt: skip
    if args.dir and store.is_remote(args.dir):
        root = store.path(args.dir) / f"integrity_bench_{uuid.uuid4().hex[:8]}"
    else:
        root = store.path(tempfile.mkdtemp(dir=args.dir, prefix="integrity_bench_"))
    try:
        options = ocp.CheckpointManagerOptions(create=True, atomicity_options=COMMIT)
        plain = ocp.CheckpointManager(root / "plain", options=options)
        saver = Checkpoints(root / "record", 0, Plan.of(config).state)
        rows = {"plain": ([], []), "record": ([], [])}
        for n in range(1, args.repeats + 1):
            for name in rows:
                start = time.perf_counter()
                if name == "plain":
                    plain.save(n, args=ocp.args.StandardSave(state))
                    rows[name][0].append(time.perf_counter() - start)
                    plain.wait_until_finished()
                else:
                    saver.save(n, state)
                    rows[name][0].append(time.perf_counter() - start)
                    saver.wait()
                rows[name][1].append(time.perf_counter() - start)
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        once = functools.partial(timeit, warmup=0, repeats=1, min_time=0)
        restore_s = {
            "plain": once(lambda: plain.restore(1, args=ocp.args.StandardRestore(target))),
            "verified": once(lambda: verify.check(saver, 1, target)),
        }
        if args.steps:
            size = args.image_size
            state, alone = step_times(state, step, mesh, args.batch, size, args.steps)
            state, beside = step_times(
                state, step, mesh, args.batch, size, args.steps, saver, args.repeats + 1
            )
        plain.close()
        saver.close()
    finally:
        store.PLAIN.remove_tree(root)
    med = statistics.median
    where = "a gs:// bucket" if store.is_remote(root) else "local disk"
    print(f"# {machine()}, {datetime.date.today()}; checkpoints on {where}")
    print(f"# {args.model} at {args.image_size} px, Adam: TrainState {gib:.2f} GiB")
    print(f"hash          {hash_s:7.2f} s  ({gib / hash_s:.2f} GiB/s)")
    for name, (blocking, whole) in rows.items():
        print(f"save, {name:<7} {med(blocking):7.2f} s blocking  {med(whole):7.2f} s whole")
    for name, seconds in restore_s.items():
        print(f"restore, {name:<8} {seconds:5.2f} s")
    plain_whole = med(rows["plain"][1])
    blocking = med(rows["record"][0]) - med(rows["plain"][0])
    print(
        f"record adds   {blocking:+7.2f} s blocking; hash alone is "
        f"{hash_s / plain_whole:.1%} of a plain save's whole time"
    )
    if args.steps:
        print(f"step          {alone:7.2f} s alone, {beside:.2f} s with a save in flight "
              f"(batch {args.batch}, median of {args.steps})")  # fmt: skip


if __name__ == "__main__":
    main()
