"""The benchmark scripts run and print figures that make sense (on the tiny model).

Speed targets are not asserted here (they are machine figures, in BENCHMARKS.md); this
keeps the scripts from rotting as the package changes.
"""

import itertools
import json
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT, TF_NOISE


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
    noise = [line for line in proc.stderr.splitlines() if TF_NOISE.search(line)]
    assert not noise, noise  # nothing imports TensorFlow
    return proc.stdout


def within(value: float, f, *printed: float) -> bool:
    """`value` equals f(*x) for some x that prints as `printed` (one decimal each), up to
    the rounding of `value` itself: the table's columns agree with one another. f is
    monotonic in each argument, so its range over the rounding box is at the corners."""
    box = [(max(p - 0.05, 1e-3), p + 0.05) for p in printed]
    corners = [f(*x) for x in itertools.product(*box)]
    return min(corners) * 0.99 - 0.005 <= value <= max(corners) * 1.01 + 0.005


def row(out, first):
    """The cells of the table row starting with `first`."""
    return next(line.split() for line in out.splitlines() if line.startswith(first))


def analytic_flops(size: int, width=32, depth=2, mlp=64, patch=16, classes=1000) -> dict:
    """Multiply-add FLOPs (2 per MAC) of the 'testing' ViT's matrix products per image,
    counted by hand: patch embedding, per block q/k/v, the two attention products, the
    output projection and the MLP, then the head. A training step does the forward
    pass, and in the backward pass two products per forward one except for the patch
    embedding, whose input (the image) needs no gradient."""
    n = (size // patch) ** 2
    t = n + 1  # with the class token
    embed = n * patch * patch * 3 * width
    block = t * width * 3 * width + 2 * t * t * width + t * width * width + 2 * t * width * mlp
    forward = 2 * (embed + depth * block + width * classes)
    return {"forward": forward, "train": 3 * forward - 2 * embed}


def test_flops_match_the_analytic_count():
    """XLA's cost analysis counts the matrix products plus the elementwise work (softmax,
    LayerNorm, GELU, the optimizer), a few percent more than the products alone."""
    want = analytic_flops(224)
    out = run("inference.py", "--model=testing", "--batch=1", "--image_size=224", "--no-bound")
    assert 1.0 < float(row(out, "testing")[5]) * 1e9 / want["forward"] < 1.1
    out = run("train_step.py", "--model=testing", "--batch=2", "--image_size=224", "--no-bound")
    assert 1.0 < float(row(out, "testing")[6]) * 1e9 / want["train"] < 1.1


def test_inference_prints_speed_flops_and_bound():
    out = run("inference.py", "--model=testing", "--batch=2", "--image_size=32,48")
    for size in ("32", "48"):
        cells = [c for c in out.splitlines() if c.startswith("testing") and f" {size} " in c]
        name, res, batch, dtype, ips, gflop, gflops, ms, bound_ms, ratio = cells[0].split()
        assert (res, batch, dtype) == (size, "2", "float32")
        # The columns agree with each other: img/s from the step time, GFLOP/s from both,
        # the ratio from the bound's and the model's times (to their printed rounding).
        assert within(float(ips), lambda m: 2e3 / m, float(ms))
        assert float(gflops) == pytest.approx(float(gflop) * float(ips), rel=0.01, abs=0.1)
        assert within(float(ratio), lambda m, b: b / m, float(ms), float(bound_ms))


@pytest.mark.slow
def test_train_step_prints_the_ratio_for_both_optimizers():
    for opt in ("sgd", "adam"):
        out = run(
            "train_step.py", "--model=testing", "--batch=2", "--image_size=32", f"--optimizer={opt}"
        )
        cells = row(out, "testing")
        ips, gflop, gflops, ms, bound_ms, ratio = map(float, cells[5:])
        assert cells[3] == opt and within(ips, lambda m: 2e3 / m, ms)
        assert gflops == pytest.approx(gflop * ips, rel=0.01, abs=0.1)
        assert within(ratio, lambda m, b: b / m, ms, bound_ms)


def test_attention_gpu_measures_xla_and_prints_the_cpus_refusal_of_cudnn():
    out = run("attention_gpu.py", "--smoke", "--fit=ViT-Ti_16:32", "--limit_gib=0.3")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    check, xla, cudnn, line, fitted, fit_refused = rows  # agreement: splash on the CPU, bf16
    agree = check["agreement"]  # measured: logits 1.5e-2, gradients 8.2e-3 (median), 5.7e-2
    assert agree["attention"] == "splash" and 0 < agree["logits"] < 0.05
    assert 0 < agree["grad_median"] <= agree["grad_max"] < 0.2
    assert (xla["attention"], xla["batch"]) == ("xla", 4)
    assert xla["ips"] == pytest.approx(4e3 / xla["ms"], rel=0.01)
    assert 0 < xla["temp_gib"] <= xla["total_gib"] < 1
    assert cudnn["refused"].startswith("attention=cudnn needs an NVIDIA GPU, and there is no GPU")
    assert row(out, "| ViT-Ti_16 | 32 | 4 | xla |")[9] == f"{xla['ips']:.0f}"
    # --fit: the line through 32 and 64 images meets the limit at the guess, which then runs
    # with the compiler's bytes near the limit (measured: 0.298 GiB on JAX 0.10, 0.301 on 0.11)
    at32, at64 = line["gib_at"]["32"], line["gib_at"]["64"]
    assert line["gib_an_image"] == pytest.approx((at64 - at32) / 32) and at64 > at32 > 0
    assert line["guess"] == int(64 + (0.3 - at64) / line["gib_an_image"]) > 64
    assert (fitted["batch"], fitted["runs"]) == (line["guess"], True)
    assert fitted["total_gib"] == pytest.approx(0.3, rel=0.03)
    assert fit_refused["refused"].startswith("attention=cudnn needs an NVIDIA GPU")


@pytest.mark.slow
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


@pytest.mark.slow
def test_convert_prints_sizes_speeds_and_agreement():
    out = run("convert.py", "--model=testing", "--image_size=32", "--batch=2",
              "--formats=npz,onnx")  # fmt: skip
    sizes = {r[1]: float(r[5]) for r in (line.split() for line in out.splitlines()) if len(r) > 5
             and r[1] in ("npz", "onnx")}  # fmt: skip
    assert sizes["npz"] == sizes["onnx"] == 0.3, out  # 74,952 float32 parameters at 32 px
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in out.splitlines()
            if line.startswith(("| JAX", "| ONNX"))}  # fmt: skip
    assert set(rows) == {"JAX (jit)", "ONNX (onnxruntime)"}, out
    assert float(rows["JAX (jit)"][1]) == 0.0
    assert float(rows["ONNX (onnxruntime)"][1]) < 1e-4


def test_inference_and_train_step_share_one_flag_block():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import bound
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    several = bound.parser("Inference.", lists=True).parse_args(["--batch=2,4", "--no-bound"])
    assert (several.model, several.batch, several.image_size) == ("ViT-B_16", "2,4", "224")
    assert (several.dtype, several.bound, several.products) == ("float32", False, False)
    one = bound.parser("Train step.", lists=False).parse_args(["--image_size=32", "--products"])
    assert (one.batch, one.image_size, one.bound, one.products) == (8, 32, True, True)
    with pytest.raises(SystemExit):
        bound.parser("Train step.", lists=False).parse_args(["--batch=2,4"])
    for script in ("inference.py", "train_step.py"):
        text = run(script, "--help")
        for flag in ("--model", "--batch", "--image_size", "--dtype", "--no-bound", "--products"):
            assert flag in text, (script, flag)
    assert "--optimizer" in run("train_step.py", "--help")


@pytest.mark.slow  # 16 fresh pinned processes: ~1 minute
@pytest.mark.skipif(
    not os.path.isdir("/usr/share/datasets/fashion-mnist"), reason="no embedded dataset"
)
def test_input_pipeline_prints_grain_bound_decode_and_augreg_costs():
    out = run(
        "input_pipeline.py",
        "--cases=idx32,jpeg224,eval384",
        "--decodes=crop",
        "--cores=1",
        "--batches=2",
        "--warmup=1",
        "--baseline=none",
        "--jpegs=8",
        "--repeats=1",
    )
    # case decode cores tf.data threads workers pool bound vs-tf.data vs-bound
    for case, decode in (("idx32", "-"), ("jpeg224", "crop"), ("eval384", "-")):
        cells = row(out, case)
        assert cells[1:4] == [decode, "1", "-"] and cells[8] == "-"
        threads, workers, pool, bound = (float(c) for c in cells[4:8])
        assert min(threads, workers, pool, bound) > 0
        assert float(cells[9]) == pytest.approx(max(threads, workers) / bound, abs=0.01)
    # decode alone: crop images/s, whole images/s, their ratio
    alone = re.search(r"Inception windows (\d+), simplejpeg whole (\d+), ratio ([\d.]+)", out)
    crop, whole, ratio = (float(x) for x in alone.groups())
    assert ratio == pytest.approx(crop / whole, abs=0.01)
    assert "preprocessing tf_bilinear" in out
    out = run(
        "input_pipeline.py",
        "--augreg",
        "--cases=idx32",
        "--cores=1",
        "--batches=2",
        "--warmup=1",
        "--jpegs=8",
        "--repeats=1",
    )
    rows = [line.split() for line in out.splitlines() if line.startswith("idx32")]
    assert [r[2] for r in rows] == ["none", "light1", "light2", "medium1", "medium2",
                                    "strong1", "strong2"]  # fmt: skip
    none = float(rows[0][3])
    for r in rows:  # per core = images/s on 1 core; vs none; cores per 1,000 images/s
        assert float(r[4]) == pytest.approx(float(r[3]), abs=1)
        assert float(r[5]) == pytest.approx(float(r[3]) / none, abs=0.01)
        assert float(r[6]) == pytest.approx(1000 / float(r[4]), rel=0.01, abs=0.1)


def test_code_lines_counts_code_only():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import code_lines
    finally:
        sys.path.pop(0)
    source = (
        '"""Module doc,\ntwo lines."""\n\n# a comment\nimport os  # trailing\n\n\n'
        'def f():\n    """Doc."""\n    x = """not a\n    docstring"""\n'
        "    return (1 +\n            2)\n"
    )
    assert code_lines.code_lines(source) == 6  # import, def, x = (2 lines), return (2 lines)
    # Counted as ruff formats it, the overrides taken out: a packed line counts as laid out.
    packed = "x = {'a': 1,\n     'b': 2}  # fmt: skip\n" + "y = [\n" + "    1,\n" * 3 + "]\n"
    assert code_lines.formatted({"m.py": packed}) == {
        "m.py": 'x = {"a": 1, "b": 2}\ny = [1, 1, 1]\n'
    }
    assert code_lines.overrides({"m.py": packed + "# fmt: off\nz = 1\n# fmt: on\n"}) == 3
    out = run("code_lines.py", "--by-file")
    total = int(out.splitlines()[-1].split()[0])
    assert total == sum(int(line.split()[0]) for line in out.splitlines()[:-3]) > 5000
    assert out.splitlines()[-1].endswith(
        f"as ruff {code_lines.pinned_ruff()} formats them without overrides"
    )
    assert out.splitlines()[-3].endswith(": none")  # no file over 350 lines, no function over 60
    assert int(out.splitlines()[-2].split()[-1]) == code_lines.overrides(
        code_lines.library_files(None)
    )
    long_file = "x = 1\n" * 351 + "def f():\n" + "    y = 1\n" * 60
    assert code_lines.over_limits({"m.py": long_file}) == ["m.py: 412 lines", "m.py:f: 61 lines"]


def test_plan_matrix_resumes_from_its_file_and_prints_rows(tmp_path):
    """A cell already in --out is not planned again (no libtpu needed): its row is printed
    from the file, bytes in GiB, images/s per chip (two devices a chip on v3)."""
    done = tmp_path / "m.jsonl"
    fits = {"cell": "B/16 224 px, v3-8, data", "compiled": True, "fits": True,
            "total_bytes": 4.5 * 2**30, "hbm_bytes": 16 * 2**30, "device_kind": "TPU v3",
            "devices": 8, "flops": 3.55e12, "step_seconds": 0.1, "images_per_second": 2560.0,
            "utilisation": 0.59, "compile_seconds": 165.0}  # fmt: skip
    refused = {**fits, "cell": "B/16 224 px, v3-8, fsdp", "compiled": False, "fits": False,
               "total_bytes": 20 * 2**30, "images_per_second": 0.0}  # fmt: skip
    done.write_text(json.dumps(fits) + "\n" + json.dumps(refused) + "\n")
    out = run("plan_matrix.py", "--models=b16", "--sizes=224", "--topologies=v3-8",
              f"--out={done}")  # fmt: skip
    rows = out.splitlines()[2:]
    assert rows == [
        "| B/16 224 px, v3-8, data | 4.50 of 16.0 GiB | yes | 3.5 TFLOP | 100 ms | 640 | 59% "
        "| 165 s |",
        "| B/16 224 px, v3-8, fsdp | 20.00 of 16.0 GiB | no (XLA refused) | - | - | - | - "
        "| 165 s |",
    ]
    # A size that is no multiple of the patch is the nearest one: H/14 at 384 plans 378.
    with done.open("a") as f:
        f.write(json.dumps({**fits, "cell": "H/14 378 px, v3-8, data"}) + "\n")
    out = run("plan_matrix.py", "--models=h14", "--sizes=384", "--topologies=v3-8",
              "--shardings=data", f"--out={done}")  # fmt: skip
    assert out.splitlines()[2].startswith("| H/14 378 px, v3-8, data | 4.50 of 16.0 GiB | yes")


@pytest.mark.parametrize(
    "seeds, rematerialises, compiles", [((1, 8), False, 2), ((1, 8), True, 10), ((23, 30), True, 5)]
)
def test_attention_plans_search_finds_the_largest_batch_on_a_byte_curve(
    seeds, rematerialises, compiles
):
    """search() on a synthetic curve, 16 GiB of HBM: 2 GiB held and 1 GiB an image fits 14
    images, found by the line at once (14 fits, 15 does not); where the compiler instead holds
    its bytes at 14.5 GiB up to 40 images (as on v4-8) and then runs out, the answer is 40,
    found by striding and bisecting. Seeded in the flat part (23 and 30, as a narrowing run
    is), it strides too, where following the flat line asked for 350 images a device."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from attention_plan import GiB, search

    class Plan:
        def __init__(self, n):
            flat = rematerialises and 14 < n <= 40
            self.total_bytes = (14.5 if flat else 2 + n) * GiB
            self.hbm_bytes, self.step_seconds = 16 * GiB, 0.0
            self.fits = self.total_bytes <= self.hbm_bytes

    asked = []
    at = lambda n: asked.append(n) or Plan(n)  # noqa: E731
    found = search({n: Plan(n) for n in seeds}, at, 8, max_compiles=12)
    best = 40 if rematerialises else 14
    assert found.startswith(f"**{8 * best}** ({best}; {best + 1} a device does not fit")
    assert len(asked) == compiles and max(asked) < 2 * best, asked


def cells_of(out, first):
    """The cells of the Markdown row starting with `| first |`, stripped."""
    line = next(x for x in out.splitlines() if x.startswith(f"| {first} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def test_naflex_train_prints_both_steps_their_ratio_compiles_and_padding():
    """--smoke: a tiny ViT at N = 16 and 36, 576 patches a step (batches 36 and 16); each row's
    columns agree with one another, the one NaFlex step compiled once per length. Padding at
    16 patches of 4 px, by hand: 28x84 and 84x28 are 2x6 (25%), 28x28 4x4 (0), the four
    others 3x5 or 5x3 (1/16): 75/7 = 10.7% over the study's seven canvases."""
    out, padding = run("naflex_train.py", "--smoke").split("\npadding of a row")
    for n, batch, grid in (("16", 36, "4x4"), ("36", 16, "6x6")):
        c = cells_of(out, n)
        assert int(c[1]) == batch and c[2].split(", ")[0] == grid, c
        sq_ms, (sq_ips, sq_pps) = number(c[2].split(", ")[1]), map(number, c[3].split(", "))
        fill, grids, fx_ms = c[4].split(", ")
        fx_ips, rest = c[5].split(", ")
        fx_ips = number(fx_ips)
        fx_pps, real = (number(x.strip("()")) for x in rest.split())
        assert sq_ips == pytest.approx(batch * 1e3 / sq_ms, rel=0.02)
        assert fx_ips == pytest.approx(batch * 1e3 / number(fx_ms), rel=0.02)
        assert sq_pps == pytest.approx(sq_ips * int(n), rel=0.02)
        assert fx_pps == pytest.approx(fx_ips * int(n), rel=0.02)
        assert 80 <= number(fill) <= 100 and int(grids) > 1  # mixed grids, mostly filled
        assert real == pytest.approx(fx_pps * number(fill) / 100, rel=0.02)
        assert number(c[6]) == pytest.approx(number(fx_ms) / sq_ms, rel=0.05)
    assert "one jitted step, 2 compiled versions for 2 lengths" in out
    c = cells_of(padding, "16")
    assert c[1:4] == ["10.7%", "0.0% - 25.0%", "2x6, 4x4, 6x2"], c
    assert cells_of(padding, "147")[3] == "7x21, 12x12, 21x7"  # 28x84 at its own size: no padding


def test_naflex_input_prints_both_pipelines_and_their_ratio():
    """--smoke: 4 images a kind, one pass; NaFlex / square is the ratio of the rates."""
    out = run("naflex_input.py", "--smoke")
    for kind in ("jpeg 375x500", "jpeg 480x640", "array 28x84"):
        c = next(line for line in out.splitlines() if line.startswith(f"| {kind}"))
        square, flex, ratio = (float(x) for x in c.strip("|").split("|")[1:4])
        assert ratio == pytest.approx(flex / square, abs=0.01) and min(square, flex) > 0
