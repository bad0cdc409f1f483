"""Training-step speed against the bound of its own matrix products (forward and backward).

    python benchmarks/train_step.py --model=ViT-B_16 --batch=8 --optimizer=sgd --dtype=float32

Prints images/s of `vit_jax.training.step.train_step` (jitted, state donated, as the loop runs
it) and the bound: the summed time of every matrix product in the step's jaxpr (the
forward products and their transposes in the backward pass), each timed alone.
`bound/step` near 1 means the step runs as fast as its matrix products allow.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bound import machine, parser, product_bound, timeit  # noqa: E402

from vit_jax.configs import common  # noqa: E402
from vit_jax.models import get_model  # noqa: E402
from vit_jax.parallel import sharding  # noqa: E402
from vit_jax.training import state as state_lib  # noqa: E402
from vit_jax.training import step as step_lib  # noqa: E402


def optimizer_config(name: str) -> ml_collections.ConfigDict:
    """The configs' optimizer fields (configs/common.py), as a pretraining (adam) or
    fine-tuning (sgd) run sets them."""
    c = common.base("ViT-B_16").optimizer
    c.update(name=name, lr=1e-3, warmup_steps=10, weight_decay=0.1 if name == "adam" else 0.0)
    return c


def measure(
    name: str,
    size: int,
    batch: int,
    opt: str,
    dtype: str,
    remat: bool,
    bound: bool = True,
    timed: bool = True,
    **model_kw,
) -> dict:
    """The step's speed and the compiler's bytes (GiB); with `timed` off, its bytes alone."""
    model = get_model(name, 1000, dtype=dtype, remat=remat, **model_kw)
    tx, lr = state_lib.make_optimizer(optimizer_config(opt), 1000)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    start = state_lib.Start(seed=0, image_size=size)
    state, shardings = state_lib.create_state(start, model, tx, mesh)
    rng = np.random.default_rng(0)
    data = {
        "image": jnp.asarray(rng.uniform(-1, 1, (batch, size, size, 3)), jnp.float32),
        "label": jax.nn.one_hot(rng.integers(0, 1000, batch), 1000),
    }
    step_fn = functools.partial(step_lib.train_step, model=model, tx=tx, lr_fn=lr)
    step = jax.jit(step_fn, donate_argnums=0)
    compiled = step.lower(state, data).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops", 0.0)) / batch
    mem = compiled.memory_analysis()  # the compiler's bytes: temporaries, and in all
    temp = mem.temp_size_in_bytes
    total = temp + mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    if not timed:
        return dict(temp_gib=temp / 2**30, total_gib=total / 2**30)
    holder = [state]

    def run():
        holder[0], m = compiled(holder[0], data)
        return m["loss"]

    t = timeit(run)
    row = dict(
        ips=batch / t,
        ms=1e3 * t,
        gflops=flops / 1e9,
        achieved=flops * batch / t / 1e9,
        temp_gib=temp / 2**30,
        total_gib=total / 2**30,
    )
    if bound:
        b, lines = product_bound(step_fn, holder[0], data)
        row.update(bound_ms=1e3 * b, ratio=b / t, lines=lines)
    return row


def main() -> None:
    ap = parser(__doc__, lists=False)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    ap.add_argument("--remat", action="store_true", help="rematerialise each block")
    a = ap.parse_args()
    print(f"# {datetime.date.today()} — {machine()}")
    r = measure(a.model, a.image_size, a.batch, a.optimizer, a.dtype, a.remat, a.bound)
    if a.products and a.bound:
        print("\n".join(r["lines"]))
    print(
        f"{'model':<12} {'res':>4} {'batch':>5} {'opt':>5} {'dtype':>8} {'img/s':>7} "
        f"{'GFLOP/img':>9} {'GFLOP/s':>8} {'step ms':>8} {'bound ms':>9} {'bound/step':>10}"
    )
    print(
        f"{a.model:<12} {a.image_size:>4} {a.batch:>5} {a.optimizer:>5} {a.dtype:>8} "
        f"{r['ips']:7.2f} {r['gflops']:9.4g} {r['achieved']:8.1f} {r['ms']:8.1f} "
        + (f"{r['bound_ms']:9.1f} {r['ratio']:10.3f}" if a.bound else f"{'-':>9} {'-':>10}")
    )


if __name__ == "__main__":
    main()
