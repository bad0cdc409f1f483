"""Fine-tuning a tower (issue 61's measure): a DINOv2-style tower file (registers, LayerScale,
no position embedding for its class token, exact GELU) fine-tuned with layer decay and an
empty model name (init_from's whole architecture): a fresh zero head, the tower's fields
kept, stopped by Ctrl-C after its step-5 save and resumed bit-identical to a straight
run, and its workdir reloaded as a model (`outputs.load_run`) without the tower's file."""

import json
import os

import ml_collections
import numpy as np
from helpers import (
    ctrl_c_after_save,
    flat,
    images,
    logits,
    needs_embedded_data,
    random_params,
    tiny_config,
)

from vit_jax import weights
from vit_jax.models import get_model
from vit_jax.training import outputs, train
from vit_jax.training import state as state_lib
from vit_jax.weights.meta import Meta
from vit_jax.workdir.workdir import Plan

TOWER = dict(registers=2, layer_scale=1e-5, embed_prefix=False, gelu="exact", layer_norm_eps=1e-6)


def tower_config(init_from: str):
    c = tiny_config(total_steps=10, checkpoint_every=5, eval_every=10, log_every=5,
                    init_from=init_from)  # fmt: skip
    c.model.update(name="", width=None, depth=None, num_heads=None, mlp_dim=None, patch_size=None)
    c.optimizer.layer_decay = 0.75
    return c


def test_the_record_rebuilds_an_empty_names_model_without_the_file(tmp_path):
    """An empty name's run records init_from's architecture (`Plan.state['architecture']`),
    which rebuilds the run's model after JSON (lists for tuples) with no file; a named run
    records none, nor layer_decay 0, so that older workdirs' records still match."""
    eva = get_model("testing", 10, patch_size=7, rope="eva", rope_grid=(3, 5), **TOWER)
    init = tmp_path / "eva.npz"
    weights.save_npz(init, random_params(eva, 28), Meta.of_model(eva))
    config = tower_config(str(init))
    recorded = json.loads(json.dumps(Plan.of(config).state))
    assert recorded["architecture"]["rope_grid"] == [3, 5]
    rebuilt = state_lib.build_model(
        ml_collections.ConfigDict(recorded["model"]), 10, recorded["architecture"]
    )
    assert rebuilt == state_lib.build_model(config.model, 10, str(init))
    assert rebuilt.rope_grid == (3, 5) and rebuilt.registers == 2 and rebuilt.width == 32
    named = Plan.of(tiny_config()).state
    assert "architecture" not in named and "layer_decay" not in named["optimizer"]


@needs_embedded_data
def test_a_dinov2_style_tower_fine_tunes_with_layer_decay_and_resumes_exactly(
    tmp_path, monkeypatch, capsys
):
    tower = get_model("testing", 10, patch_size=7, **TOWER)
    init = tmp_path / "tower.npz"
    params = random_params(tower, 28, seed=3)  # LayerScale ~ N(0, 0.3): far from its 1e-5
    assert np.abs(params["Transformer"]["encoderblock_0"]["layer_scale_1"]).min() > 1e-3
    weights.save_npz(init, params, Meta.of_model(tower))
    config = tower_config(str(init))

    # The model of an empty name is the tower's, with a zero head at step 0.
    model = state_lib.build_model(config.model, 10, str(init), image_size=28)
    got = {k: getattr(model, k) for k in (*TOWER, "width", "depth", "num_heads", "patch_size")}
    assert got == {**TOWER, "width": 32, "depth": 2, "num_heads": 2, "patch_size": 7}
    start = flat(state_lib.init_params(state_lib.Start.of(config), model))
    assert not start["head/kernel"].any() and not start["head/bias"].any()
    for name, value in flat(params).items():
        if not name.startswith("head/"):
            np.testing.assert_array_equal(start[name], value, err_msg=name)

    whole = train.run(tower_config(str(init)), str(tmp_path / "whole"))
    out = capsys.readouterr().out
    assert "a new zero-initialised head for 10 classes" in out
    assert (f"training the architecture of {init}: width 32, depth 2, 2 heads, patch 7, "
            "registers 2, LayerScale (") in out  # fmt: skip
    record = json.loads((tmp_path / "whole/checkpoints/10/integrity.json").read_text())
    told = record["state"]["architecture"]
    assert (told["registers"], told["layer_scale"], told["embed_prefix"]) == (2, 1e-5, False)
    assert record["state"]["optimizer"]["layer_decay"] == 0.75
    final = flat(weights.load_npz(tmp_path / "whole/final.npz"))
    for name in ("Transformer/encoderblock_1/layer_scale_2", "reg", "embedding/kernel"):
        assert np.abs(final[name] - flat(params)[name]).max() > 0, name  # all of it trains

    with ctrl_c_after_save(monkeypatch, 5):
        train.run(tower_config(str(init)), str(tmp_path / "run"))
    resumed = train.run(tower_config(str(init)), str(tmp_path / "run"))
    assert "resuming from step 6" in capsys.readouterr().out  # the step in flight, saved
    assert resumed["accuracy"] == whole["accuracy"]
    again = flat(weights.load_npz(tmp_path / "run/final.npz"))
    assert again.keys() == final.keys()
    for name, value in final.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)

    # The workdir as a checkpoint, the tower's file gone: its record rebuilds the model.
    os.remove(init)
    run, exported = (
        outputs.load_run(str(tmp_path / "run")),
        weights.load(tmp_path / "run/final.npz"),
    )
    for loaded in (run, exported):
        assert {k: getattr(loaded.model, k) for k in TOWER} == TOWER
        assert loaded.image_size == (28, 28)
    x = images(28, n=4)
    want = logits(exported.model, exported.params, x)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(logits(run.model, run.params, x), want, rtol=0, atol=1e-6)
