"""NaFlex examples (vit_jax/data/naflex.py): the size search gives big_vision's sizes and
is the largest grid that fits; the resize is tf.image.resize(..., antialias=True) (and
jax.image.resize's antialiased bilinear, which computes the same); `put` lays an image out
as models/naflex.py's patchify does; the length schedule is a pure function of its fields
whose offsets are the running sum of its batches."""

import math
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.data import naflex
from vit_jax.models.naflex import patchify

# big_vision's ops_naflex_test.py, test_pp_resize_to_sequence: (h, w), patch, seq_len, (H, W)
BIG_VISION_CASES = {
    "square_121_exact": ((48, 48), 3, 121, (33, 33)),
    "square_225_inexact": ((112, 109), 7, 225, (105, 105)),
    "square_64_exact": ((176, 176), 11, 64, (88, 88)),
    "rect_12_exact": ((256, 64), 16, 12, (96, 32)),
    "rect_15_exact_ps8": ((256, 64), 8, 15, (56, 16)),
    "rect_16_inexact": ((63, 241), 16, 16, (32, 128)),
    "rect_less_than_patch": ((16, 512), 16, 16, (16, 256)),
}

# (h, w, c) -> (H, W): up, down, both at once, 1-pixel sides, non-square
RESIZES = [
    ((480, 640, 3), (208, 272)),  # a photo to its 13 x 17 grid at patch 16
    ((37, 53, 3), (80, 20)),  # one side up, the other down
    ((28, 84, 1), (32, 96)),  # Fashion-MNIST-like, gray, up
    ((5, 7, 1), (64, 3)),
    ((1, 9, 3), (5, 1)),
    ((9, 1, 3), (1, 17)),
    ((1, 1, 3), (4, 4)),
    ((20, 20, 3), (1, 1)),
    ((200, 30, 3), (7, 29)),  # a 28.6x shrink: the kernel spans 59 source rows
]


def noise(shape, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, shape).astype(np.uint8)
    return rng.uniform(0, 255, shape).astype(dtype)


@pytest.mark.parametrize("name", BIG_VISION_CASES)
def test_size_for_sequence_gives_big_visions_sizes(name):
    (h, w), patch, seq_len, want = BIG_VISION_CASES[name]
    assert naflex.size_for_sequence(h, w, patch, seq_len) == want


def test_size_for_sequence_is_the_largest_grid_of_whole_patches_that_fits():
    """On random sizes: sides whole patches (at least one), at most seq_len of them, and
    the next scale at which a side gains a patch gives more than seq_len. Sides from 16 px:
    the search's scale stops at 100 (big_vision's bound), so 1-pixel images with long
    sequences cannot fill them."""
    rng = np.random.default_rng(0)
    for _ in range(1500):
        h, w = (int(v) for v in rng.integers(16, 2000, 2))
        patch, seq_len = int(rng.choice([2, 4, 8, 14, 16, 32])), int(rng.integers(1, 1100))
        H, W = naflex.size_for_sequence(h, w, patch, seq_len)
        case = (h, w, patch, seq_len, H, W)
        assert H % patch == 0 and W % patch == 0 and H >= patch and W >= patch, case
        gh, gw = H // patch, W // patch
        assert gh * gw <= seq_len, case
        # a side gains a patch once the scale passes gh * patch / h (or gw * patch / w)
        scale = min(gh * patch / h, gw * patch / w) * (1 + 1e-9)
        more = max(math.ceil(h * scale / patch), 1) * max(math.ceil(w * scale / patch), 1)
        assert more > seq_len, case


def test_size_for_sequence_keeps_the_aspect_ratio_up_to_whole_patches():
    assert naflex.size_for_sequence(375, 500, 16, 196) == (192, 256)  # 12 x 16 = 192
    assert naflex.size_for_sequence(500, 375, 16, 196) == (256, 192)
    assert naflex.size_for_sequence(224, 224, 16, 196) == (224, 224)  # 14 x 14
    assert naflex.size_for_sequence(28, 84, 4, 64) == (16, 48)  # 4 x 12: 5 rows would need 5 x 13
    assert naflex.size_for_sequence(10, 10_000, 16, 64) == (16, 1024)  # 1 x 64


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("shape, size", RESIZES)
def test_resize_is_tensorflows_antialiased_resize(shape, size, dtype):
    tf = pytest.importorskip("tensorflow")
    x = noise(shape, dtype)
    got = naflex.resize(x, size)
    want = tf.image.resize(x, size, antialias=True).numpy()  # measured: max 0.005 of 255
    assert got.dtype == np.float32 and got.shape == want.shape == (*size, shape[-1])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.01)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("shape, size", RESIZES)
def test_resize_is_jaxs_antialiased_bilinear(shape, size, dtype):
    x = noise(shape, dtype, seed=1)
    got = naflex.resize(x, size)
    want = jax.image.resize(jnp.asarray(x, jnp.float32), (*size, shape[-1]), "bilinear", True)
    assert got.dtype == np.float32 and got.shape == (*size, shape[-1])
    np.testing.assert_allclose(got, np.asarray(want), rtol=0, atol=0.01)


def random_resizes(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        h, w, H, W = (int(v) for v in rng.integers(1, 60, 4))
        yield noise((h, w, int(rng.choice([1, 3]))), np.uint8, int(rng.integers(1000))), (H, W)


def test_resize_of_random_sizes_is_jaxs():
    for x, size in random_resizes(10, seed=2):  # each shape compiles: a few only
        want = jax.image.resize(jnp.asarray(x, jnp.float32), (*size, x.shape[-1]), "bilinear")
        np.testing.assert_allclose(naflex.resize(x, size), want, rtol=0, atol=0.01)


def test_resize_of_random_sizes_is_tensorflows():
    tf = pytest.importorskip("tensorflow")
    for x, size in random_resizes(200, seed=3):  # measured: at most 0.0011 of 255
        want = tf.image.resize(x, size, antialias=True).numpy()
        np.testing.assert_allclose(naflex.resize(x, size), want, rtol=0, atol=0.01)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_resize_to_the_same_size_is_the_identity(dtype):
    for shape in ((1, 1, 3), (17, 5, 1), (48, 64, 3)):
        x = noise(shape, dtype)
        got = naflex.resize(x, shape[:2])
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, x.astype(np.float32))
    x = noise((17, 5, 3), np.uint8)  # one side kept: only the other is resized
    np.testing.assert_allclose(
        naflex.resize(x, (17, 9)), jax.image.resize(x.astype(np.float32), (17, 9, 3), "linear"),
        rtol=0, atol=0.01,
    )  # fmt: skip


def expected_row(image: np.ndarray, patch: int, seq_len: int, flip=False) -> dict:
    """patchify of the image resized to its sequence, in [-1, 1], mirrored if asked."""
    size = naflex.size_for_sequence(image.shape[0], image.shape[1], patch, seq_len)
    x = naflex.resize(image, size)
    x = np.repeat(x, 3, -1) if x.shape[-1] == 1 else x
    x = (x[:, ::-1] if flip else x) - np.float32(127.5)
    return {k: v[0] for k, v in patchify(x / np.float32(127.5), patch, seq_len).items()}


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("shape", [(375, 500, 3), (500, 375, 3), (28, 84, 1), (16, 16, 3)])
def test_put_lays_out_the_resized_image_as_patchify_does(shape, flip):
    patch, seq_len = (4, 64) if shape[0] == 28 else (16, 196)
    image = noise(shape, np.uint8, seed=3)
    before = image.copy()
    out = naflex.empty(3, seq_len, patch)
    gh, gw = naflex.put(out, 1, image, patch, flip=flip)
    np.testing.assert_array_equal(image, before)  # the caller's image is left alone
    H, W = naflex.size_for_sequence(shape[0], shape[1], patch, seq_len)
    assert (gh, gw) == (H // patch, W // patch)
    want = expected_row(image, patch, seq_len, flip)
    np.testing.assert_allclose(out["patches"][1], want["patches"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(out["patches"][1, gh * gw :], 0)  # padding stays zero
    n = np.arange(gh * gw)
    np.testing.assert_array_equal(out["coords"][1, : gh * gw], np.stack([n // gw, n % gw], -1))
    np.testing.assert_array_equal(out["coords"][1], want["coords"])
    np.testing.assert_array_equal(out["valid"][1], np.arange(seq_len) < gh * gw)
    for j in (0, 2):  # the other rows are still padding
        assert not out["patches"][j].any() and not out["coords"][j].any()
        assert not out["valid"][j].any()


def test_put_of_a_gray_image_is_its_three_channel_copy():
    gray = noise((28, 84, 1), np.uint8, seed=4)
    one, three = naflex.empty(1, 64, 4), naflex.empty(1, 64, 4)
    naflex.put(one, 0, gray, 4)
    naflex.put(three, 0, np.repeat(gray, 3, -1), 4)
    assert one["patches"].shape == (1, 64, 4 * 4 * 3)
    for k in one:
        np.testing.assert_array_equal(one[k], three[k])
    assert one["valid"].sum() == 48  # a 4 x 12 grid


def test_put_mirrors_before_cutting_patches():
    """A left-right ramp: the flipped row is the unflipped one read right to left."""
    ramp = np.broadcast_to(np.arange(64, dtype=np.uint8)[None, :, None] * 4, (32, 64, 3))
    plain, flipped = naflex.empty(1, 8, 16), naflex.empty(1, 8, 16)
    assert naflex.put(plain, 0, ramp.copy(), 16) == (2, 4)
    naflex.put(flipped, 0, ramp.copy(), 16, flip=True)
    a = plain["patches"][0].reshape(2, 4, 16, 16, 3)
    b = flipped["patches"][0].reshape(2, 4, 16, 16, 3)
    np.testing.assert_array_equal(b, a[:, ::-1, :, ::-1])
    assert a[0, 0, 0, 0, 0] == -1 and b[0, 0, 0, 0, 0] == np.float32(124.5 / 127.5)  # 252


LENGTHS = dict(seq_lens=(64, 144, 256), tokens_per_batch=256 * 32 + 100, multiple=8, seed=7)


def test_lengths_are_drawn_uniformly_from_seq_lens():
    lengths = naflex.Lengths(**LENGTHS)
    drawn = np.array([lengths.length(s) for s in range(4096)])
    values, counts = np.unique(drawn, return_counts=True)
    assert tuple(values) == LENGTHS["seq_lens"]
    assert np.all(np.abs(counts / 4096 - 1 / 3) < 0.03), counts
    assert len({tuple(drawn[i : i + 8]) for i in range(0, 4096, 8)}) > 400  # no short cycle
    other = naflex.Lengths(**{**LENGTHS, "seed": 8})
    assert [other.length(s) for s in range(64)] != list(drawn[:64])
    assert {naflex.Lengths(**{**LENGTHS, "seq_lens": (100,)}).length(s) for s in range(50)} == {100}


def test_lengths_are_the_same_in_a_fresh_object_and_after_pickling():
    lengths = naflex.Lengths(**LENGTHS)
    steps = [0, 1, 1023, 1024, 1025, 3000, 5000]
    want = [lengths.length(s) for s in steps]
    lengths.offset(3000)  # its block sums cached
    for again in (naflex.Lengths(**LENGTHS), pickle.loads(pickle.dumps(lengths))):
        assert again == lengths
        assert [again.length(s) for s in steps] == want
        assert again.offset(3000) == lengths.offset(3000)
    fresh = pickle.loads(pickle.dumps(naflex.Lengths(**LENGTHS)))
    assert [fresh.length(s) for s in steps] == want


def test_batches_are_multiples_that_fit_the_tokens():
    lengths = naflex.Lengths(**LENGTHS)
    tokens, multiple = LENGTHS["tokens_per_batch"], LENGTHS["multiple"]
    assert [lengths.batch(n) for n in (64, 144, 256)] == [128, 56, 32]
    for n in (*LENGTHS["seq_lens"], 1, 7, 100, 1000):
        b = lengths.batch(n)
        assert b % multiple == 0 and b * n <= tokens and (b + multiple) * n > tokens, n
    for s in range(0, 2048, 97):
        assert lengths.batch_at(s) == lengths.batch(lengths.length(s))


def test_offsets_are_the_running_sum_of_batches_across_blocks():
    lengths = naflex.Lengths(**LENGTHS)
    batches = np.array([lengths.batch_at(s) for s in range(3100)])
    running = np.concatenate([[0], np.cumsum(batches)])  # running[s]: examples before s
    for s in (0, 1, 2, 1023, 1024, 1025, 2047, 2048, 3000, 3099):
        assert lengths.offset(s) == running[s], s
    for s in (3000, 2048, 1024, 1500):  # each on an object with no cached block sums
        assert naflex.Lengths(**LENGTHS).offset(s) == running[s], s
    assert lengths.offset(3000) == running[3000]  # with them cached, again
