"""What the checkpoint integrity record costs: hashing the TrainState against saving it.

    python benchmarks/integrity.py [--model=ViT-B_16] [--image_size=224] [--repeats=3]

Builds the model's TrainState with Adam (parameters and two float32 moments) on one
device and times, each the median of --repeats:
  hash          CRC-32 of every shard on the host (`integrity.start_checksums` +
                `collect`, on a thread pool of os.cpu_count() threads), alone
  save, plain   an Orbax save as before this record existed: the blocking part (until
                training may go on) and the whole (until the checkpoint is complete)
  save, record  `saver.Saver.save`: the hashing runs beside Orbax's blocking copy and
                the record (with each file's CRC-32, read back) is written before
                Orbax's rename
  restore       plain (Orbax alone) and verified (`recovery.check`: files' CRCs,
                restore, arrays' CRCs, finiteness), once each
The checkpoints go to a temporary directory under --dir (default: the system's).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import concurrent.futures  # noqa: E402

import jax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from bound import machine, timeit  # noqa: E402

from vit_jax.configs.common import base  # noqa: E402
from vit_jax.parallel import sharding  # noqa: E402
from vit_jax.training import optim, train  # noqa: E402
from vit_jax.training.state import build_model, create_state  # noqa: E402
from vit_jax.workdir import checks, integrity, manager, recovery  # noqa: E402
from vit_jax.workdir.saver import Saver  # noqa: E402


def make_state(model_name: str, image_size: int):
    c = base(model_name)
    c.image_size = image_size
    c.optimizer.update(name="adam", lr=1e-3)
    model = build_model(c.model, 1000)
    tx, _ = optim.make_optimizer(c.optimizer, c.total_steps)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    state, _ = create_state(train.start_of(c), model, tx, mesh)
    return c, jax.block_until_ready(state)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="ViT-B_16")
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    config, state = make_state(args.model, args.image_size)
    gib = checks.tree_bytes(state) / 2**30
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        hash_s = timeit(lambda: integrity.collect(integrity.start_checksums(state, pool)),
                        warmup=0, repeats=args.repeats, min_time=0)  # fmt: skip
    root = tempfile.mkdtemp(dir=args.dir, prefix="integrity_bench_")
    try:
        plain = manager.open_manager(os.path.join(root, "plain"), 0)
        saver = Saver(os.path.join(root, "record"), 0, train.plan_of(config).state)
        rows = {"plain": ([], []), "record": ([], [])}
        for step in range(1, args.repeats + 1):
            for name in rows:
                start = time.perf_counter()
                if name == "plain":
                    plain.save(step, args=ocp.args.StandardSave(state))
                    rows[name][0].append(time.perf_counter() - start)
                    plain.wait_until_finished()
                else:
                    saver.save(step, state)
                    rows[name][0].append(time.perf_counter() - start)
                    saver.wait()
                rows[name][1].append(time.perf_counter() - start)
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        once = functools.partial(timeit, warmup=0, repeats=1, min_time=0)
        restore_s = {
            "plain": once(lambda: plain.restore(1, args=ocp.args.StandardRestore(target))),
            "verified": once(lambda: recovery.check(saver.manager, 1, target)),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    print(f"# {machine()}, {datetime.date.today()}")
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


if __name__ == "__main__":
    main()
