"""FSDP on 8 emulated devices: same training as one device, 1/8 of the state per
device, checkpoints that move between meshes, .npz export from a sharded state."""

import collections

import jax
import numpy as np
import pytest
from helpers import assert_trained_alike, assert_trees_equal, batch, model_and_optimizer, training

from vit_jax import weights
from vit_jax.configs import fashion_mnist
from vit_jax.parallel import sharding
from vit_jax.training import outputs
from vit_jax.training import state as state_lib
from vit_jax.weights.meta import Meta
from vit_jax.workdir.checkpoints import Checkpoints
from vit_jax.workdir.workdir import tree_bytes

STEPS = 3


def config():
    """The tiny config with a model whose bytes are mostly in arrays FSDP splits."""
    c = fashion_mnist.get_config("tiny")
    c.model.update(width=256, mlp_dim=1024, num_heads=4)
    return c


def train_on(mesh):
    state, step, shardings = training(config(), mesh)
    created = per_device_bytes(state)
    losses = []
    for _ in range(STEPS):  # the same batch: the loss must fall
        state, m = step(state, sharding.global_batch(batch(64, seed=0), mesh))
        losses.append(float(m["loss"]))
    return {"losses": losses, "state": state, "shardings": shardings, "created": created}


@pytest.fixture(scope="module")
def runs():
    devices = jax.devices()
    return {
        "one": train_on(sharding.make_mesh(devices=devices[:1])),
        "fsdp8": train_on(sharding.make_mesh(data=1, fsdp=8)),
        "4x2": train_on(sharding.make_mesh(data=4, fsdp=2)),
    }


def per_device_bytes(tree):
    """Bytes of the live arrays on each device."""
    per = collections.Counter()
    for x in jax.tree.leaves(tree):
        for shard in x.addressable_shards:
            per[shard.device] += shard.data.nbytes
    return per


@pytest.mark.parametrize("name", ["fsdp8", "4x2"])
def test_fsdp_trains_like_one_device(runs, name):
    one, other = runs["one"], runs[name]
    np.testing.assert_allclose(other["losses"], one["losses"], rtol=1e-5)
    assert one["losses"][2] < one["losses"][0] - 0.01  # learned (step 1 has lr 0)
    lr = model_and_optimizer(config())[2]
    lr_sum = sum(float(lr(i)) for i in range(STEPS))
    assert_trained_alike(other["state"].params, one["state"].params, lr_sum)
    assert_trees_equal(other["state"].opt_state, one["state"].opt_state, atol=2e-5)


def test_batch_is_split_over_data_and_fsdp():
    mesh = sharding.make_mesh(data=4, fsdp=2)
    images = sharding.global_batch(batch(64, seed=0), mesh)["image"]
    assert images.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    rows = sorted(s.index[0].start for s in images.addressable_shards)
    assert rows == list(range(0, 64, 8))  # eight distinct blocks of 8 examples


def test_each_device_holds_an_eighth_of_the_state(runs):
    full = tree_bytes(runs["one"]["state"])
    assert full > 18e6  # ~1.6M parameters + Adam's two moments, float32
    fsdp = runs["fsdp8"]
    for what in ("created", "after steps"):
        per = fsdp["created"] if what == "created" else per_device_bytes(fsdp["state"])
        assert len(per) == 8
        # Small arrays (biases, norms, position embeddings) stay replicated: ~1% of bytes.
        assert full / 8 <= max(per.values()) < 1.08 * full / 8, (what, max(per.values()), full)
        expected = sharding.bytes_per_device(fsdp["state"], fsdp["shardings"])
        assert set(per.values()) == {expected}
    replicated = per_device_bytes(runs["one"]["state"])
    assert list(replicated.values()) == [full]
    kernel = fsdp["state"].params["Transformer"]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]
    assert kernel["kernel"].addressable_shards[0].data.shape == (256, 1024 // 8)


def save_and_restore(state, mesh, directory):
    c = config()
    model, tx, _ = model_and_optimizer(c)
    with Checkpoints(f"{directory}/checkpoints", 2) as checkpoints:
        checkpoints.save(STEPS, state)
        checkpoints.wait()  # with its integrity record, written from the sharded layout
        return state_lib.restore_or_create(state_lib.Start.of(c), model, tx, mesh, checkpoints)


def test_checkpoint_moves_between_meshes(runs, tmp_path):
    saved = runs["fsdp8"]["state"]
    expected = jax.device_get(saved)
    one = sharding.make_mesh(devices=jax.devices()[:1])
    on_one, _ = save_and_restore(saved, one, str(tmp_path / "a"))  # 8-device FSDP -> 1 device
    fsdp = sharding.make_mesh(data=1, fsdp=8)
    back, shardings = save_and_restore(on_one, fsdp, str(tmp_path / "b"))  # and back
    for restored, n in ((on_one, 1), (back, 8)):
        assert_trees_equal(restored, expected)
        assert len(per_device_bytes(restored)) == n
    assert set(per_device_bytes(back).values()) == {sharding.bytes_per_device(back, shardings)}
    kernel = back.params["Transformer"]["encoderblock_1"]["MlpBlock_3"]["Dense_1"]["kernel"]
    assert kernel.addressable_shards[0].data.shape == (1024 // 8, 256)
    # The published-layout export gathers the sharded parameters.
    path = tmp_path / "final.npz"
    with Checkpoints(tmp_path / "checkpoints") as kept:
        outputs.export_npz(str(path), back.params, Meta(), kept)
    assert_trees_equal(weights.load_npz(path), expected.params)
