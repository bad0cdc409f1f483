"""Logits and attention maps pinned across the reshaping of the model's input path (issue 60:
one token structure for images and NaFlex patches, one mask contract): a few models of each
kind, each position embedding and pooling, images and NaFlex batches of mixed grids with
padding, with `scan` and without, recorded by the code before that change (at ce6dabf).

Held to the record by helpers.assert_recorded: bit for bit on a machine of the recorded JAX
and CPU, within FIDELITY_ATOL of every recorded set elsewhere."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_recorded

from vit_jax.models import apply_with_intermediates, get_model, naflex

RECORDED = Path(__file__).parent / "recorded_pinned.npz"
SIZES = dict(width=32, depth=2, num_heads=4, mlp_dim=64, patch_size=4)
CASES = {  # name: model fields (16 x 16 px images: a 4 x 4 table)
    "token_learned": dict(),
    "token_learned_scan": dict(scan=True),
    "gap_learned_2d": dict(classifier="gap", posemb="learned_2d"),
    "map_learned": dict(classifier="map"),  # big_vision's towers: MAP head, no class token
    "map_sincos_scan": dict(classifier="map", posemb="sincos_2d", scan=True),
    "token_sincos_prelogits": dict(posemb="sincos_2d", representation_size=24),
    "gap_none": dict(classifier="gap", posemb="none"),
}


def noisy_params(model, seed: int = 0) -> dict:
    """Parameters of `model` made on 16 x 16 px images, perturbed so that no part is inert."""
    params = model.init(jax.random.key(seed), jnp.zeros((1, 16, 16, 3)))["params"]
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(
        tree, [a + 0.2 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys, strict=True)]
    )


def pixels(b: int, h: int, w: int, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).uniform(-1, 1, (b, h, w, 3)).astype(np.float32)


def batch() -> dict:
    """One NaFlex batch of 30 patches a row: a tall, a wide, a small and the table's grid."""
    rows = [
        naflex.patchify(pixels(1, h, w, seed=i), 4, 30)
        for i, (h, w) in enumerate([(24, 8), (8, 28), (8, 8), (16, 16)])
    ]
    return {k: np.concatenate([r[k] for r in rows]) for k in naflex.KEYS}


def pinned() -> dict[str, np.ndarray]:
    """{case/what: array}: logits of images and of a NaFlex batch, and the attention maps."""
    out = {}
    for name, fields in CASES.items():
        model = get_model(None, 5, **{**SIZES, **fields})
        params = noisy_params(model)
        out[f"{name}/images"] = np.asarray(model.apply({"params": params}, pixels(2, 16, 16, 9)))
        logits, inter = apply_with_intermediates(model, params, batch())
        out[f"{name}/naflex"] = np.asarray(logits)
        out[f"{name}/attention"] = np.asarray(inter["attention"][:, :, 0])  # [L, B, N, N]
    return out


def test_logits_and_maps_are_those_recorded():
    got = pinned()
    assert_recorded(got, RECORDED)
    assert min(np.abs(v).max() for k, v in got.items() if "attention" not in k) > 0.1
