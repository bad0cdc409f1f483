"""The benchmark scripts run and print figures that make sense (on the tiny model).

Speed targets are not asserted here (they are machine figures, in BENCHMARKS.md); this
keeps the scripts from rotting as the package changes.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
        capture_output=True,
        text=True,
        cwd="/",  # the scripts find the package and configs/ themselves
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def row(out, first):
    """The cells of the table row starting with `first`."""
    return next(line.split() for line in out.splitlines() if line.startswith(first))


def test_inference_prints_speed_flops_and_bound():
    out = run("inference.py", "--model=testing", "--batch=2", "--image_size=32,48")
    for size in ("32", "48"):
        cells = [c for c in out.splitlines() if c.startswith("testing") and f" {size} " in c]
        name, res, batch, dtype, ips, gflop, gflops, ms, bound_ms, ratio = cells[0].split()
        assert (res, batch, dtype) == (size, "2", "float32")
        assert float(ips) > 0 and float(ms) > 0 and float(bound_ms) > 0 and float(ratio) > 0


def test_train_step_prints_the_ratio_for_both_optimizers():
    for opt in ("sgd", "adam"):
        out = run(
            "train_step.py", "--model=testing", "--batch=2", "--image_size=32", f"--optimizer={opt}"
        )
        cells = row(out, "testing")
        assert cells[3] == opt and float(cells[5]) > 0 and float(cells[-1]) > 0


def test_memory_prints_state_per_device_and_largest_batches():
    out = run(
        "memory.py",
        "--models=testing",
        "--state_models=ViT-B_16",
        "--image_size=32",
        "--budget_gib=0.05",
        "--variants=plain",
    )
    cells = row(out, "ViT-B_16")
    params, replicated, fsdp = int(cells[1].replace(",", "")), float(cells[4]), float(cells[5])
    assert params == 86_567_656 - (197 - 5) * 768  # 2x2 patches at 32 px: 5 position rows
    assert abs(replicated / fsdp - 8) < 0.1  # FSDP over 8 devices: ~1/8 each
    rows = [line.split() for line in out.splitlines() if line.startswith("testing")]
    assert [r[2] for r in rows] == ["replicated", "fsdp"]
    assert all(int(r[4]) >= 1 and float(r[6]) <= 0.05 for r in rows)  # fits the budget
