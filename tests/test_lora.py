"""LoRA (config.lora, models/lora.py): what trains and what is counted, the base model
exactly at step 0 and untouched after training, merged equal to unmerged, a merged
final.npz that timm and transformers read, exact resume, and a changed base refused."""

import json
import os

import jax
import numpy as np
import pytest
from flax import traverse_util
from helpers import (
    ctrl_c_after_save,
    flat,
    images,
    initial_params,
    needs_embedded_data,
    random_params,
    run_command,
    tiny_config,
)
from PIL import Image

from vit_jax import convert, infer, weights
from vit_jax.models import count_params, get_model, lora, param_shapes
from vit_jax.training import check, outputs, train
from vit_jax.training import state as state_lib
from vit_jax.training import step as step_lib

QV = lora.Lora(8, 8.0, ("query", "value"))
ALL = lora.Lora(4, 16.0, ("query", "key", "value", "out", "Dense_0", "Dense_1"))


def with_adapters(model, base, seed=0, b_scale=0.0):
    """`base` (a plain model's parameters) with `model`'s adapters: A random, B zero (or
    random times `b_scale`, standing in for trained ones)."""
    x = np.zeros((1, 32, 32, model.channels), np.float32)
    init = jax.jit(model.init)(jax.random.key(seed), x)["params"]
    adapters = {p: v for p, v in flat(init).items() if lora.MARK in p}
    rng = np.random.default_rng(seed)
    out = {p: v for p, v in flat(base).items()}
    for p, v in adapters.items():
        b = p.endswith("_b")
        out[p] = (b_scale * rng.standard_normal(v.shape)).astype(np.float32) if b else v
    return traverse_util.unflatten_dict(out, sep="/")


def test_trained_parameters_of_b16_rank_8_on_query_and_value():
    """294,912 adapter weights (12 blocks x 2 projections x 2 x 768 x 8) plus the head;
    the frozen part is the whole base model; nothing else trains or has optimizer state."""
    config = tiny_config()  # its optimizer is Adam
    config.lora.rank = 8
    model = get_model("B/16", 10, lora=lora.Lora.of(config.lora))
    tx, _ = state_lib.make_optimizer(config.optimizer, 10)
    state = state_lib.abstract_state(state_lib.Start(0, 224), model, tx)
    assert count_params(state.params) == 294_912 + 768 * 10 + 10
    base = count_params(param_shapes(get_model("B/16", 10)))
    assert count_params(state.frozen) == base - 768 * 10 - 10 == 85_798_656
    mu = state.opt_state[1].mu  # scale_by_adam's: the trained tree only
    assert jax.tree.structure(mu) == jax.tree.structure(state.params)
    assert model.lora.scale == 1.0


@pytest.mark.parametrize("scan", [False, True])
def test_step_zero_is_the_base_and_merged_equals_unmerged(scan):
    """With B zero the adapted model computes the base's logits: bit for bit op by op,
    within float32 rounding compiled (XLA merges the two products of one input, which
    changes their summation order); with B trained (random), folding the adapters into
    the kernels (the published layout, plain and stacked blocks) gives the unmerged
    logits within 1e-5, for every target."""
    base = get_model("testing", 7, patch_size=8, scan=scan)
    params = random_params(base, 32, seed=1)
    x = images(32, n=4)
    want = np.asarray(base.apply({"params": params}, x))
    assert np.abs(want).max() > 0.5
    for adapters in (QV, ALL):
        model = base.clone(lora=adapters)
        start = with_adapters(model, params)
        if adapters is QV:  # op by op (slow): exact
            np.testing.assert_array_equal(model.apply({"params": start}, x), want)
        apply = jax.jit(model.apply)
        compiled = jax.jit(base.apply)({"params": params}, x)
        np.testing.assert_allclose(apply({"params": start}, x), compiled, rtol=0, atol=2e-6)
        trained = with_adapters(model, params, b_scale=0.05)
        unmerged = np.asarray(apply({"params": trained}, x))
        merged = lora.merge(trained, adapters)
        assert jax.tree.structure(merged) == jax.tree.structure(params)
        got = np.asarray(jax.jit(base.apply)({"params": merged}, x))
        assert np.abs(unmerged - want).max() > 1e-2  # the adapters change the logits
        np.testing.assert_allclose(got, unmerged, rtol=1e-5, atol=1e-5)


def test_a_rank_without_init_from_and_unknown_targets_are_refused():
    config = tiny_config()
    config.lora.rank = 8
    (problem,) = check.problems(config)
    assert problem.field == "lora.rank" and "set init_from" in problem.allowed
    config.update(init_from="x.npz")
    config.lora.targets = "query,mlp,qkv"
    (problem,) = check.problems(config)
    assert problem.field == "lora.targets" and "query, key, value, out, mlp" in problem.allowed


def lora_config(init_from, **overrides):
    c = tiny_config(total_steps=10, checkpoint_every=5, eval_every=10, log_every=5,
                    init_from=init_from, **overrides)  # fmt: skip
    c.optimizer.lr = 3e-2
    c.lora.update(rank=4, targets="query,value,mlp")
    return c


@needs_embedded_data
def test_a_lora_run_trains_adapters_resumes_exactly_and_exports_merged(
    tmp_path, monkeypatch, capsys
):
    """A LoRA run from a saved model: the start line and summary count the trained
    parameters; checkpoints hold adapters, head and optimizer state, not the base; the
    base is untouched (every untargeted array of final.npz is init_from's bit for bit);
    a run stopped by Ctrl-C after its step-5 save and run again ends bit-identical; and
    its workdir, as a checkpoint (`outputs.load_run`, `infer --checkpoint=WORKDIR`), gives
    final.npz's probabilities within 1e-5 with the adapters unmerged; and a rerun whose
    init_from changed is refused naming the file."""
    c = tiny_config()
    init = tmp_path / "init.npz"
    plain = state_lib.build_model(c.model, 10)
    weights.save_npz(init, initial_params(state_lib.Start.of(c), plain, 28))
    whole = train.run(lora_config(str(init)), str(tmp_path / "whole"))
    # 2 blocks x (query, value: 2 x 32 x 4 each; Dense_0, Dense_1: 32x4 + 4x64, 64x4 + 4x32)
    adapters = 2 * (2 * 2 * 32 * 4 + 2 * (32 * 4 + 4 * 64))
    assert whole["trained_parameters"] == adapters + 32 * 10 + 10
    assert whole["num_params"] == count_params(weights.load_npz(init))
    record = json.loads((tmp_path / "whole/checkpoints/10/integrity.json").read_text())
    saved = {n.split(".")[0] for n in record["arrays"]}
    assert saved == {"step", "params", "opt_state", "rng"}
    assert all(lora.MARK in n or ".head." in n for n in record["arrays"] if "params." in n)
    final, base = flat(weights.load_npz(tmp_path / "whole/final.npz")), flat(weights.load_npz(init))
    assert final.keys() == base.keys()
    targeted = ("query/kernel", "value/kernel", "Dense_0/kernel", "Dense_1/kernel")
    for name, value in base.items():
        if name.endswith(targeted):
            assert np.abs(final[name] - value).max() > 1e-4, name
        elif not name.startswith("head/"):
            np.testing.assert_array_equal(final[name], value, err_msg=name)

    # The workdir as a checkpoint: the adapters unmerged over init_from, as final.npz.

    run, merged = (
        outputs.load_run(str(tmp_path / "whole")),
        weights.load(tmp_path / "whole/final.npz"),
    )
    assert run.model.lora == lora.Lora(4, 4.0, ("query", "value", "Dense_0", "gate", "Dense_1"))
    assert merged.model.lora is None and run.image_size == merged.image_size == (28, 28)
    x = images(28, n=4)
    probs = [jax.nn.softmax(jax.jit(m.model.apply)({"params": m.params}, x)) for m in (run, merged)]
    np.testing.assert_allclose(probs[0], probs[1], rtol=1e-5, atol=1e-7)
    png = tmp_path / "x.png"
    Image.fromarray(((x[0] + 1) * 127.5).astype(np.uint8)).save(png)
    tops = []
    for checkpoint in (tmp_path / "whole", tmp_path / "whole/final.npz"):
        assert run_command(infer, f"--checkpoint={checkpoint}", f"--image={png}", "--json") == 0
        tops.append(json.loads(capsys.readouterr().out.splitlines()[-1])["top_k"])
    assert [t["index"] for t in tops[0]] == [t["index"] for t in tops[1]]
    out = tmp_path / "converted.npz"  # convert merges the workdir's adapters, as final.npz
    assert (
        run_command(convert, f"--checkpoint={tmp_path / 'whole'}", "--format=npz", f"--out={out}")
        == 0
    )
    for name, value in flat(weights.load_npz(out)).items():
        np.testing.assert_allclose(value, final[name], rtol=1e-6, atol=1e-7, err_msg=name)
    for a, b in zip(tops[0], tops[1], strict=True):
        assert a["probability"] == pytest.approx(b["probability"], rel=1e-5)
    # A checkpoint that verifies but has no record of its model: one line, not a TypeError.
    (tmp_path / "whole/checkpoints/10/integrity.json").unlink()
    with pytest.raises(FileNotFoundError, match="checkpoint 10 verifies, but has no integrity"):
        outputs.load_run(str(tmp_path / "whole"))

    with ctrl_c_after_save(monkeypatch, 5):
        train.run(lora_config(str(init)), str(tmp_path / "run"))
    resumed = train.run(lora_config(str(init)), str(tmp_path / "run"))
    assert resumed["accuracy"] == whole["accuracy"]
    again = flat(weights.load_npz(tmp_path / "run/final.npz"))
    for name, value in final.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)

    (tmp_path / "run/summary.json").unlink()
    changed = tmp_path / "changed.npz"
    weights.save_npz(changed, weights.load_npz(tmp_path / "whole/final.npz"))
    os.replace(changed, init)
    with pytest.raises(ValueError, match=r"holds LoRA adapters of init_from .*init.npz.* is "
                       r"another file now .*put the file it was trained from back"):  # fmt: skip
        train.run(lora_config(str(init)), str(tmp_path / "run"))


def test_a_merged_model_exports_to_timm_and_transformers_with_the_unmerged_logits(tmp_path):
    """The merged parameters, saved as a published .npz and converted, load in real timm
    (its printed recipe, in a subprocess) and in transformers, which compute the logits of
    the unmerged adapted model (FIDELITY_ATOL)."""
    pytest.importorskip("timm", exc_type=ImportError)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from format_helpers import run_in_timm
    from helpers import FIDELITY_ATOL

    from vit_jax.weights import convert
    from vit_jax.weights.meta import Meta

    base = get_model("testing", 5, patch_size=8)
    model = base.clone(lora=ALL)
    trained = with_adapters(model, random_params(base, 32, seed=2), b_scale=0.05)
    x = images(32, n=3)
    want = np.asarray(jax.jit(model.apply)({"params": trained}, x))  # unmerged
    weights.save_npz(tmp_path / "merged.npz", lora.merge(trained, ALL), Meta.of_model(base))
    made = convert.convert(tmp_path / "merged.npz", "timm", tmp_path / "merged.safetensors")
    np.save(tmp_path / "x.npy", x)
    (theirs,) = run_in_timm([dict(recipe=made.how_to_load, images=str(tmp_path / "x.npy"))],
                            tmp_path)  # fmt: skip
    np.testing.assert_allclose(theirs, want, atol=FIDELITY_ATOL, rtol=0)
    convert.convert(tmp_path / "merged.npz", "hf", tmp_path / "hf")
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        theirs = hf(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2)).logits.numpy()
    np.testing.assert_allclose(theirs, want, atol=FIDELITY_ATOL, rtol=0)
    assert np.abs(want).max() > 0.5


def test_the_planner_plans_a_lora_run_without_reading_init_from(tmp_path):
    """Planned on this host with an init_from that does not exist: the parameters are
    the whole model's either way, the optimizer state (Adam: two moments) only the
    trained parameters'."""
    from vit_jax.training import planner

    plans = {}
    for rank in (0, 8):
        c = tiny_config(init_from=str(tmp_path / "absent.npz"))
        c.lora.rank = rank
        plans[rank] = planner.plan_on(c, jax.devices()[:1], "cpu", num_classes=10)
    full, low = plans[0], plans[8]
    assert low.param_bytes == full.param_bytes + 4 * 2 * 2 * 2 * 32 * 8
    adapters = 2 * 2 * 2 * 32 * 8
    counters = full.optimizer_bytes - 2 * full.param_bytes  # the step counts: int32s
    assert 0 < counters <= 16
    assert low.optimizer_bytes == 4 * 2 * (adapters + 32 * 10 + 10) + counters


@pytest.mark.slow  # two compiles of a wider model: about a minute
def test_lora_trains_alike_on_one_device_and_on_fsdp_with_accumulation(tmp_path):
    """Three LoRA steps of a model wide enough for FSDP to split its kernels (width 128):
    on one device, and on a (data 4, fsdp 2) mesh with 2 micro-batches a step, the same
    losses and trained parameters (Adam's rare rounding-level elements aside); the frozen
    base is split over 'fsdp' there and ends as init_from's, bit for bit, in both."""
    from helpers import assert_trained_alike, batch

    from vit_jax.parallel import sharding

    c = tiny_config()
    c.model.update(width=128, mlp_dim=256, num_heads=2)
    plain = state_lib.build_model(c.model, 10)
    weights.save_npz(tmp_path / "init.npz", initial_params(state_lib.Start.of(c), plain, 28))
    c.init_from = str(tmp_path / "init.npz")
    c.lora.rank = 4
    model = state_lib.build_model(c.model, 10, c.init_from, c.lora)
    tx, lr = state_lib.make_optimizer(c.optimizer, c.total_steps)
    batches = [batch(64, seed=i) for i in range(3)]
    runs = []
    for mesh, accum in ((sharding.make_mesh(devices=jax.devices()[:1]), 1),
                        (sharding.make_mesh(data=4, fsdp=2), 2)):  # fmt: skip
        state, shardings = state_lib.create_state(state_lib.Start.of(c), model, tx, mesh)
        step, _ = step_lib.jit_steps(model, tx, lr, mesh, shardings, accum)
        losses = []
        for b in batches:
            state, m = step(state, sharding.global_batch(b, mesh))
            losses.append(float(m["loss"]))
        runs.append((losses, jax.device_get(state.params), state.frozen))
    (one, one_params, _), (split, split_params, frozen) = runs
    np.testing.assert_allclose(one, split, rtol=1e-5)
    assert one[2] != one[0]
    assert_trained_alike(one_params, split_params, sum(float(lr(i)) for i in range(3)))
    kernel = frozen["Transformer"]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]["kernel"]
    assert "fsdp" in str(kernel.sharding.spec)
    base = flat(weights.load_npz(tmp_path / "init.npz"))
    for name, value in flat(jax.device_get(frozen)).items():
        np.testing.assert_array_equal(value, base[name], err_msg=name)
