"""The planner on a NaFlex model (vit_jax/training/planner.py, `plan --seq_len=N`): the
loop's step lowered for batches of N patches a row, the tokens it attends over and what the
attention kernel pads them to; and benchmarks/naflex_forward.py in its smoke mode."""

from __future__ import annotations

import helpers
import jax
import numpy as np
import pytest
from helpers import python_m, random_params, tiny_config
from test_plan import SMALL, WITH_LIBTPU, needs_libtpu, plan_json

from vit_jax.models import naflex
from vit_jax.parallel import sharding
from vit_jax.training import planner
from vit_jax.training import state as state_lib
from vit_jax.training import step as step_lib
from vit_jax.training.state import Start, build_model


def small_config(**fields):
    """test_plan's SMALL run: 4 px patches on 32 px (64 patches + class), 64 images."""
    c = tiny_config(image_size=32, batch_size=64)
    c.model.update(width=64, mlp_dim=256, depth=2, num_heads=2, patch_size=4, **fields)
    return c


def test_a_naflex_plan_on_this_host_holds_its_batch_and_runs_the_loops_step():
    """On the 8 CPU devices: the batch is N patches of 4 x 4 x 3 values a row, their
    coordinates (int32) and validity (bool), counted per device by hand; the plan says 61
    tokens, none padded (XLA's attention). The lowered step is the model's NaFlex function:
    run on a real batch (mixed grids, padding), its loss is softmax_xent of the model's
    logits computed directly."""
    c = small_config()
    p = planner.plan_on(c, jax.devices(), "cpu", 10, seq_len=60)
    per_device = 64 // 8
    want = per_device * (60 * 48 * 4 + 60 * 2 * 4 + 60 + 10 * 4)  # patches, coords, valid, label
    assert p.batch_bytes == want, (p.batch_bytes, want)
    assert (p.seq_len, p.tokens, p.kernel_tokens) == (60, 61, 61)
    image = planner.plan_on(c, jax.devices(), "cpu", 10)
    assert (image.seq_len, image.tokens, image.kernel_tokens) == (0, 65, 65)

    mesh = sharding.make_mesh(-1, 1)
    step, abstract, batch = planner.loop_step(c, mesh, 10, seq_len=60)
    model = build_model(c.model, 10)
    state, _ = state_lib.create_state(
        Start(seed=0, image_size=32), model, state_lib.optimizer_of(c)[0], mesh
    )
    params = random_params(model, 32)  # a head that is not zero: the loss sees the input
    put = lambda a, s: jax.device_put(a, s.sharding)
    state = state.replace(params=jax.tree.map(put, params, abstract.params))
    rng = np.random.default_rng(0)
    grids = [(32, 28), (20, 44), (24, 24), (40, 16)] * 16  # 56, 55, 36, 40 patches of 60
    rows = [naflex.patchify(rng.uniform(-1, 1, (1, h, w, 3)), 4, 60) for h, w in grids]
    x = {k: np.concatenate([r[k] for r in rows]) for k in naflex.KEYS}
    labels = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
    _, metrics = step(state, jax.tree.map(put, {"image": x, "label": labels}, batch))
    logits = helpers.logits(model, params, x, train=True)
    want = step_lib.softmax_xent(logits, labels).mean()
    assert float(metrics["loss"]) == pytest.approx(float(want), rel=1e-5)


@needs_libtpu
def test_a_naflex_plan_on_v5e_says_what_splash_pads_and_counts_its_flops():
    """On v5e with splash: 64 patches + the class token are 65 tokens, which the kernel pads
    to 128; the kernel's analytic FLOPs are 12 B N² width depth at N = 65, as the image plan's
    at 32 px (the same 65 tokens), and the two steps' FLOPs agree within 5% (NaFlex adds the
    position table's resize); the table says it in one row. --fit with --seq_len is refused."""
    at = ["--topology=v5e:2x2", "--config.batch_size=8", "--config.model.attention=splash"]
    flex, image = plan_json(*SMALL, *at, "--seq_len=64"), plan_json(*SMALL, *at)
    assert (flex["seq_len"], flex["tokens"], flex["kernel_tokens"]) == (64, 65, 128)
    assert (image["seq_len"], image["tokens"], image["kernel_tokens"]) == (0, 65, 128)
    assert flex["kernel_flops"] == image["kernel_flops"] == 12 * 2 * 65**2 * 64 * 2
    assert flex["flops"] == pytest.approx(image["flops"], rel=0.05)
    assert flex["batch_bytes"] == 2 * (64 * 48 * 4 + 64 * 2 * 4 + 64 + 10 * 4)
    proc = python_m("vit_jax.plan", *SMALL, *at, "--seq_len=64", env=WITH_LIBTPU, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "sequence          65 tokens (NaFlex: 64 patches + class token); the attention "
        "kernel pads them to 128" in proc.stdout
    ), proc.stdout
    proc = python_m("vit_jax.plan", *SMALL, *at, "--seq_len=64", "--fit", env=WITH_LIBTPU)
    assert proc.returncode == 1 and proc.stderr.splitlines()[0] == (
        "error: --seq_len plans one step: leave out --fit and --compare"
    )
