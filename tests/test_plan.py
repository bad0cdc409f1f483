"""The planner (python -m vit_jax.plan, vit_jax/training/planner.py): the loop's own step,
compiled for TPU topologies on this CPU by libtpu, whose figures are checked against an
independent count: parameters x bytes x optimizer slots, 6 x parameters x tokens FLOPs
plus the attention term.

libtpu lives apart from the environment (setup.sh installs it in VIT_JAX_LIBTPU_DIR,
default ~/.cache/vit_jax/libtpu-pyX.Y, one per Python): the commands run in subprocesses with it on
PYTHONPATH, as a user with `pip install "vit_jax[plan]"` runs them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from helpers import MISSING, python_m, tiny_config

from vit_jax.models import param_shapes
from vit_jax.parallel import sharding
from vit_jax.training import compiled, planner
from vit_jax.training import state as state_lib
from vit_jax.training import step as step_lib
from vit_jax.training.state import Start, abstract_state, build_model

LIBTPU_DIR = os.environ.get(
    "VIT_JAX_LIBTPU_DIR",
    os.path.join(
        os.path.expanduser("~"), ".cache", "vit_jax", "libtpu-py{}.{}".format(*sys.version_info)
    ),
)
needs_libtpu = pytest.mark.skipif(
    not os.path.isdir(os.path.join(LIBTPU_DIR, "libtpu")),
    reason=f"{MISSING} libtpu in {LIBTPU_DIR} (setup.sh installs it there)",
)
WITH_LIBTPU = {"PYTHONPATH": os.pathsep.join(filter(None, [LIBTPU_DIR, os.getenv("PYTHONPATH")]))}
# A small ViT whose step compiles in seconds: 4x4 patches of 32 px (64 tokens + class).
SMALL = ["--config=fashion_mnist:tiny", "--config.image_size=32", "--config.batch_size=64",
         "--config.model.width=64", "--config.model.mlp_dim=256", "--config.model.depth=2",
         "--config.model.num_heads=2", "--config.model.patch_size=4"]  # fmt: skip


def plan_json(*args: str, env=WITH_LIBTPU) -> dict:
    proc = python_m("vit_jax.plan", *args, "--json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stderr.strip() == "", proc.stderr[-2000:]  # libtpu's warnings are held
    return json.loads(proc.stdout)


def small_model():
    c = tiny_config()
    c.image_size = 32
    c.model.update(width=64, mlp_dim=256, depth=2, num_heads=2, patch_size=4)
    return c, build_model(c.model, 10)


@needs_libtpu
@pytest.mark.parametrize("topology, devices, kind", [("v3-8", 8, "TPU v3"),
                                                     ("v5e:2x2", 4, "TPU v5 lite")])  # fmt: skip
def test_a_plan_counts_what_an_independent_count_gives(topology, devices, kind, plain_plan):
    p = plain_plan if topology == "v3-8" else plan_json(*SMALL, f"--topology={topology}")
    assert (p["topology"], p["devices"], p["device_kind"]) == (topology, devices, kind)
    c, model = small_model()
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(param_shapes(model, 32)))
    # Data parallel: each device holds every float32 parameter, and Adam's two moments
    # (plus two int32 step counts: Adam's and the learning-rate schedule's).
    assert p["param_bytes"] == 4 * n
    assert p["optimizer_bytes"] == 8 * n + 8
    assert p["batch_bytes"] == 64 // devices * (32 * 32 * 3 + 10) * 4
    # FLOPs per device: a train step is ~3 forward passes; a forward pass is 2 x the matmul
    # parameters x tokens plus attention's two T x T x D products per layer.
    tokens, d, depth = 65, 64, 2
    matmul = n - 10 * 64  # every parameter but biases and norms, roughly: bounded below
    forward = 2 * matmul * tokens + 2 * 2 * tokens * tokens * d * depth
    expected = 3 * forward * 64 / devices
    assert 0.8 * expected < p["flops"] < 1.5 * expected, (p["flops"], expected)
    assert p["fits"] and p["hbm_bytes"] == compiled.CHIPS[kind].hbm_bytes
    assert 0 < p["compile_seconds"] < 600 and p["compiled"]
    if not compiled.CHIPS[kind].estimates:  # v5e: libtpu's cost model times no step
        assert p["step_seconds"] == 0 and not p["images_per_second"]
        return
    assert p["step_seconds"] > 0
    assert p["images_per_second"] == pytest.approx(64 / p["step_seconds"])
    steps_total = c.total_steps
    assert p["core_days"] == pytest.approx(steps_total * p["step_seconds"] * devices / 86400)


FIT = """
import json
from vit_jax.configs import fashion_mnist
from vit_jax.training import planner
c = fashion_mnist.get_config("tiny")
c.model.update(width=64, mlp_dim=256, depth=2, num_heads=2, patch_size=4)
c.image_size, c.batch_size = 224, 64
good, bad, n = planner.fit(c, planner.topology_devices("v3-8"), "v3-8", 10, max_compiles=6)
print(json.dumps({"fits": good.to_json(), "does_not_fit": bad.to_json(), "compiles": n}))
"""


@pytest.mark.slow  # 6 compiles: 6 minutes on 2 cores (the command's --fit runs 4 such)
@pytest.mark.long
@needs_libtpu
def test_fit_finds_a_batch_that_fits_and_one_twice_that_does_not():
    """The search with the real compiler for a v3-8 (224 px in 4 px patches: 3137 tokens,
    so attention fills 16 GiB quickly): a batch that fits and one at most twice it that
    does not, both multiples of the 8 devices. The command's four searches (data, FSDP,
    with and without remat) are checked on a stand-in compile below."""
    proc = subprocess.run([sys.executable, "-c", FIT], capture_output=True, text=True,
                          env={**os.environ, **WITH_LIBTPU}, timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.splitlines()[-1])
    good, bad = r["fits"], r["does_not_fit"]
    assert good["fits"] and not bad["fits"] and r["compiles"] <= 6, r
    assert good["batch_size"] % 8 == 0 and good["batch_size"] < bad["batch_size"]
    assert bad["batch_size"] <= 2 * good["batch_size"]


def test_the_fit_command_prints_the_four_searches(monkeypatch, capsys):
    """`plan --fit --json`: one line for each of data, data + remat, fsdp, fsdp + remat,
    each with the search's two plans (on a stand-in compile: remat fits twice the batch)."""
    from vit_jax import plan as command

    def fake(config, devices, name, num_classes=None):
        limit = 200 * (2 if config.model.remat else 1)
        fits = config.batch_size <= limit
        return planner.Plan(name, "TPU v3", 8, config.batch_size, {"data": 8}, config.model.remat,
                            0, 0, 0, 0, 1 if fits else 2, 1, 1.0, 1.0, 1, 1)  # fmt: skip

    monkeypatch.setattr(planner, "plan_on", fake)
    monkeypatch.setattr(command, "flags", SimpleNamespace(FLAGS=SimpleNamespace(json=True)))
    command.fit(tiny_config(), [None] * 8, "v3-8", 10)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["sharding"] for r in rows] == ["data", "data + remat", "fsdp", "fsdp + remat"]
    assert [r["fits"]["batch_size"] for r in rows] == [200, 400, 200, 400]
    assert [r["does_not_fit"]["batch_size"] for r in rows] == [208, 416, 208, 416]  # 8 compiles


@needs_libtpu
def test_a_plan_that_does_not_fit_says_by_how_much_and_what_to_change():
    args = [*SMALL, "--config.image_size=224", "--config.batch_size=4096", "--topology=v3-8"]
    proc = python_m("vit_jax.plan", *args, env=WITH_LIBTPU, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "does NOT fit" in proc.stdout
    assert "over the device's HBM; try --config.model.remat=True" in proc.stdout
    assert "--config.mesh.fsdp=8" in proc.stdout


@pytest.mark.parametrize("seq_len", ["-3", "0"])
def test_a_seq_len_that_is_no_length_is_one_line(seq_len):
    """As infer, evaluate and fewshot refuse it (it was JAX's traceback at -3, and 0 planned
    the square model)."""
    proc = python_m("vit_jax.plan", *SMALL, "--topology=v3-8", f"--seq_len={seq_len}")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines()[0] == (
        f"error: flag --seq_len={seq_len}: {seq_len} is not a positive integer "
        "(python -m vit_jax.plan --help lists the flags)"
    )


def test_unknown_topology_and_missing_libtpu_are_one_line_each():
    proc = python_m("vit_jax.plan", *SMALL, "--topology=v9-8", env=WITH_LIBTPU)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: unknown TPU topology 'v9-8': use one of v3-8, v3-32")
    nowhere = {"PYTHONPATH": "", "VIT_JAX_LIBTPU_DIR": os.devnull}  # not setup.sh's either
    proc = python_m("vit_jax.plan", *SMALL, "--topology=v3-8", env=nowhere)
    if proc.returncode == 0:  # libtpu installed in this environment itself
        pytest.skip("libtpu is importable without VIT_JAX_LIBTPU_DIR here")
    assert proc.stderr.splitlines()[0] == (
        'error: compiling for TPUs needs libtpu: pip install "jax[tpu]" (libtpu, the version '
        "this JAX pins; it compiles for TPUs on any host), or this package's [plan] extra, or "
        "run ./setup.sh, whose copy in VIT_JAX_LIBTPU_DIR (default "
        "~/.cache/vit_jax/libtpu-pyX.Y) is found"
    ), proc.stderr[-2000:]


@needs_libtpu
def test_plan_finds_the_libtpu_setup_sh_installed():
    """setup.sh puts libtpu out of the environment (VIT_JAX_LIBTPU_DIR): the command, run
    as a user runs it after setup, with nothing on PYTHONPATH, plans with it."""
    env = {"PYTHONPATH": "", "VIT_JAX_LIBTPU_DIR": LIBTPU_DIR}
    proc = python_m("vit_jax.plan", *SMALL, "--topology=v5e-4", "--json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["devices"] == 4


@needs_libtpu
@pytest.mark.parametrize("topology", ["v5e-1", "v6e-1"])
def test_one_chip_topologies_plan(topology):
    """One chip is a host of its own (libtpu's default host is 2x2 chips: "not divisible");
    v5e gives no step-time estimate, v6e one."""
    p = plan_json(*SMALL, f"--topology={topology}")
    assert p["devices"] == 1 and p["fits"]
    assert (p["step_seconds"] > 0) == (topology == "v6e-1")


def test_the_planners_step_is_the_loops_step():
    """The planner lowers the very step the loop runs: the same StableHLO as the loop's
    construction (train._run: build_model, optim.for_config, abstract_state,
    tree_shardings, steps.for_config) for a CPU mesh, sigmoid loss and remat included."""
    c, _ = small_model()
    c.loss, c.model.remat, c.optimizer.mu_dtype = "sigmoid_xent", True, "bfloat16"
    mesh = sharding.make_mesh(-1, 2)
    step, state, batch = planner.loop_step(c, mesh, 10)
    mine = step.lower(state, batch).as_text()
    model = build_model(c.model, 10)
    tx, lr_fn = state_lib.optimizer_of(c)
    abstract = abstract_state(Start(seed=c.seed, image_size=c.image_size), model, tx)
    shardings = sharding.tree_shardings(mesh, abstract)
    loop, _ = step_lib.jit_steps(model, tx, lr_fn, mesh, shardings, c.accum_steps, c.loss)
    assert loop.lower(state, batch).as_text() == mine
    c.loss = "softmax_xent"  # and a change the loop would see, the planner sees
    other, state2, batch2 = planner.loop_step(c, mesh, 10)
    assert other.lower(state2, batch2).as_text() != mine


def test_xlas_out_of_memory_refusal_is_read_as_bytes():
    message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for "
               "HLO temporaries (20.55G) exceeds available HBM (15.48G).")  # fmt: skip
    assert planner.out_of_memory(message) == (int(20.55 * 2**30), int(15.48 * 2**30))
    assert planner.out_of_memory("INVALID_ARGUMENT: something else") is None


def test_fit_bisects_to_the_largest_multiple_that_fits(monkeypatch):
    """The search alone, on a stand-in compile where a batch fits up to 200 images: from
    64 it doubles to 128 and 256, then bisects between them in steps of 8 devices."""
    seen = []

    def fake(config, devices, name, num_classes=None):
        seen.append(config.batch_size)
        fits = config.batch_size <= 200
        return planner.Plan(name, "TPU v3", 8, config.batch_size, {"data": 8}, False,
                            0, 0, 0, 0, 1 if fits else 2, 1, 1.0, 1.0, 1, 1)  # fmt: skip

    monkeypatch.setattr(planner, "plan_on", fake)
    good, bad, n = planner.fit(tiny_config(), [None] * 8, "v3-8")
    assert (good.batch_size, bad.batch_size) == (200, 208) and n == len(seen) <= 8
    assert seen[:3] == [64, 128, 256]
    good, bad, n = planner.fit(tiny_config(batch_size=1024), [None] * 8, "v3-8")
    assert (good.batch_size, bad.batch_size) == (200, 208) and n <= 8


@pytest.mark.parametrize("estimate", [-90.46, float("nan"), float("inf"), None, 0.0])
def test_an_estimate_that_is_not_a_positive_time_is_none(estimate):
    """libtpu's cost model gave ViT-B/16 at 384 px on v4-8 -90 s (measured): the plan says
    it has no estimate rather than printing negative images/s and core-days."""
    from types import SimpleNamespace

    memory = SimpleNamespace(
        argument_size_in_bytes=10, output_size_in_bytes=10, alias_size_in_bytes=10,
        temp_size_in_bytes=5, generated_code_size_in_bytes=1,
    )  # fmt: skip
    cost = {"flops": 2e12} if estimate is None else {"flops": 2e12, "optimal_seconds": estimate}
    executable = SimpleNamespace(memory_analysis=lambda: memory, cost_analysis=lambda: [cost])
    assert compiled.compiled_figures(executable) == (5, 16, 2e12, 0.0)
    cost["optimal_seconds"] = 0.25
    assert compiled.compiled_figures(executable)[3] == 0.25


def test_a_plan_without_an_estimate_says_so():
    from vit_jax import plan as command
    from vit_jax.training import planner

    p = planner.Plan(
        topology="v4-8", device_kind="TPU v4", devices=8, batch_size=512,
        mesh={"data": 8, "fsdp": 1}, remat=False, param_bytes=2**30, optimizer_bytes=2**30,
        batch_bytes=2**20, temp_bytes=2**33, total_bytes=2**34, hbm_bytes=16 * 2**30,
        flops=2.17e13, step_seconds=0.0, total_steps=20_000, cores_per_device=1,
        compiled=True, compile_seconds=175.0,
    )  # fmt: skip
    lines = command.table(p).splitlines()
    assert lines[-1].split(None, 2)[2] == (
        "no estimate: the compiler's cost model gave none for this step"
    )
    assert not any(k in "\n".join(lines) for k in ("images/s", "core-days", "utilisation"))


@pytest.fixture(scope="module")
def plain_plan():
    """The SMALL run's plan for v3-8, without a loop (compiled once for the tests below)."""
    return plan_json(*SMALL, "--topology=v3-8")


@needs_libtpu
@pytest.mark.parametrize("override, loop", [("--config.model.scan=True", "model.scan"),
                                            ("--config.accum_steps=2", "accum_steps")])  # fmt: skip
def test_a_step_with_a_loop_gives_memory_but_no_flops_or_time(override, loop, plain_plan):
    """XLA's cost analysis counts a loop's body once (measured: ViT-B/16 scanned gave 1/11
    of the FLOPs and 1/5 of the time; two micro-batches half the FLOPs): the plan keeps
    the compiled step's bytes and says it has no FLOPs or time rather than print a
    fraction as the whole."""
    from vit_jax import plan as command

    plain, looped = plain_plan, plan_json(*SMALL, "--topology=v3-8", override)
    assert not plain["loop"] and plain["flops"] > 0 and plain["step_seconds"] > 0
    assert looped["loop"] == loop and looped["compiled"] and looped["fits"]
    assert (looped["flops"], looped["step_seconds"], looped["images_per_second"]) == (0, 0, 0)
    assert looped["param_bytes"] == plain["param_bytes"] > 0
    assert looped["temp_bytes"] > 0 and looped["total_bytes"] > looped["param_bytes"]
    fields = {f.name for f in dataclasses.fields(planner.Plan)}  # the command's own table
    text = command.table(planner.Plan(**{k: v for k, v in looped.items() if k in fields}))
    assert f"no estimate: XLA counts the {loop} loop's body once; plan with --config.{loop}=" in (
        text
    )
    assert "images/s" not in text


def test_the_loops_own_line_gives_no_flops_for_a_step_with_a_loop():
    """The training loop's start-up line (own_plan_line) follows the same rule as a plan."""
    c, _ = small_model()
    assert compiled.loop_of(c) is None
    c.accum_steps = 2
    assert compiled.loop_of(c) == "accum_steps"
    c.model.scan = True
    assert compiled.loop_of(c) == "model.scan"
    mesh = sharding.make_mesh(-1, 1)
    step, state, batch = planner.loop_step(c, mesh, 10)  # abstract, with their shardings
    line = compiled.compiled_line(step, state, batch, "model.scan")
    assert line.endswith("temporaries); no FLOPs or step time: XLA counts the model.scan "
                         "loop's body once"), line  # fmt: skip
    assert "FLOP per device" not in line


def test_the_loops_own_line_adds_a_fused_kernels_flops(monkeypatch):
    """XLA's cost analysis does not see inside a fused kernel: the loop's start-up line adds
    its analytic FLOPs (12 B N² width a block) and says which share they are; with XLA's
    attention nothing is added. (The splash kernel runs in interpret mode on this CPU.)"""
    c, _ = small_model()
    mesh = sharding.make_mesh(-1, 1)
    lines = {}
    for how in ("xla", "splash"):
        c.model.attention = how
        model = build_model(c.model, 10)
        step, state, batch = planner.loop_step(c, mesh, 10)
        per_device = c.batch_size / jax.device_count()
        kernel = compiled.kernel_flops(model, (c.image_size // 4) ** 2 + 1, per_device)
        assert kernel == (0 if how == "xla" else 12 * per_device * 65**2 * 64 * 2), how
        lines[how] = compiled.compiled_line(step, state, batch, None, model)
    share = re.search(r"GFLOP per device per step, (\d+)% of them the attention kernel's "
                      r"\(analytic\)", lines["splash"])  # fmt: skip
    assert share and 0 < int(share[1]) < 100, lines["splash"]
    assert "kernel" not in lines["xla"] and "GFLOP per device per step" in lines["xla"]
    # XLA:GPU counts 4.7 of B/16's 105.5 GFLOP an image (an H200): on a GPU, no FLOPs
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    gpu = compiled.compiled_line(step, state, batch, None, model)
    assert gpu.endswith("; no FLOPs: XLA:GPU's count leaves out the cuBLAS and cuDNN calls"), gpu
    assert "FLOP per" not in gpu


@needs_libtpu
def test_a_plan_with_the_splash_kernel_adds_the_kernels_flops():
    """At 577 tokens (96 px in 4 px patches) on v5e, `auto` is the splash kernel: the plan's
    FLOPs add the kernel's analytic 12 B H N² hd a block, which XLA's cost analysis leaves
    out, and then agree with XLA's own count of its explicit attention. At 2 images a
    device: the kernel's compile time grows with the images (25 s at 2, 112 s at 16). TPU
    v3 does not compile it in bfloat16: one line says so."""
    at = lambda *a: plan_json(*SMALL, "--config.image_size=96", "--config.batch_size=8",
                              "--topology=v5e:2x2", *a)  # fmt: skip
    xla, auto = at("--config.model.attention=xla"), at()
    assert auto["kernel_flops"] == 12 * 2 * 577**2 * 64 * 2 and xla["kernel_flops"] == 0
    # the two totals agree to within the softmax and the kernel's padding
    assert auto["flops"] == pytest.approx(xla["flops"], rel=0.05)
    proc = python_m("vit_jax.plan", *SMALL, "--config.image_size=96", "--topology=v3-8",
                    "--config.model.attention=splash", "--config.model.dtype=bfloat16",
                    env=WITH_LIBTPU, timeout=900)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines()[0] == (
        "error: attention=splash does not compile for TPU v3 "
        "in bfloat16: use attention=xla, or dtype=float32"
    )


@pytest.mark.slow  # two compiles at 16 images a device: ~7 minutes here
@pytest.mark.long
@needs_libtpu
def test_a_plan_with_the_splash_kernel_keeps_less():
    """No [N, N] probabilities kept for the backward pass: at 16 images a device the splash
    step's temporaries are under 0.7 of XLA's (measured 43.5 against 95.7 MB; at 2 and 8
    images a device the two are equal, XLA recomputing its softmax)."""
    at = lambda a: plan_json(*SMALL, "--config.image_size=96", "--topology=v5e:2x2",
                             f"--config.model.attention={a}")  # fmt: skip
    xla, splash = at("xla"), at("splash")
    assert splash["temp_bytes"] < 0.7 * xla["temp_bytes"], (splash, xla)
