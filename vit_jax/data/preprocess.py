"""Per-example and per-batch preprocessing: pure TF functions of their inputs and seeds.

As in the original ViT fine-tuning code: training takes an Inception-style random crop,
resizes it (bilinear) and flips it at random; evaluation only resizes. Pixels then map
to [-1, 1] as (x - 127.5) / 127.5. Randomness comes from stateless ops, so the same
seed always gives the same crop, flip and mixup weight.
"""

from __future__ import annotations

import numpy as np

from vit_jax.data._tf import tf

# Salts that fold different uses of the run seed apart.
SHUFFLE_SALT, AUGMENT_SALT, MIXUP_SALT = 0, 1, 2


def image_size_hw(image_size: int | tuple[int, int]) -> tuple[int, int]:
    """(height, width) of an int or (h, w) target size."""
    if isinstance(image_size, int):
        return image_size, image_size
    h, w = image_size
    return int(h), int(w)


def key(seed: int, salt: int, *more: int) -> int:
    """A 63-bit key mixing the run seed with a salt (and e.g. a process index).

    Stateless ops take [key, counter] seeds: one independent random stream per counter
    (example position, step, epoch).
    """
    state = np.random.SeedSequence([seed % 2**63, salt, *more]).generate_state(2, np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def seeds(key_: int, counters: tf.Tensor) -> tf.Tensor:
    """Stateless-op seeds [key, counter] for each counter.  int64 [...] -> int64 [..., 2]"""
    counters = tf.cast(counters, tf.int64)
    return tf.stack([tf.fill(tf.shape(counters), tf.constant(key_, tf.int64)), counters], -1)


def permuted_index(offsets: tf.Tensor, seeds_: tf.Tensor, n: int) -> tf.Tensor:
    """Position of each offset in the permutation of range(n) that its seed picks.

    Batched ``tf.random.experimental.index_shuffle`` (whose wrapper only takes one seed):
    int64 [b], seeds int64 [b, 2] -> int64 [b].
    """
    b = tf.shape(offsets)[0]
    pad = tf.fill([b, 1], tf.constant(498247692, tf.int64))  # index_shuffle's own padding
    return tf.raw_ops.RandomIndexShuffle(
        index=offsets,
        seed=tf.concat([pad, seeds_], axis=1),  # [b, 3]
        max_index=tf.fill([b], tf.constant(n - 1, tf.int64)),
        rounds=4,
    )


def to_rgb(image: tf.Tensor) -> tf.Tensor:
    """Grayscale [h, w, 1] -> [h, w, 3]; RGB passes through."""
    if image.shape[-1] == 1:
        return tf.tile(image, [1, 1, 3])
    if image.shape[-1] is None:  # known only at run time
        image = tf.cond(tf.shape(image)[-1] == 1, lambda: tf.tile(image, [1, 1, 3]), lambda: image)
    image.set_shape([*image.shape[:-1], 3])
    return image


def normalize(image: tf.Tensor) -> tf.Tensor:
    """[0, 255] -> float32 [-1, 1]."""
    return (tf.cast(image, tf.float32) - 127.5) / 127.5


def decode(image: tf.Tensor) -> tf.Tensor:
    """Encoded bytes (JPEG, PNG, ...) -> uint8 [h, w, 3]; decoded images pass through."""
    if image.dtype != tf.string:
        return image
    image = tf.io.decode_image(image, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def crop_window(shape: tf.Tensor, seed: tf.Tensor, min_area: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Inception crop of an image of `shape` [h, w, c]: area in [min_area, 1], aspect
    ratio in [3/4, 4/3]. Returns (begin, size) for tf.slice, int32 [3] each."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.cast(shape, tf.int32),
        bounding_boxes=tf.zeros([0, 0, 4], tf.float32),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_area, 1.0),
        use_image_if_no_bounding_boxes=True,
    )
    return begin, size


def random_crop(image: tf.Tensor, seed: tf.Tensor, min_area: float) -> tf.Tensor:
    """Inception crop of a decoded or encoded image.  -> uint8 [h', w', c]

    A JPEG is decoded only inside the crop window (tf.image.decode_and_crop_jpeg, the
    same pixels as decoding and then slicing, about twice as fast at ImageNet sizes).
    """
    if image.dtype != tf.string:
        begin, size = crop_window(tf.shape(image), seed, min_area)
        crop = tf.slice(image, begin, size)
        crop.set_shape([None, None, image.shape[-1]])
        return crop

    def jpeg():
        begin, size = crop_window(tf.image.extract_jpeg_shape(image), seed, min_area)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        return tf.image.decode_and_crop_jpeg(image, window, channels=3)

    crop = tf.cond(tf.io.is_jpeg(image), jpeg, lambda: random_crop(decode(image), seed, min_area))
    crop.set_shape([None, None, 3])
    return crop


def train_image(
    image: tf.Tensor,
    seed: tf.Tensor,
    image_size: tuple[int, int],
    crop_min_area: float,
    flip: bool,
) -> tf.Tensor:
    """Random crop, resize, random flip, [-1, 1].

    uint8 [h, w, c] or encoded bytes -> float32 [H, W, 3].
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = random_crop(image, crop_seed, crop_min_area)
    image = tf.image.resize(image, image_size, method="bilinear")  # float32 [H, W, c]
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return normalize(to_rgb(image))


def _bilinear_weights(start: tf.Tensor, length: tf.Tensor, size: int, out: int) -> tf.Tensor:
    """Rows that resize pixels [start, start + length) of an axis of `size` to `out`.

    tf.image.resize's bilinear rule with half-pixel centres, as a matrix: source
    coordinate (o + 0.5) * length / out - 0.5, neighbours clamped into the crop.
    int32 [b] starts and lengths -> float32 [b, out, size].
    """
    scale = tf.cast(length, tf.float32)[:, None] / out
    src = (tf.range(out, dtype=tf.float32)[None] + 0.5) * scale - 0.5  # [b, out]
    floor = tf.floor(src)
    frac = (src - floor)[..., None]  # [b, out, 1]
    floor = tf.cast(floor, tf.int32)
    lo = start[:, None] + tf.maximum(floor, 0)
    hi = start[:, None] + tf.minimum(floor + 1, length[:, None] - 1)
    return tf.one_hot(lo, size) * (1.0 - frac) + tf.one_hot(hi, size) * frac


def train_batch(
    images: tf.Tensor,
    seeds_: tf.Tensor,
    image_size: tuple[int, int],
    crop_min_area: float,
    flip: bool,
) -> tf.Tensor:
    """train_image for a batch of same-size images, computed as batched matmuls.

    The crop windows and flips are those train_image draws from the same seeds; crop +
    bilinear resize + flip become per-example interpolation matrices, which is several
    times faster for small in-memory images (per-example TF ops cost more in overhead
    than in arithmetic). Results match train_image up to float rounding (~1e-6).
    uint8 [b, h, w, c], seeds int64 [b, 2] -> float32 [b, H, W, 3].
    """
    shape = tf.shape(images)[1:]  # [h, w, c]

    def window(seed):  # -> int32 [5]: y0, x0, crop h, crop w, flip
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        begin, size = crop_window(shape, crop_seed, crop_min_area)
        mirror = tf.random.stateless_uniform([], flip_seed, minval=0, maxval=1.0) < 0.5
        mirror = tf.cast(mirror if flip else False, tf.int32)
        return tf.stack([begin[0], begin[1], size[0], size[1], mirror])

    boxes = tf.map_fn(window, seeds_, fn_output_signature=tf.int32, parallel_iterations=64)
    wy = _bilinear_weights(boxes[:, 0], boxes[:, 2], images.shape[1], image_size[0])
    wx = _bilinear_weights(boxes[:, 1], boxes[:, 3], images.shape[2], image_size[1])
    wx = tf.where(boxes[:, 4, None, None] == 1, tf.reverse(wx, [1]), wx)  # flip = reversed rows
    x = tf.einsum("byh,bhwc,bxw->byxc", wy, tf.cast(images, tf.float32), wx)  # [b, H, W, c]
    if images.shape[-1] == 1:
        x = tf.tile(x, [1, 1, 1, 3])
    return normalize(x)


def eval_image(image: tf.Tensor, image_size: tuple[int, int]) -> tf.Tensor:
    """Resize, [-1, 1].  uint8 [h, w, c] or encoded bytes -> float32 [H, W, 3]."""
    image = tf.image.resize(decode(image), image_size, method="bilinear")
    return normalize(to_rgb(image))


def one_hot(label: tf.Tensor, num_classes: int, smoothing: float = 0.0) -> tf.Tensor:
    """float32 [..., K] targets: (1 - s) * onehot + s / K."""
    target = tf.one_hot(label, num_classes, dtype=tf.float32)
    return target * (1.0 - smoothing) + smoothing / num_classes


def mixup(batch: dict[str, tf.Tensor], seed: tf.Tensor, alpha: float) -> dict[str, tf.Tensor]:
    """Mixes each example with its neighbour in the batch, weight ~ Beta(alpha, alpha).

    One weight per batch, as in big_vision: x' = lam * x + (1 - lam) * roll(x, 1).
    """
    g1, g2 = tf.unstack(tf.random.stateless_gamma([2], seed, alpha=alpha))
    lam = g1 / (g1 + g2)
    out = dict(batch)
    for key in ("image", "label"):
        x = batch[key]  # [b, ...]
        out[key] = lam * x + (1.0 - lam) * tf.roll(x, shift=1, axis=0)
    return out
