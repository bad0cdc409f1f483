"""The training loop: multi-device equivalence, accumulation, learning, resume, configs."""

import contextlib
import io
import json
import os
import signal

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import (
    ROOT,
    assert_npz_equal,
    assert_trained_alike,
    batch,
    flat,
    initial_params,
    model_and_optimizer,
    needs_embedded_data,
    python_m,
    read_scalars,
    run_command,
    snapshot,
    tiny_config,
    training,
)
from PIL import Image

from vit_jax import configs, weights
from vit_jax.base.console import duration
from vit_jax.configs import common
from vit_jax.models import param_shapes
from vit_jax.parallel import sharding
from vit_jax.training import report, stopping, train
from vit_jax.training import state as state_lib
from vit_jax.training import step as step_lib
from vit_jax.training.report import console_line
from vit_jax.workdir.checkpoints import Checkpoints


def steps_on(mesh, config, batches, accum_steps=1):
    state, step, _ = training(config, mesh, accum_steps)
    losses = []
    for b in batches:
        state, m = step(state, sharding.global_batch(b, mesh))
        losses.append(float(m["loss"]))
    return losses, jax.device_get(state.params)


def lr_sum(config, steps):
    lr = model_and_optimizer(config)[2]
    return sum(float(lr(i)) for i in range(steps))


def test_eight_devices_match_one():
    assert jax.device_count() == 8
    config = tiny_config()
    batches = [batch(64, seed=i) for i in range(3)]
    one = steps_on(sharding.make_mesh(devices=jax.devices()[:1]), config, batches)
    eight = steps_on(sharding.make_mesh(), config, batches)
    np.testing.assert_allclose(one[0], eight[0], rtol=1e-5)
    assert one[0][2] != one[0][0]  # the steps did change something
    assert_trained_alike(one[1], eight[1], lr_sum(config, len(batches)))


def test_accumulation_equals_one_big_batch():
    config = tiny_config()
    big = [batch(64, seed=i) for i in range(2)]
    mesh = sharding.make_mesh()
    whole = steps_on(mesh, config, big)
    accumulated = steps_on(mesh, config, big, accum_steps=4)
    np.testing.assert_allclose(whole[0], accumulated[0], rtol=1e-5)
    assert_trained_alike(whole[1], accumulated[1], lr_sum(config, len(big)))


def test_bfloat16_training_steps_track_float32():
    mesh = sharding.make_mesh()
    batches = [batch(64, seed=i) for i in range(3)]
    f32 = steps_on(mesh, tiny_config(), batches)
    config = tiny_config()
    config.model.dtype = "bfloat16"
    bf16 = steps_on(mesh, config, batches)
    assert all(p.dtype == np.float32 for p in jax.tree.leaves(bf16[1]))  # master weights
    diffs = np.abs(np.array(bf16[0]) - np.array(f32[0]))
    assert 0 < diffs.max() < 0.02, (bf16[0], f32[0])  # computed in bf16, close to f32


@pytest.mark.slow  # two runs; test_models compares the gradients in the default set
@needs_embedded_data
def test_remat_scan_run_matches_the_plain_run_end_to_end(tmp_path):
    """From the same parameters (a scanned model initialises its own differently), a run
    with remat and scan ends where the plain run does, and exports the published names."""
    start = tiny_config()
    plain_model = state_lib.build_model(start.model, 10)
    weights.save_npz(
        tmp_path / "init.npz", initial_params(state_lib.Start.of(start), plain_model, 28)
    )
    finals = []
    for switches in ({}, {"remat": True, "scan": True}):
        config = tiny_config(total_steps=8, checkpoint_every=4, eval_every=8, log_every=4)
        config.update(init_from=str(tmp_path / "init.npz"), reset_head=False)
        config.model.update(switches)
        summary = train.run(config, str(tmp_path / str(len(finals))))
        finals.append((summary, weights.load_npz(tmp_path / str(len(finals)) / "final.npz")))
    (plain, plain_npz), (scanned, scanned_npz) = finals
    assert flat(scanned_npz).keys() == flat(plain_npz).keys()  # published per-block names
    for k, v in flat(plain_npz).items():
        np.testing.assert_allclose(flat(scanned_npz)[k], v, atol=2e-5, err_msg=k)
    assert scanned["train_loss"] == pytest.approx(plain["train_loss"], abs=1e-4)
    assert scanned["accuracy"] == pytest.approx(plain["accuracy"], abs=2 / 256)


@needs_embedded_data
def test_short_run_learns_and_a_ctrl_c_run_resumes_bit_identically(tmp_path, capsys, monkeypatch):
    """A 40-step run, and the same run stopped by Ctrl-C right after its step-20 save (it
    stops after the step in flight, 21, and saves it) and run again: the same final
    parameters bit for bit, one TensorBoard curve 1..40, and the reported accuracy is the
    exported model's, computed apart from the loop."""
    config = tiny_config(total_steps=40, checkpoint_every=20, eval_every=20, log_every=1)
    config.optimizer.lr = 3e-3
    whole = train.run(config, str(tmp_path / "whole"))
    workdir = str(tmp_path / "run")
    save = Checkpoints.save

    def save_then_ctrl_c(self, step, state):
        save(self, step, state)
        if step == 20:  # the loop's StopRequest takes it: it stops after this step
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Checkpoints, "save", save_then_ctrl_c)
    with pytest.raises(stopping.Stopped, match="stopped at step 21 by SIGINT; checkpoint 21 "):
        train.run(config, workdir)
    monkeypatch.undo()
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["20", "21"]
    capsys.readouterr()
    s40 = train.run(config, workdir)
    out = capsys.readouterr().out
    assert "resuming from step 21" in out and "step 22/40" in out and "step 1/40" not in out
    assert_npz_equal(f"{workdir}/final.npz", f"{tmp_path}/whole/final.npz")
    assert s40["accuracy"] == whole["accuracy"] and s40["train_loss"] == whole["train_loss"]
    assert s40["accuracy"] == pytest.approx(accuracy_of(f"{workdir}/final.npz", config), abs=1e-6)
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert summary["steps"] == 40 and summary["accuracy"] == s40["accuracy"]
    losses = [
        float(line.split("loss ")[1].split(" ")[0])
        for line in out.splitlines()
        if line.startswith("step ") and "| loss" in line
    ]
    # Learned: the loss fell well below chance (ln 10 = 2.30).
    assert np.mean(losses[-5:]) < 2.0, losses
    scalars = tensorboard_scalars(workdir)
    assert [step for step, _ in scalars["loss"]] == list(range(1, 41))  # log_every=1, resumed
    assert scalars["loss"][-1][1] == pytest.approx(losses[-1], abs=5e-5)
    assert [step for step, _ in scalars["eval/accuracy"]] == [20, 40]
    assert scalars["eval/accuracy"][1][1] == pytest.approx(s40["accuracy"])
    exported = weights.load_npz(os.path.join(workdir, "final.npz"))
    assert exported["head"]["kernel"].shape == (32, 10)


def tensorboard_scalars(workdir: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from the run's TensorBoard event files, in step order."""

    return read_scalars(workdir)


def accuracy_of(npz: str, config) -> float:
    """Test accuracy of an exported checkpoint, computed apart from the loop: the test
    split's images through a direct apply of the model, argmax against the labels."""
    from vit_jax import data

    model = state_lib.build_model(config.model, data.num_classes(config.dataset))
    params = weights.load_pretrained(npz, model, config.image_size, reset_head=False)
    split = config.dataset.test_split
    correct = total = 0
    size = config.image_size
    batches = data.eval_iterator(config.dataset, split, global_batch=64, image_size=size)
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))
    for b in batches:
        logits = apply(params, b["image"])
        keep = b["mask"] > 0
        hits = np.argmax(np.asarray(logits), -1) == np.argmax(b["label"], -1)
        correct, total = correct + int(hits[keep].sum()), total + int(keep.sum())
    return correct / total


def pretrain_config():
    """20 steps of pretraining on classes 0-4 with a pre_logits layer, few-shot at 10, 20."""
    config = tiny_config(total_steps=20, checkpoint_every=0, eval_every=20)
    config.model.representation_size = 32  # pretraining head: few-shot reads pre_logits
    config.dataset.classes = (0, 1, 2, 3, 4)
    config.fewshot.update(
        datasets="fashion_mnist", test_split="test[:200]", shots=(1, 5), l2=1.0, every=10
    )
    return config


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(workdir, summary, stdout) of one pretraining run, shared by the fine-tuning and
    few-shot tests."""
    workdir = str(tmp_path_factory.mktemp("pretrained"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = train.run(pretrain_config(), workdir)
    return workdir, summary, out.getvalue()


@needs_embedded_data
def test_the_loop_prints_what_the_compiler_says_of_its_own_step(pretrained):
    """After the first step, one line from the loop's own compiled step (no second
    compile): the bytes per device and FLOPs that the planner's separate compile of the
    same step for the same devices gives."""
    from vit_jax.base import console
    from vit_jax.training import planner

    (line,) = [x for x in pretrained[2].splitlines() if x.startswith("compiled step: ")]
    plan = planner.plan_on(pretrain_config(), jax.devices(), "cpu", num_classes=5)
    assert plan.compiled and plan.total_bytes > plan.temp_bytes > 0 and plan.flops > 0
    assert line.startswith(f"compiled step: {console.size(plan.total_bytes)} per device (")
    assert f"({console.size(plan.temp_bytes)} temporaries), " in line
    assert f"{plan.flops / 1e9:.3g} GFLOP per device per step" in line
    assert line.endswith("(the cpu backend gives no step-time estimate)")


@needs_embedded_data
def test_finetune_from_npz_at_higher_resolution(pretrained, tmp_path):
    npz = os.path.join(pretrained[0], "final.npz")
    assert weights.load_npz(npz)["pre_logits"]["kernel"].shape == (32, 32)
    ft = tiny_config(total_steps=10, checkpoint_every=0, eval_every=0, image_size=42, init_from=npz)
    ft.dataset.classes = (5, 6, 7)
    ft.dataset.preprocessing = "pil_antialias"  # recorded in final.npz, which infer reads
    model = state_lib.build_model(ft.model, 3)
    assert model.representation_size is None
    params = initial_params(state_lib.Start.of(ft), model, 42)
    pe = params["Transformer"]["posembed_input"]["pos_embedding"]
    assert pe.shape == (1, 1 + 6 * 6, 32)  # 4x4 grid at 28 px -> 6x6 at 42 px
    assert not params["head"]["kernel"].any() and params["head"]["kernel"].shape == (32, 3)
    stored = weights.load_npz(npz)
    np.testing.assert_array_equal(params["embedding"]["kernel"], stored["embedding"]["kernel"])
    summary = train.run(ft, str(tmp_path / "ft"))
    assert summary["steps"] == 10
    assert summary["accuracy"] == pytest.approx(accuracy_of(f"{tmp_path}/ft/final.npz", ft))
    assert summary["train_loss"] < np.log(3) + 0.05  # started at chance: zero head
    assert weights.load(f"{tmp_path}/ft/final.npz").preprocessing == "pil_antialias"
    assert weights.load(npz).preprocessing == "tf_bilinear"  # the default, recorded as nothing


@needs_embedded_data
def test_fewshot_runs_on_its_cadence_and_matches_the_command(pretrained):
    from vit_jax import data
    from vit_jax.evaluation import linear
    from vit_jax.models import apply_with_intermediates

    workdir, summary, out = pretrained
    lines = [line for line in out.splitlines() if "few-shot" in line]
    assert [line.split(":")[0] for line in lines] == ["step 10", "step 20"], out
    assert all("few-shot fashion_mnist 1/5-shot " in line for line in lines)
    keys = ["fewshot/fashion_mnist_1shot", "fewshot/fashion_mnist_5shot"]
    assert sorted(k for k in summary if k.startswith("fewshot/")) == keys
    assert json.load(open(os.path.join(workdir, "summary.json")))[keys[1]] == summary[keys[1]]
    # Computed apart from the evaluator: the exported parameters applied directly to the
    # pool (5 training images per class, subset seed 0, as the evaluator documents) and
    # the 200 test images, then the linear fit (tested against the normal equations in
    # test_fewshot). Up to an example or two flipped by the loop's 8-device features.
    params = weights.load_npz(os.path.join(workdir, "final.npz"))
    model = state_lib.build_model(pretrain_config().model, None)  # no head
    apply = jax.jit(lambda p, x: apply_with_intermediates(model, p, x)[1]["pre_logits"])
    features = {}
    for split in ("train", "test[:200]"):
        cfg = data.default_config()
        cfg.update(name="fashion_mnist", source="idx", examples_per_class=5, subset_seed=0)
        xs, ys = [], []
        for b in data.eval_iterator(cfg, split, global_batch=64, image_size=28):
            keep = b["mask"] > 0
            xs.append(np.asarray(apply(params, b["image"]))[keep])
            ys.append(np.argmax(b["label"], -1)[keep])
        features[split] = np.concatenate(xs), np.concatenate(ys)
    assert [len(features[s][1]) for s in features] == [50, 200]
    alone = linear.fewshot_accuracy(
        *features["train"], *features["test[:200]"], (1, 5), l2=1.0, seed=0, num_classes=10
    )
    for k, key in zip((1, 5), keys, strict=True):
        hits = summary[key] * 200  # a count of the 200 test examples
        assert hits == pytest.approx(round(hits)), summary
        assert abs(alone[k] - summary[key]) <= 2 / 200, (alone, summary)
    print(f"few-shot: loop {summary[keys[0]]}, {summary[keys[1]]}; apart {alone}")


@needs_embedded_data
def test_rerun_of_a_finished_run_changes_nothing(pretrained):

    workdir, summary, _ = pretrained
    before = snapshot(workdir)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        again = train.run(pretrain_config(), workdir)
    assert snapshot(workdir) == before  # every file's bytes and mtime, no new file
    assert again == json.load(open(os.path.join(workdir, "summary.json")))
    assert again["accuracy"] == summary["accuracy"] and again["train_loss"] is not None
    assert again["fewshot/fashion_mnist_5shot"] == summary["fewshot/fashion_mnist_5shot"]
    lines = out.getvalue().splitlines()
    assert lines[0] == f"{workdir}: finished at step 20 (summary.json); nothing to do"
    assert lines[1] == f"step 20: test accuracy {summary['accuracy']:.4f}, loss " + (
        f"{summary['eval_loss']:.4f}"
    )
    assert lines[2].startswith("step 20: few-shot fashion_mnist 1/5-shot ") and len(lines) == 3


@needs_embedded_data
def test_fewshot_batch_must_split_over_the_devices(tmp_path):
    config = tiny_config()
    config.fewshot.update(datasets="fashion_mnist", batch_size=60)
    with pytest.raises(ValueError, match="fewshot.batch_size=60: expected a multiple of the 8"):
        train.run(config, str(tmp_path / "odd"))


@needs_embedded_data
def test_unwritable_workdir_fails_first(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="workdir .* is not writable"):
        train.run(tiny_config(), str(blocker / "sub"))


def test_cadence():
    """An action of period k follows each multiple of k and the last step; 0: the last only."""
    assert [s for s in range(1, 101) if train.due(s, 10, 100)] == list(range(10, 101, 10))
    assert [s for s in range(1, 101) if train.due(s, 30, 100)] == [30, 60, 90, 100]
    assert [s for s in range(1, 101) if train.due(s, 0, 100)] == [100]
    assert [s for s in range(1, 8) if train.due(s, 3, 7)] == [3, 6, 7]
    assert duration(3725) == "1h02m05s" and duration(59) == "59s"
    line = console_line(
        5, 10, {"loss": 1.5, "lr": 1e-3, "img_per_sec_per_device": 99.6, "eta_seconds": 61}
    )
    assert line == "step 5/10 | loss 1.5000 | lr 1.00e-03 | 100 img/s/device | ETA 1m01s"


def test_the_losses_against_numpy():
    """softmax_xent and big_vision's sigmoid_xent (a sum of K binary cross-entropies) per
    example, on soft labels (mixup's) and large logits, against float64 NumPy."""
    from vit_jax.training import check

    # the config check takes the losses the step computes, and no other
    assert [check.RUN["loss"](name) for name in step_lib.LOSSES] == [None, None]
    assert check.RUN["loss"]("hinge") == "expected one of 'softmax_xent', 'sigmoid_xent'"
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 8, (5, 7)).astype(np.float32)
    labels = rng.dirichlet(np.ones(7) * 0.3, 5).astype(np.float32)
    z, y = logits.astype(np.float64), labels.astype(np.float64)
    log_sig = lambda v: -np.logaddexp(0, -v)  # noqa: E731
    sigmoid = -np.sum(y * log_sig(z) + (1 - y) * log_sig(-z), -1)
    softmax = -np.sum(y * (z - np.log(np.sum(np.exp(z), -1, keepdims=True))), -1)
    np.testing.assert_allclose(step_lib.sigmoid_xent(logits, labels), sigmoid, rtol=1e-5)
    np.testing.assert_allclose(step_lib.softmax_xent(logits, labels), softmax, rtol=1e-5)
    # The bias big_vision starts a 1000-class head at gives each class about 1/1000.
    assert 1 / (1 + np.exp(6.9)) == pytest.approx(1e-3, rel=0.01)


def test_schedule_and_weight_decay_mask():
    cfg = ml_collections.ConfigDict(dict(lr=1.0, end_lr=0.0, warmup_steps=10, decay="cosine"))
    lr = state_lib.schedule(cfg, 110)
    assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(0.5)
    assert float(lr(10)) == pytest.approx(1.0) and float(lr(60)) == pytest.approx(0.5, abs=1e-6)
    assert float(lr(110)) == pytest.approx(0.0, abs=1e-6)
    cfg.decay = "linear"
    assert float(state_lib.schedule(cfg, 110)(60)) == pytest.approx(0.5)
    params = {"a": {"kernel": jnp.ones(2), "bias": jnp.ones(2)}, "cls": jnp.ones(2)}
    assert state_lib.kernels_only(params) == {"a": {"kernel": True, "bias": False}, "cls": False}
    # Adam's decay is scaled by the learning rate and skips non-kernels.
    c = common.base("testing").optimizer
    c.update(name="adam", lr=0.1, warmup_steps=0, decay="constant", weight_decay=0.5, grad_clip=0.0)
    tx, _ = state_lib.make_optimizer(c, 10)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, tx.init(params), params)
    np.testing.assert_allclose(updates["a"]["kernel"], -0.05)
    np.testing.assert_allclose(updates["a"]["bias"], 0.0)


CONFIGS = (
    [
        ("finetune", f"{m},{d}")
        for m in ("b16", "r50_b16", "l16")
        for d in ("cifar10", "imagenet2012")
    ]
    + [("pretrain", f"{m},{d}") for m in ("b16", "h14") for d in ("imagenet21k", "imagenet2012")]
    + [("fashion_mnist", a) for a in ("pretrain", "finetune", "scratch", "full", "tiny")]
    + [("augreg", a) for a in ("b16,imagenet2012,medium2", "s16,imagenet21k,none", "tiny")]
)


@pytest.mark.parametrize("preset,arg", CONFIGS)
def test_every_config_parses_and_builds_its_model(preset, arg):
    config = configs.get(f"{preset}:{arg}")
    model = state_lib.build_model(config.model, 10)
    shapes = param_shapes(model, config.image_size)
    assert shapes["head"]["kernel"].shape[-1] == 10
    if preset == "pretrain":
        assert config.optimizer.name == "adam" and "pre_logits" in shapes
        assert config.batch_size == 4096 and config.optimizer.warmup_steps == 10_000
    if preset == "finetune":
        assert config.optimizer.name == "sgd" and config.optimizer.momentum == 0.9
        assert config.image_size == (512 if arg.startswith("l16") else 384)
        assert config.total_steps == (10_000 if "cifar" in arg else 20_000)


def test_the_repositorys_configs_are_the_shipped_presets():
    """configs/NAME.py (by path, as --config=configs/NAME.py:ARG loads it) gives the
    installed preset's config for every argument, field by field; one file per preset."""
    import importlib.util

    directory = os.path.join(ROOT, "configs")
    files = sorted(n[:-3] for n in os.listdir(directory) if n.endswith(".py"))
    assert files == sorted(configs.PRESETS)
    for preset, arg in CONFIGS:
        path = os.path.join(directory, f"{preset}.py")
        spec = importlib.util.spec_from_file_location(f"user_config_{preset}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        got, want = module.get_config(arg).to_dict(), configs.get(f"{preset}:{arg}").to_dict()
        assert got == want, (preset, arg)
    assert configs.resolve(f"{directory}/finetune.py:b16,cifar10") == (
        f"{directory}/finetune.py:b16,cifar10"  # a path is used as it is, not the preset
    )


@needs_embedded_data
def test_main_flag_and_config_errors_are_one_line(tmp_path, capsys):
    from vit_jax import main

    work = f"--workdir={tmp_path}"
    assert run_command(main, "--config=fashion_mnist:tiny", work, "--config.optimizer.lrr=1") == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        "error: --config.optimizer.lrr: no such config field; did you mean "
        "--config.optimizer.lr? (every config field is in vit_jax/configs/common.py)"
    )
    assert "Traceback" not in err
    assert run_command(main, "--config=fashion_mnist:tiny", work, "--config.optimizr.lr=1") == 1
    assert capsys.readouterr().err.startswith(  # a misspelt section, not the leaf
        "error: --config.optimizr.lr: no such config field; did you mean --config.optimizer.lr?"
    )
    assert run_command(main, "--config=fashion_mnist:tiny", work, "--config.nosuch=1") == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        "error: --config.nosuch: no such config field (every config field is in "
        "vit_jax/configs/common.py)"
    )
    assert run_command(main, "--config=fashion_mnist:tiny", work, "--config.total_steps=x") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: flag --config.total_steps=x: invalid literal for int()")
    assert "python -m vit_jax.main --help lists the flags" in err
    assert run_command(main, "--config=fashion_mnistt:tiny", work) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --config=fashion_mnistt:tiny: 'fashion_mnistt' is neither")
    assert "presets: finetune, pretrain, augreg, fashion_mnist" in err
    assert run_command(main, "--config=fashion_mnist:huge", work) == 1
    err = capsys.readouterr().err  # the preset's own message, not its traceback
    assert err.startswith("error: --config=fashion_mnist:huge: expected one of pretrain, finetune")
    assert "Traceback" not in err and "FATAL" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    data = f"--config.dataset.data_dir={empty}"
    assert run_command(main, "--config=fashion_mnist:tiny", work, data) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(empty) in err and "Traceback" not in err
    path = main.preset_argv(["x", "--config", "finetune:b16,cifar10"])[2]
    assert path.endswith("vit_jax/configs/finetune.py:b16,cifar10") and os.path.isabs(path)


@needs_embedded_data
def test_a_users_config_file_runs_with_string_overrides(tmp_path, capsys, monkeypatch):
    """A config file by path, from another directory, with its argument; a tuple and a
    split with TFDS slicing given as strings on the command line, as a shell passes
    --config.dataset.classes='(0,1,2)' --config.dataset.train_split='train[:10%]'."""
    from vit_jax import main

    mine = tmp_path / "elsewhere" / "mine.py"
    mine.parent.mkdir()
    mine.write_text(
        "from vit_jax.configs import fashion_mnist\n"
        "def get_config(arg):\n"
        "    c = fashion_mnist.get_config('tiny')\n"
        "    c.total_steps = int(arg)\n"
        "    return c\n"
    )
    assert main.preset_argv(["x", f"--config={mine}:3"]) == ["x", f"--config={mine}:3"]
    ran, real = [], train.run

    def run(config, workdir):  # what main passes on: the config as parsed
        ran.append(config)
        return real(config, workdir)

    monkeypatch.setattr(train, "run", run)
    workdir = str(tmp_path / "run")
    args = ["--config.dataset.classes=(0,1,2)", "--config.dataset.train_split=train[:10%]"]
    assert run_command(main, f"--config={mine}:3", f"--workdir={workdir}", *args) == 0
    (config,) = ran
    assert config.dataset.classes == (0, 1, 2) and config.dataset.train_split == "train[:10%]"
    assert config.total_steps == 3 and config.model.width == 32  # the file's, with its arg
    out = capsys.readouterr().out.splitlines()
    assert "step 3/3" in "\n".join(out)
    assert (
        out[-1]
        == f"step 3: wrote {workdir}/final.npz (the published layout) and {workdir}/summary.json"
    )
    assert json.load(open(f"{workdir}/summary.json"))["steps"] == 3
    assert weights.load_npz(f"{workdir}/final.npz")["head"]["bias"].shape == (3,)  # 3 classes


@pytest.mark.slow
@needs_embedded_data
def test_recipe_runs_its_three_parts_and_reports(tmp_path, capsys, monkeypatch):
    from vit_jax import fewshot as fewshot_command
    from vit_jax import figures, infer, recipe
    from vit_jax.training import miniature

    # The command itself, each part shortened to 6 steps.
    part_config = miniature.part_config

    def short(part, workdir, examples_per_class=50):
        config = part_config(part, workdir, examples_per_class)
        config.update(total_steps=6, log_every=3)
        config.optimizer.warmup_steps = 2  # within the 6 steps (training/check.py)
        return config

    monkeypatch.setattr(miniature, "part_config", short)
    command = [f"--workdir={tmp_path}", "--examples_per_class=5"]
    assert run_command(recipe, *command) == 0
    out = capsys.readouterr().out
    summary = json.load(open(tmp_path / "recipe.json"))
    assert out.endswith(miniature.report(summary) + "\n") and summary["examples_per_class"] == 5
    for part, key in (("pretrain", "pretrain_accuracy_classes_0_4"),
                      ("finetune", "finetuned_accuracy_classes_5_9"),
                      ("scratch", "scratch_accuracy_classes_5_9")):  # fmt: skip
        assert summary[key] == json.load(open(tmp_path / part / "summary.json"))["accuracy"]
    assert sorted(k for k in summary if k.startswith("fewshot/")) == [
        f"fewshot/fashion_mnist_{k}shot" for k in (10, 1, 25, 5)
    ]
    assert "linear 1/5/10/25-shot on all ten classes: " in out
    assert "fine-tuned from the pretrained ViT: " in out and "trained from scratch: " in out
    assert "step 6/6" in out and out.count("=== ") == 3
    # The same command again: each part is finished, nothing is written or rewritten.

    before = snapshot(str(tmp_path))
    assert run_command(recipe, *command) == 0
    out = capsys.readouterr().out
    assert out.endswith(miniature.report(summary) + "\n") and snapshot(str(tmp_path)) == before
    for part in miniature.PARTS:
        assert f"{tmp_path}/{part}: finished at step 6 (summary.json); nothing to do" in out
    assert "training " not in out and "step 6/6" not in out
    # The fine-tuned model started from the pretrained export: its position embeddings
    # grew from the 7x7 grid at 28 px to 10x10 at 40 px; pre_logits dropped, 5 classes.
    pre = weights.load_npz(tmp_path / "pretrain" / "final.npz")
    ft = weights.load_npz(tmp_path / "finetune" / "final.npz")
    assert pre["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 1 + 7 * 7, 64)
    assert ft["Transformer"]["posembed_input"]["pos_embedding"].shape == (1, 1 + 10 * 10, 64)
    assert "pre_logits" in pre and "pre_logits" not in ft and ft["head"]["bias"].shape == (5,)
    # The commands read the main job's own files without --model.
    image = tmp_path / "shirt.png"
    Image.fromarray(np.full((28, 28), 200, np.uint8)).save(image)
    for part, classes in (("pretrain", 5), ("finetune", 5)):
        path = tmp_path / part / "final.npz"
        assert run_command(infer, f"--checkpoint={path}", f"--image={image}", "--top_k=9") == 0
        assert len(capsys.readouterr().out.strip().splitlines()) == 1 + classes
    # The few-shot command on the pretrained file, with its defaults, prints recipe.json's.
    assert run_command(fewshot_command, f"--checkpoint={tmp_path}/pretrain/final.npz") == 0
    out = capsys.readouterr().out
    assert "at 28x28" in out
    rows = {r.split()[0]: r.split()[1:] for r in out.splitlines() if r.startswith("fashion")}
    want = [f"{100 * summary[f'fewshot/fashion_mnist_{k}shot']:.2f}%" for k in (1, 5, 10, 25)]
    assert rows["fashion_mnist"] == want, out  # and the k-NN row, on the same shots:
    assert list(rows) == ["fashion_mnist", "fashion_mnist_knn"] and len(rows[list(rows)[1]]) == 4
    path = f"--checkpoint={tmp_path}/finetune/final.npz"
    assert run_command(figures, path, f"--image={image}", f"--out={tmp_path}/fig") == 0
    assert json.load(open(tmp_path / "fig" / "inspect.json"))["grid"] == [10, 10]


@needs_embedded_data
def test_augreg_tiny_trains_with_randaugment_and_mixup(tmp_path):
    """The AugReg preset's miniature (RandAugment (2, 15), mixup 0.5 on fashion_mnist:tiny)
    runs end to end as a user runs it."""
    dataset = configs.get("augreg:tiny").dataset
    assert tuple(dataset.randaugment) == (2, 15) and dataset.mixup == 0.5
    workdir = str(tmp_path / "augreg")
    proc = python_m("vit_jax.main", "--config=augreg:tiny", f"--workdir={workdir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(open(os.path.join(workdir, "summary.json")).read())
    assert summary["steps"] == 20 and np.isfinite(summary["train_loss"])
    # big_vision's loss and head: the zero head kernel makes every first logit the bias,
    # -2.3, so the first loss is K binary cross-entropies whatever the (mixed) labels:
    # -log sigmoid(-2.3) - 9 log sigmoid(2.3) = 3.2550 (softmax's would be log 10 = 2.3026).
    first = np.log1p(np.exp(2.3)) + 9 * np.log1p(np.exp(-2.3))
    assert f"step 1/20 | loss {first:.4f}" in proc.stdout, proc.stdout[:2000]


def test_read_scalars_stops_at_a_record_cut_short(tmp_path):
    """A full disk can cut the event file's last record: what came before it is read."""
    with report.EventWriter(tmp_path) as writer:
        writer.write_scalars(1, {"a": 1.0})
        writer.write_scalars(2, {"a": 2.0})
    (path,) = tmp_path.glob("events.out.tfevents.*")
    path.write_bytes(path.read_bytes()[:-7])
    assert read_scalars(tmp_path) == {"a": [(1, 1.0)]}


def test_a_failing_event_file_does_not_hide_the_runs_own_error(tmp_path):
    """On a full disk the run's named error ('could not save checkpoint ...') is raised first;
    closing the TensorBoard writer then fails too, and must not replace it, nor wait for the
    rerun sentence (`resume`: a wait for the save in flight and a listing) it would drop."""

    def full(*_):
        raise OSError(28, "No space left on device")

    for own in (ValueError("the run's own"), None):
        asked = []
        resume = lambda a=asked: a.append(1) or "resume here"  # noqa: E731
        with pytest.raises(type(own) if own else OSError, match="^the run's own$" if own else
                           "No space left on device. resume here$"):  # fmt: skip
            with report.EventWriter(tmp_path, resume) as writer:
                events, events.close = writer._file, full
                if own:
                    raise own
        assert asked == ([] if own else [1])
        del events.close  # the real one
        events.close()
