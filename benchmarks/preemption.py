"""What a preemption costs: the time from SIGTERM to exit, and the per-step agreement.

    python benchmarks/preemption.py [--model=ViT-B_16] [--image_size=224] [--repeats=3]

signal to exit  a child process builds the model's TrainState (Adam: parameters and two
                float32 moments) on one device, takes steps (a cheap update of the state,
                so that the figure is the stop's own) under `stopping.StopRequest`, and on
                SIGTERM does what the training loop does: saves the step with its
                integrity record (`Checkpoints.save`), waits for it, prints the line, exits
                143. Timed from os.kill to the child's exit (interpreter shutdown
                included), the median of --repeats; add one train step of your model
                (the step in flight) for the whole grace period needed
agreement       `stopping.Agreement` forced on (as in a multi-process run: each step's
                batch carries the signal flags, the step reduces them, the loop reads
                the step before's) over 8 emulated CPU devices, a tiny model: ms per
                step with and without, the median over --steps steps
The checkpoints go to a temporary directory under --dir (default: the system's).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def child(model_name: str, image_size: int, workdir: str) -> None:
    import jax
    from integrity import make_state  # benchmarks/integrity.py

    from vit_jax.training import stopping
    from vit_jax.workdir.checkpoints import Checkpoints

    c, state, _, _ = make_state(model_name, image_size)
    saver = Checkpoints(f"{workdir}/checkpoints", 2, {"model": c.model.to_dict()})
    bump = jax.jit(lambda s: s.replace(step=s.step + 1), donate_argnums=0)
    with stopping.StopRequest() as stop:
        print("ready", flush=True)
        while not stop.requested:
            state = jax.block_until_ready(bump(state))
            time.sleep(0.01)
        step = int(state.step)
        saver.save(step, state)
        saver.wait()
        done = stopping.stopped(step, stop.requested, f"{saver.directory}/{step}")
        print(done, flush=True)
    sys.exit(done.exit_status)


def signal_to_exit(model_name: str, image_size: int, workdir: str) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    args = [sys.executable, __file__, "--child", f"--model={model_name}"]
    proc = subprocess.Popen(
        [*args, f"--image_size={image_size}", f"--dir={workdir}"],
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT},
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    start = time.perf_counter()
    proc.send_signal(15)
    out = proc.stdout.read().strip()
    status = proc.wait()
    took = time.perf_counter() - start
    if status != 143:
        raise RuntimeError(f"the child exited {status}: {out}")
    return took, out


def agreement(steps: int) -> tuple[float, float]:
    """ms per step of a tiny model's train step, without and with the agreement."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax

    from vit_jax.configs import fashion_mnist
    from vit_jax.parallel import sharding
    from vit_jax.training import state as state_lib
    from vit_jax.training import step as step_lib
    from vit_jax.training import stopping
    from vit_jax.training.state import build_model, create_state

    c = fashion_mnist.get_config("tiny")
    mesh = sharding.make_mesh(8, 1)
    model = build_model(c.model, 10)
    tx, lr = state_lib.make_optimizer(c.optimizer, c.total_steps)
    state, shardings = create_state(state_lib.Start.of(c), model, tx, mesh)
    step_fn, _ = step_lib.jit_steps(model, tx, lr, mesh, shardings)
    import numpy as np

    rng = np.random.default_rng(0)
    local = {
        "image": rng.uniform(-1, 1, (c.batch_size, 28, 28, 3)).astype(np.float32),
        "label": np.eye(10, dtype=np.float32)[rng.integers(0, 10, c.batch_size)],
    }
    batch = sharding.global_batch(local, mesh)
    agree = stopping.Agreement(mesh, force=True)
    times: dict[bool, list[float]] = {False: [], True: []}
    flagged = sharding.global_batch(agree.into(local, None), mesh)
    for i in range(2 * steps + 6):  # alternating, so that both see the same machine
        agreeing = bool(i % 2)
        start = time.perf_counter()
        state, m = step_fn(state, flagged if agreeing else batch)
        if agreeing:
            agree.lagged(None, m)
        jax.block_until_ready(m)
        if i >= 6:  # compiled and warm
            times[agreeing].append(time.perf_counter() - start)
    out = [1e3 * statistics.median(times[k]) for k in (False, True)]
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B_16")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        return child(args.model, args.image_size, args.dir)
    times = []
    for _ in range(args.repeats):
        workdir = tempfile.mkdtemp(prefix="preemption_", dir=args.dir)
        try:
            took, line = signal_to_exit(args.model, args.image_size, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        times.append(took)
    print(f"{args.model} at {args.image_size} px, {os.cpu_count()} CPUs")
    print(
        f"signal to exit   {statistics.median(times):.2f} s (median of {len(times)}): save with "
        f"its record, wait, exit; add the step in flight\n  {line}"
    )
    plain, agreed = agreement(args.steps)
    print(f"agreement        {agreed - plain:+.2f} ms per step ({plain:.2f} ms without, "
          f"{agreed:.2f} ms with; tiny model, 8 CPU devices)")  # fmt: skip


if __name__ == "__main__":
    main()
