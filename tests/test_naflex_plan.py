"""The planner on a NaFlex model (vit_jax/training/planner.py, `plan --seq_len=N`): the
loop's step lowered for batches of N patches a row, the tokens it attends over and what the
attention kernel pads them to; and benchmarks/naflex_forward.py in its smoke mode."""

from __future__ import annotations

import os
import subprocess
import sys

import helpers
import jax
import numpy as np
import pytest
from helpers import ROOT, python_m, random_params, tiny_config
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


def benchmark(*args: str, env: dict) -> str:
    """benchmarks/naflex_forward.py's output, run as a user runs it (from /, without the
    suite's float32 matmul precision, which the splash kernel refuses in bfloat16)."""
    env = {**os.environ, **env}
    env.pop("JAX_DEFAULT_MATMUL_PRECISION", None)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "naflex_forward.py"), *args],
        capture_output=True, text=True, cwd="/", env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def cells(out: str, first: str) -> list[str]:
    """The cells of the Markdown row starting with `| first |`."""
    line = next(x for x in out.splitlines() if x.startswith(f"| {first} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_benchmark_prints_both_forward_passes_and_their_ratio():
    """--smoke: a tiny model at N = 16 and 36 on this CPU; the grids of the four aspect ratios
    fill 86% and 89% of N (by hand: 4x4, 3x4, 4x3, 3x5 of 16; 6x6, 5x6, 6x5, 4x8 of 36)."""
    out = benchmark("--smoke", "--no-plan", env={})
    for n, px, fill in [("16", "16", "86%"), ("36", "24", "89%")]:
        row = cells(out, n)
        (size, square_ms), (filled, flex_ms) = row[1].split(", "), row[2].split(", ")
        assert (size, filled) == (px, fill), row
        assert float(row[3]) == pytest.approx(float(flex_ms) / float(square_ms), rel=0.05)
    assert "planner" not in out


@needs_libtpu
def test_the_benchmark_plans_both_for_v5e_with_splash():
    """With libtpu: one planned row per N, the tokens and splash's 128, the two FLOPs and
    their ratio (NaFlex's a few percent more: the position table's resize)."""
    out = benchmark("--smoke", "--seq_lens=16", "--repeats=1", env=WITH_LIBTPU)
    row = cells(out.split("train step planned")[1], "16")
    assert row[1] == "17, 128", row
    square, flex = (float(row[i].split(", ")[0]) for i in (2, 3))
    ratio = float(row[4].split(", ")[0])
    assert square > 0 and ratio == pytest.approx(flex / square, rel=0.01), row
    assert 1.0 <= ratio < 1.1, row


@needs_libtpu
def test_a_naflex_config_is_planned_at_its_longest_length_and_that_lengths_batch():
    """A config with dataset.naflex plans its longest length (the attention that holds the
    most) at the batch the loop gives it: 1,536 patches // 64 = 24, a multiple of 4 devices
    -> 24 images, 6 a device (the loop's rounding, naflex.Lengths)."""
    at = ["--topology=v5e:2x2", "--config.dataset.naflex.seq_lens=(16,64)"]
    flex = plan_json(*SMALL, *at, "--config.dataset.naflex.tokens_per_batch=1536")
    assert (flex["seq_len"], flex["tokens"], flex["batch_size"]) == (64, 65, 24)
    assert flex["batch_bytes"] == 6 * (64 * 48 * 4 + 64 * 2 * 4 + 64 + 10 * 4)
    splash = "--config.model.attention=splash"
    proc = python_m("vit_jax.plan", *SMALL, *at, splash, env=WITH_LIBTPU, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(  # each length, and what the kernel pads it to
        "NaFlex lengths 16 (17 tokens, splash pads them to 128), 64 (65 tokens, splash pads "
        "them to 128): planning the longest"
    ), proc.stdout
    # Without tokens_per_batch: batch_size x the longest length, so the longest keeps 64.
    assert "batch             64 global, 16 per device" in proc.stdout, proc.stdout
    # --seq_len plans another length of the run, at the batch the loop gives it (1536 // 16).
    short = plan_json(*SMALL, *at, "--config.dataset.naflex.tokens_per_batch=1536", "--seq_len=16")
    assert (short["seq_len"], short["batch_size"]) == (16, 96)
