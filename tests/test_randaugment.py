"""RandAugment (vit_jax/data/randaugment.py) against independent computations: PIL's
ImageOps/ImageEnhance/Image.blend, or NumPy written here; magnitude 0 as big_vision does
it; determinism from the generator; the AugReg presets' values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from vit_jax import configs
from vit_jax.data import config as data_config
from vit_jax.data import randaugment as ra


def known_image(h=24, w=20, seed=0):
    """Smooth gradients plus noise in 30..219 (not the full range, so AutoContrast acts)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 150 / w, y * 150 / h, (x + y) * 75 / (h + w) + 40], -1) + 30
    return np.clip(base + rng.integers(0, 40, (h, w, 3)), 30, 219).astype(np.uint8)


IMAGE = known_image()
PIL_IMAGE = Image.fromarray(IMAGE)


def op(name, m, negate=False, row=0, col=0, image=IMAGE):
    return ra.apply_op(image, name, m, negate, row, col)


def pil(image):
    return np.asarray(image)


def blend_pil(degenerate: np.ndarray, factor: float) -> np.ndarray:
    """PIL's Image.blend (float32, truncated, clipped when extrapolating): TF's blend."""
    degen = Image.fromarray(np.broadcast_to(degenerate, IMAGE.shape).astype(np.uint8))
    return pil(Image.blend(degen, PIL_IMAGE, factor))


def enhance_factor(m):
    return m / 10 * 1.8 + 0.1


# --- Each op --------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [0, 10, 20])
def test_autocontrast_equalize_invert_are_pils_at_any_magnitude(m):
    np.testing.assert_array_equal(op("AutoContrast", m), pil(ImageOps.autocontrast(PIL_IMAGE)))
    np.testing.assert_array_equal(op("Equalize", m), pil(ImageOps.equalize(PIL_IMAGE)))
    np.testing.assert_array_equal(op("Invert", m), pil(ImageOps.invert(PIL_IMAGE)))
    assert not np.array_equal(op("AutoContrast", m), IMAGE)


@pytest.mark.parametrize("m,bits", [(0, 1), (5, 2), (10, 4), (15, 6)])
def test_posterize_keeps_int_4m_bits_and_one_bit_at_zero(m, bits):
    # int(4 M / 10) bits; TF clamps the shift 8 - 0 to 7, so M=0 keeps one bit.
    np.testing.assert_array_equal(op("Posterize", m), pil(ImageOps.posterize(PIL_IMAGE, bits)))


def test_posterize_at_20_keeps_all_bits():
    np.testing.assert_array_equal(op("Posterize", 20), IMAGE)


@pytest.mark.parametrize("m", [22.5, 25, 30])
def test_posterize_above_22_5_keeps_one_bit_as_tensorflow_does(m):
    # int(4 M / 10) > 8 bits: big_vision's uint8 shift 8 - bits wraps to 255, which TF's
    # shift clamps to 7 (measured against big_vision's op): one bit, as at M = 0.
    np.testing.assert_array_equal(op("Posterize", m), pil(ImageOps.posterize(PIL_IMAGE, 1)))


@pytest.mark.parametrize("m", [0, 10, 20])
def test_solarize_threshold_wraps_to_zero_and_inverts_everything(m):
    # int(256 M / 10) = 0, 256, 512: TF's uint8 threshold is 0, so every pixel inverts.
    np.testing.assert_array_equal(op("Solarize", m), pil(ImageOps.invert(PIL_IMAGE)))


def test_solarize_at_15_uses_threshold_128():
    want = pil(ImageOps.solarize(PIL_IMAGE, 128))  # 384 mod 256
    np.testing.assert_array_equal(op("Solarize", 15), want)
    assert 0 < np.count_nonzero(want != IMAGE) < IMAGE.size


@pytest.mark.parametrize("m", [0, 10, 15])
def test_solarize_add(m):
    add = int(m / 10 * 110)
    x = IMAGE.astype(int)
    want = np.where(x < 128, np.minimum(x + add, 255), x)
    np.testing.assert_array_equal(op("SolarizeAdd", m), want)


@pytest.mark.parametrize("m", [0, 5, 10, 20])
def test_brightness_is_pil_enhance(m):
    want = pil(ImageEnhance.Brightness(PIL_IMAGE).enhance(enhance_factor(m)))
    np.testing.assert_array_equal(op("Brightness", m), want)


@pytest.mark.parametrize("m", [0, 10, 20])
def test_contrast_blends_towards_h_w_over_256(m):
    # big_vision's "mean" is sum(histogram) / 256 = h * w / 256, not PIL's mean grey.
    level = IMAGE.shape[0] * IMAGE.shape[1] // 256  # 480 / 256 -> 1
    np.testing.assert_array_equal(op("Contrast", m), blend_pil(level, enhance_factor(m)))
    odd = known_image(30, 17)  # 510 / 256 -> 1 (not 510 / 255 = 2)
    want = np.clip(1 + np.float32(1.9) * (odd.astype(np.float32) - 1), 0, 255)
    np.testing.assert_array_equal(ra.apply_op(odd, "Contrast", 10), want.astype(np.uint8))
    big = known_image(224, 224, seed=1)  # 196 at 224 px
    got = ra.apply_op(big, "Contrast", 10)
    want = np.clip(196 + np.float32(1.9) * (big.astype(np.float32) - 196), 0, 255)
    np.testing.assert_array_equal(got, want.astype(np.uint8))


@pytest.mark.parametrize("m", [0, 10, 20])
def test_color_blends_towards_tf_grayscale(m):
    rgb = IMAGE.astype(np.float64) / 255
    grey = np.floor((rgb @ [0.2989, 0.5870, 0.1140]) * 255.5)
    np.testing.assert_array_equal(op("Color", m), blend_pil(grey[..., None], enhance_factor(m)))
    # PIL's own Color differs only by its grey (ITU-R 601 with rounding): a level or two.
    pil_color = pil(ImageEnhance.Color(PIL_IMAGE).enhance(enhance_factor(m)))
    assert np.abs(op("Color", m).astype(int) - pil_color).max() <= 4


@pytest.mark.parametrize("m", [0, 10, 20])
def test_sharpness_blends_with_truncated_smooth_filter(m):
    h, w, _ = IMAGE.shape
    smooth = IMAGE.copy()
    for y in range(1, h - 1):
        for x in range(1, w - 1):
            total = IMAGE[y - 1 : y + 2, x - 1 : x + 2].astype(int).sum((0, 1))
            total += 4 * IMAGE[y, x].astype(int)  # centre weight 5
            smooth[y, x] = total // 13
    np.testing.assert_array_equal(op("Sharpness", m), blend_pil(smooth, enhance_factor(m)))


def tf_nearest(image, fn):
    """Output (x, y) reads input fn(x, y) rounded half away from zero; 128 outside."""
    h, w, _ = image.shape
    out = np.full_like(image, 128)
    for y in range(h):
        for x in range(w):
            xin, yin = fn(x, y)
            xi = int(math.copysign(math.floor(abs(xin) + 0.5), xin))
            yi = int(math.copysign(math.floor(abs(yin) + 0.5), yin))
            if 0 <= xi < w and 0 <= yi < h:
                out[y, x] = image[yi, xi]
    return out


@pytest.mark.parametrize("negate", [False, True])
def test_shear_x_and_y(negate):
    level = (-0.3 if negate else 0.3) * 1.5  # M = 15
    want_x = tf_nearest(IMAGE, lambda x, y: (x + level * y, y))
    want_y = tf_nearest(IMAGE, lambda x, y: (x, y + level * x))
    np.testing.assert_array_equal(op("ShearX", 15, negate), want_x)
    np.testing.assert_array_equal(op("ShearY", 15, negate), want_y)
    assert np.count_nonzero(want_x == 128) > 100  # pixels moved in from outside: grey


def test_rotate_by_90_degrees_is_rot90():
    square = known_image(16, 16)
    np.testing.assert_array_equal(op("Rotate", 30, image=square), np.rot90(square, 1))
    np.testing.assert_array_equal(op("Rotate", 30, True, image=square), np.rot90(square, -1))


@pytest.mark.parametrize("negate", [False, True])
def test_rotate_30_degrees_about_the_centre(negate):
    a = math.radians(-30 if negate else 30)
    h, w, _ = IMAGE.shape
    cx, cy = (w - 1) / 2, (h - 1) / 2

    def source(x, y):
        return (
            math.cos(a) * (x - cx) - math.sin(a) * (y - cy) + cx,
            math.sin(a) * (x - cx) + math.cos(a) * (y - cy) + cy,
        )

    np.testing.assert_array_equal(op("Rotate", 10, negate), tf_nearest(IMAGE, source))
    # PIL rotates the same way (counter-clockwise for positive angles), its own rounding.
    pil_rot = pil(PIL_IMAGE.rotate(math.degrees(a), Image.NEAREST, fillcolor=(128,) * 3))
    assert np.mean(op("Rotate", 10, negate) == pil_rot) > 0.97


@pytest.mark.parametrize("m,negate", [(1, False), (1, True), (0.5, False), (1.55, True)])
def test_translate_moves_by_100_m_over_10_pixels(m, negate):
    pixels = (-1 if negate else 1) * m / 10 * 100  # 10, -10, 5, -15.5 px
    want_x = tf_nearest(IMAGE, lambda x, y: (x + pixels, y))
    want_y = tf_nearest(IMAGE, lambda x, y: (x, y + pixels))
    np.testing.assert_array_equal(op("TranslateX", m, negate), want_x)
    np.testing.assert_array_equal(op("TranslateY", m, negate), want_y)
    if pixels == 10:  # content moves left: column 0 now holds column 10
        np.testing.assert_array_equal(want_x[:, 0], IMAGE[:, 10])
        assert np.all(want_x[:, -10:] == 128)


def test_translate_at_magnitude_10_empties_a_small_image():
    np.testing.assert_array_equal(op("TranslateX", 10), np.full_like(IMAGE, 128))


@pytest.mark.parametrize("m,row,col", [(1, 10, 8), (1, 1, 18), (2.5, 23, 0)])
def test_cutout_square_of_side_2_int_40m_over_10(m, row, col):
    pad = int(m / 10 * 40)
    want = IMAGE.copy()
    for y in range(IMAGE.shape[0]):
        for x in range(IMAGE.shape[1]):
            if row - pad <= y < row + pad and col - pad <= x < col + pad:
                want[y, x] = 128
    np.testing.assert_array_equal(op("Cutout", m, row=row, col=col), want)


# --- The whole transform ------------------------------------------------------------------


# What each op does at magnitude 0 in big_vision, computed independently.
AT_ZERO = {
    "AutoContrast": lambda: pil(ImageOps.autocontrast(PIL_IMAGE)),
    "Equalize": lambda: pil(ImageOps.equalize(PIL_IMAGE)),
    "Invert": lambda: pil(ImageOps.invert(PIL_IMAGE)),
    "Rotate": lambda: IMAGE,
    "Posterize": lambda: pil(ImageOps.posterize(PIL_IMAGE, 1)),
    "Solarize": lambda: pil(ImageOps.invert(PIL_IMAGE)),
    "Color": lambda: pil(ImageEnhance.Color(PIL_IMAGE).enhance(0.1)),  # checked to +-4 below
    "Contrast": lambda: blend_pil(1, 0.1),
    "Brightness": lambda: pil(ImageEnhance.Brightness(PIL_IMAGE).enhance(0.1)),
    "Sharpness": None,  # blend 0.1 with the smoothed image: checked in its own test
    "ShearX": lambda: IMAGE,
    "ShearY": lambda: IMAGE,
    "TranslateX": lambda: IMAGE,
    "TranslateY": lambda: IMAGE,
    "Cutout": lambda: IMAGE,
    "SolarizeAdd": lambda: IMAGE,
}


@pytest.mark.parametrize("name", ra.OPS)
def test_each_op_at_magnitude_zero_is_what_big_vision_does(name):
    got = op(name, 0, negate=True, row=5, col=5)
    if AT_ZERO[name] is None:
        assert 0 < np.count_nonzero(got != IMAGE)
        return
    want = AT_ZERO[name]()
    tolerance = 4 if name == "Color" else 0
    assert np.abs(got.astype(int) - want.astype(int)).max() <= tolerance


def test_light1_randaug_2_0_is_not_nothing():
    # One layer: 7 of the 16 ops are identities at M=0 (rotate, shear, translate, cutout,
    # solarize_add); the others change the image. Two layers also cancel when both invert.
    ops_drawn, unchanged = [], 0
    for seed in range(400):
        draws = np.random.default_rng(seed).random((2, 4))
        ops_drawn += [ra.OPS[int(u * 16)] for u in draws[:, 0]]
        out = ra.randaugment(IMAGE, np.random.default_rng(seed), 2, 0)
        unchanged += np.array_equal(out, IMAGE)
    assert set(ops_drawn) == set(ra.OPS)  # uniform over the 16 ops, no identity op
    expected = (7 / 16) ** 2 + (2 / 16) ** 2  # 0.207
    assert abs(unchanged / 400 - expected) < 0.06


def test_randaugment_applies_the_drawn_ops_in_order():
    # The draw layout is the module's contract: per layer (op, sign, cutout row, column);
    # big_vision keeps the sign when floor(u + 0.5) is 1.
    image, signed = known_image(32, 32), 0
    for seed in range(48):
        draws = np.random.default_rng(seed).random((2, 4))
        want = image
        for u_op, u_sign, u_row, u_col in draws:
            name = ra.OPS[int(u_op * 16)]
            signed += name in ("Rotate", "ShearX", "ShearY")
            want = ra.apply_op(want, name, 5, u_sign < 0.5, int(u_row * 32), int(u_col * 32))
        got = ra.randaugment(image, np.random.default_rng(seed), 2, 5)
        np.testing.assert_array_equal(got, want)
    assert signed >= 10


def test_same_generator_state_same_image_and_a_fixed_number_of_draws():
    image = known_image(32, 32)
    outs = [ra.randaugment(image, np.random.default_rng(7), 2, 15) for _ in range(2)]
    np.testing.assert_array_equal(outs[0], outs[1])
    rng = np.random.default_rng(7)
    ra.randaugment(image, rng, 3, 20)
    after = np.random.default_rng(7)
    after.random(12)  # 4 per layer, whatever ops were picked
    assert rng.random() == after.random()


def test_different_seeds_give_different_images():
    image = known_image(224, 224)  # at 32 px, translating 100 px greys out the whole image
    outs = {ra.randaugment(image, np.random.default_rng(s), 2, 10).tobytes() for s in range(10)}
    assert len(outs) == 10


def test_output_is_uint8_of_the_input_shape_and_the_input_is_untouched():
    image = known_image(30, 17)
    before = image.copy()
    for seed in range(20):
        out = ra.randaugment(image, np.random.default_rng(seed), 2, 20)
        assert out.dtype == np.uint8 and out.shape == image.shape
    np.testing.assert_array_equal(image, before)


@pytest.mark.parametrize(
    "image,layers,m,match",
    [
        (np.zeros((8, 8, 1), np.uint8), 2, 10, "tile grayscale to RGB"),
        (np.zeros((8, 8, 3), np.float32), 2, 10, "uint8"),
        (np.zeros((8, 8, 3), np.uint8), -1, 10, "num_layers=-1"),
        (np.zeros((8, 8, 3), np.uint8), 2, 31, "magnitude=31"),
    ],
)
def test_bad_inputs_name_the_problem(image, layers, m, match):
    with pytest.raises(ValueError, match=match):
        ra.randaugment(image, np.random.default_rng(0), layers, m)


# --- Config and presets -------------------------------------------------------------------


def test_dataset_config_validates_randaugment():
    cfg = data_config.default_config()
    assert cfg.randaugment is None
    cfg.randaugment = (2, 15)
    data_config.validate(cfg)
    for bad, match in [((2,), r"\(num_layers, magnitude\)"), ((2, 40), "magnitude=40")]:
        cfg.randaugment = bad
        with pytest.raises(ValueError, match=rf"dataset.randaugment=.*{match}"):
            data_config.validate(cfg)


SETTINGS = {  # big_vision configs/vit_i1k.py MIXUP_DEF and RANDAUG_DEF
    "none": (0.0, None),
    "light1": (0.0, (2, 0)),
    "light2": (0.2, (2, 10)),
    "medium1": (0.2, (2, 15)),
    "medium2": (0.5, (2, 15)),
    "strong1": (0.5, (2, 20)),
    "strong2": (0.8, (2, 20)),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_augreg_presets_build_the_papers_run(setting):
    c = configs.get(f"augreg:b16,imagenet2012,{setting}")
    assert (c.dataset.mixup, c.dataset.randaugment) == SETTINGS[setting]
    assert c.model.name == "ViT-B_16" and c.model.representation_size == 768
    assert c.model.dropout == c.model.stochastic_depth == 0.1  # B/16 on i1k: Figure 4
    assert (c.dataset.name, c.image_size, c.batch_size) == ("imagenet2012", 224, 4096)
    # big_vision's 300 epochs of train[:99%] (the last 1% is its minival)
    assert c.dataset.train_split == "train[:99%]"
    assert c.total_steps == 300 * round(0.99 * 1_281_167) // 4096 == 92_897
    # big_vision's loss, head bias and Adam state (vit_i1k.py)
    assert (c.loss, c.model.head_bias_init, c.optimizer.mu_dtype) == (
        "sigmoid_xent", -6.9, "bfloat16"
    )  # fmt: skip
    o = c.optimizer
    assert (o.name, o.lr, o.warmup_steps, o.decay) == ("adam", 1e-3, 10_000, "cosine")
    assert (o.b1, o.b2, o.weight_decay, o.grad_clip) == (0.9, 0.999, 0.1, 1.0)
    data_config.validate(c.dataset)


def test_augreg_regularisation_defaults_and_override():
    assert configs.get("augreg:s16,imagenet2012,medium2").model.stochastic_depth == 0.0
    assert configs.get("augreg:b16,imagenet21k,medium1").model.dropout == 0.0
    c = configs.get("augreg:b16,imagenet2012,medium2,0.0")
    assert c.model.dropout == c.model.stochastic_depth == 0.0
    c = configs.get("augreg:ti16,imagenet21k,light1,0.1")
    assert c.model.dropout == c.model.stochastic_depth == 0.1
    assert c.total_steps == 300 * round(0.99 * 14_197_122) // 4096
    assert (c.loss, c.model.head_bias_init) == ("sigmoid_xent", -10.0)  # vit_i21k.py


def test_augreg_tiny_is_fashion_mnist_tiny_with_the_setting():
    c, base = configs.get("augreg:tiny"), configs.get("fashion_mnist:tiny")
    assert (c.dataset.mixup, c.dataset.randaugment) == (0.5, (2, 15))  # medium2
    assert c.model.dropout == c.model.stochastic_depth == 0.1
    assert (c.total_steps, c.image_size, c.model.width) == (
        base.total_steps, base.image_size, base.model.width
    )  # fmt: skip
    assert configs.get("augreg:tiny,strong2").dataset.randaugment == (2, 20)
    assert (c.loss, c.model.head_bias_init, c.optimizer.mu_dtype) == (
        "sigmoid_xent", -2.3, "bfloat16"
    )  # fmt: skip
    assert (base.loss, base.model.get("head_bias_init", 0.0)) == ("softmax_xent", 0.0)
    assert configs.resolve("augreg:tiny").endswith("augreg.py:tiny")


@pytest.mark.parametrize(
    "arg", ["b16,imagenet2012", "b16,cifar10,medium2", "b16,imagenet2012,x", "tiny,x"]
)
def test_augreg_bad_arguments_list_the_choices(arg):
    with pytest.raises(ValueError, match="SETTING in none, light1, light2, medium1"):
        configs.get(f"augreg:{arg}")
    with pytest.raises(ValueError, match="REG '0.3' is not 0.0 or 0.1"):
        configs.get("augreg:b16,imagenet2012,medium2,0.3")
