"""Layer-wise learning-rate decay (config.optimizer.layer_decay, state.layer_scales): timm's
scales for one depth, and one optimizer step scaled by them, plain, scanned and with LoRA."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import flat, tiny_config

from vit_jax.models import get_model, lora, param_shapes
from vit_jax.parallel import sharding
from vit_jax.training import layer_decay, planner
from vit_jax.training import state as state_lib


def test_scales_are_timms_for_depth_3():
    """timm's param_groups_layer_decay on vit_tiny_patch16_224 with depth 3: each tensor
    of our tree filled with its scale and mapped to timm's names (to_timm, which fuses q, k
    and v of one block) holds exactly that parameter's lr_scale."""
    timm = pytest.importorskip("timm")
    from timm.optim._param_groups import param_groups_layer_decay

    from vit_jax.weights.timm import to_timm

    tower = timm.create_model("vit_tiny_patch16_224", depth=3, pretrained=False)
    groups = param_groups_layer_decay(tower, weight_decay=0.0, layer_decay=0.5)
    name_of = {id(p): n for n, p in tower.named_parameters()}
    want = {name_of[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}
    shapes = param_shapes(get_model("ViT-Ti_16", num_classes=1000, depth=3), 224)
    scales = layer_decay.layer_scales(shapes, 0.5)
    filled = jax.tree.map(lambda s, x: np.full(x.shape, s, np.float32), scales, shapes)
    got = {n: np.unique(np.asarray(t)) for n, t in to_timm(filled).items()}
    assert sorted(got) == sorted(want)
    assert {n: g.tolist() for n, g in got.items()} == {n: [s] for n, s in want.items()}
    # decay^(depth + 1 - id): the embeddings 1/16, block i 1/2^(3 - i), the rest 1
    assert want["cls_token"] == want["pos_embed"] == want["patch_embed.proj.weight"] == 1 / 16
    assert [want[f"blocks.{i}.attn.qkv.weight"] for i in range(3)] == [1 / 8, 1 / 4, 1 / 2]
    assert want["norm.weight"] == 1 / 2  # timm's norm: in the last block's group (not BEiT's)
    assert want["head.weight"] == 1.0


def sgd(layer_decay: float, name: str = "sgd"):
    c = tiny_config().optimizer
    c.update(name=name, lr=0.1, warmup_steps=0, decay="constant", grad_clip=0.0)
    c.update(weight_decay=0.01 if name == "adam" else 0.0, layer_decay=layer_decay)
    return state_lib.make_optimizer(c, 10)[0]


def one_step(tx, params):
    """The updates of one step from the state `tx.init(params)`, gradients params + 1."""
    grads = jax.tree.map(lambda p: p + 1.0, params)
    return tx.update(grads, tx.init(params), params)[0]


def random_tree(model):
    rng = np.random.default_rng(0)
    shapes = param_shapes(model, 16)
    return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)


# decay 0.5, depth 2: the stem 1/8, block 0 1/4, block 1 and encoder_norm 1/2, the head 1
WANT = {"embedding/kernel": 1 / 8, "cls": 1 / 8, "Transformer/posembed_input/pos_embedding": 1 / 8}
WANT |= {"Transformer/encoder_norm/scale": 1 / 2, "head/kernel": 1.0}


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_one_step_is_the_plain_step_times_the_scales(scan, name):
    model = get_model("testing", num_classes=3, patch_size=4, scan=scan)
    params = random_tree(model)
    plain, decayed = one_step(sgd(0.0, name), params), one_step(sgd(0.5, name), params)
    scales = flat(layer_decay.layer_scales(params, 0.5))
    for key, value in WANT.items():
        assert scales[key] == value, key
    query = "MultiHeadDotProductAttention_1/query/kernel"
    if scan:
        assert scales[f"Transformer/encoderblock/{query}"].ravel().tolist() == [1 / 4, 1 / 2]
    else:
        assert [scales[f"Transformer/encoderblock_{i}/{query}"] for i in (0, 1)] == [1 / 4, 1 / 2]
    for key, u in flat(decayed).items():  # Adam's decoupled weight decay is scaled too
        np.testing.assert_allclose(u, flat(plain)[key] * scales[key], rtol=1e-6, err_msg=key)
    assert not np.allclose(flat(decayed)["cls"], flat(plain)["cls"])


@pytest.mark.parametrize("scan", [False, True])
def test_lora_adapters_take_their_blocks_scale(scan):
    adapters = lora.Lora(rank=2, alpha=2.0, modules=("query", "Dense_0"))
    model = get_model("testing", num_classes=3, patch_size=4, scan=scan, lora=adapters)
    trained, _ = lora.split(random_tree(model))  # adapters and head
    plain, decayed = one_step(sgd(0.0), trained), one_step(sgd(0.5), trained)
    scales = flat(layer_decay.layer_scales(trained, 0.5))
    adapter = "MultiHeadDotProductAttention_1/query_lora_a"
    blocks = (
        ["Transformer/encoderblock"] if scan else [f"Transformer/encoderblock_{i}" for i in (0, 1)]
    )
    got = np.concatenate([np.ravel(scales[f"{b}/{adapter}"]) for b in blocks])
    assert got.tolist() == [1 / 4, 1 / 2] and scales["head/kernel"] == 1.0
    assert len(scales) == 2 * len(blocks) * 2 + 2  # 2 modules x (a, b) per block entry, head
    for key, u in flat(decayed).items():
        np.testing.assert_allclose(u, flat(plain)[key] * scales[key], rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("scan", [False, True])
def test_the_planners_step_builds_with_layer_decay(scan):
    """The planner's step (the loop's) lowers with layer decay, and differs from without."""
    c = tiny_config()
    c.image_size = 16
    c.model.update(patch_size=4, scan=scan)
    mesh = sharding.make_mesh()
    texts = []
    for decay in (0.0, 0.75):
        c.optimizer.layer_decay = decay
        step, state, batch = planner.loop_step(c, mesh, 10)
        texts.append(step.lower(state, batch).as_text())
    assert texts[0] != texts[1]
